"""Re-embed the store with another embedding model, losing nothing: `python -m graphs.memory.reembed`.

Vectors from different models cannot be compared, so the new model gets its own index: a
vectors table keyed by the model (`store_vectors_<hash>`, the same shape as langgraph's
`store_vectors`, its rows deleted with their item by the same foreign key). Then:

1. `begin` records the new model beside the current one in `cairn_meta`; workers started from
   then on write every indexed put to both indexes (graphs.core.store's mirror).
2. `backfill` re-embeds every item of the current index under the same keys, in batches in
   key order, each batch committed together with its progress row (`cairn_reembed`), so a
   stop or a kill loses at most one batch and running it again resumes. A catch-up pass then
   redoes any item written since its vector was made (a worker not yet restarted).
   Forgetting wins: an item's new vector is written only if the item still exists unchanged
   (a delete or a forget landing mid-batch leaves nothing, and one landing later cascades),
   and facts matching the user's forget records are never carried over.
3. `compare` runs the recall eval (graphs.memory.evaluation: the labelled set shipped in the
   package, the tuning split of `make eval`) with the current model and on the new index; the
   new index is marked ready only if it scores at least as well (precision and recall at
   recall's defaults) and holds a current vector of every live item of the current index.
4. Reads switch by the setting: a worker configured with the new model reads the new index
   (writing the old one too, so switching back is a restart) once it is ready, and refuses to
   start before.
5. `retire` drops the old index: the new table becomes `store_vectors` and the new model the
   recorded one, so start-up is then exactly that of a fresh install with the new model.
"""

from graphs.memory.reembed.backfill import BATCH_SIZE, backfill
from graphs.memory.reembed.evaluate import compare
from graphs.memory.reembed.state import (
    Progress,
    ReembedError,
    abandon,
    begin,
    progress,
    record_eval,
    retire,
    verdict,
)

__all__ = [
    "BATCH_SIZE",
    "Progress",
    "ReembedError",
    "abandon",
    "backfill",
    "begin",
    "compare",
    "progress",
    "record_eval",
    "retire",
    "verdict",
]
