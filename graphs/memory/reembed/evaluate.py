"""The recall eval (graphs.memory.evaluation) with the current model and on a re-embedding's new index."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graphs.core.embeddings import EmbeddingSpec
from graphs.core.persistence import make_pool, open_persistence
from graphs.memory.evaluation.retrieval import (
    LABELLED_SET,
    load_retrieval_set,
    score_at_defaults,
    seed,
)
from graphs.memory.evaluation.scratch import Memoised, eval_database
from graphs.memory.reembed.backfill import backfill
from graphs.memory.reembed.state import begin, read_record, set_next

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

    from graphs.core.settings import Settings


async def compare(
    settings: Settings,
    current: EmbeddingSpec,
    target: EmbeddingSpec,
    *,
    database: str | None = None,
    dataset: Traversable = LABELLED_SET,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The recall eval with the current model and on the new index: figures at recall's
    defaults (current, new).

    In a scratch database, never the app's: the labelled set is seeded under the current
    model, re-embedded by the backfill, and read from the new index as a switched worker
    reads it.
    """
    labelled = load_retrieval_set(dataset)
    old = EmbeddingSpec(current.name, current.dims, Memoised(current.embeddings))
    new = EmbeddingSpec(target.name, target.dims, Memoised(target.embeddings))
    async with eval_database(database, settings) as url:
        before = await open_persistence(
            settings, pool=make_pool(url, max_size=4), embedding=old, other_embedding=lambda *_: new
        )
        try:
            await seed(before.store, labelled)
            current_score = await score_at_defaults(before.store, labelled)
            await begin(before.pool, old, new)
            await backfill(before.pool, new)
            # Scratch data: ready without a gate, to be read as a switched worker reads it.
            following = dict((await read_record(before.pool) or {})["next"])
            async with before.pool.connection() as conn:
                await set_next(conn, {**following, "ready": True})
        finally:
            await before.close()
        after = await open_persistence(
            settings, pool=make_pool(url, max_size=4), embedding=new, other_embedding=lambda *_: old
        )
        try:
            # Only the backfill's vectors: the set is not seeded again under the new model.
            new_score = await score_at_defaults(after.store, labelled)
        finally:
            await after.close()
    return current_score.as_dict(), new_score.as_dict()
