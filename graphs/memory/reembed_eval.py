"""The recall eval (evals/) run on a re-embedding's new index, beside the current model's figures.

It runs in a scratch database, never in the app's: the labelled set is seeded under the current
model, re-embedded by the same backfill the command runs, and read from the new index as a
switched worker reads it. Needs a checkout (evals/ is not part of the installed package).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphs.core.persistence import make_pool, open_persistence
from graphs.memory.reembed import _record, _set_next, backfill, begin

if TYPE_CHECKING:
    from graphs.core.embeddings import EmbeddingSpec
    from graphs.core.settings import Settings


async def compare(
    settings: Settings,
    current: EmbeddingSpec,
    target: EmbeddingSpec,
    *,
    database: str | None = None,
    dataset: Path | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Retrieval figures at recall's defaults: (current model, new index)."""
    from evals.memory import RETRIEVAL_DATA, Memoised, eval_database
    from evals.retrieval import evaluate_retrieval, load_retrieval_set
    from graphs.core.embeddings import EmbeddingSpec

    labelled = load_retrieval_set(dataset or RETRIEVAL_DATA)
    old = EmbeddingSpec(current.name, current.dims, Memoised(current.embeddings))
    new = EmbeddingSpec(target.name, target.dims, Memoised(target.embeddings))
    async with eval_database(database, settings) as url:
        before = await open_persistence(
            settings, pool=make_pool(url, max_size=4), embedding=old, other_embedding=lambda *_: new
        )
        try:
            current_score = await evaluate_retrieval(before.store, labelled)
            await begin(before.pool, old, new)
            await backfill(before.pool, new)
            # Scratch data: ready without a gate, to be read as a switched worker reads it.
            following = dict((await _record(before.pool) or {})["next"])
            async with before.pool.connection() as conn:
                await _set_next(conn, {**following, "ready": True})
        finally:
            await before.close()
        after = await open_persistence(
            settings, pool=make_pool(url, max_size=4), embedding=new, other_embedding=lambda *_: old
        )
        try:
            new_score = await evaluate_retrieval(after.store, labelled)
        finally:
            await after.close()
    return current_score.defaults.as_dict(), new_score.defaults.as_dict()
