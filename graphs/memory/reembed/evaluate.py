"""The recall eval (evals/) with the current model and on a re-embedding's new index."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graphs.core.persistence import make_pool, open_persistence
from graphs.memory.reembed.backfill import backfill
from graphs.memory.reembed.state import begin, read_record, set_next

if TYPE_CHECKING:
    from pathlib import Path

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
    """The recall eval with the current model and on the new index: figures at recall's
    defaults (current, new).

    In a scratch database, never the app's: the labelled set is seeded under the current
    model, re-embedded by the backfill, and read from the new index as a switched worker
    reads it.
    """
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
            following = dict((await read_record(before.pool) or {})["next"])
            async with before.pool.connection() as conn:
                await set_next(conn, {**following, "ready": True})
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
