"""Retrieval eval: the labelled splits through the app's recall path, swept, and as recall was before."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.postgres import _ainternal

from graphs.core.store import PipelinedStore
from graphs.memory.evaluation.retrieval import (
    Outcome,
    RetrievalSet,
    Score,
    run_queries,
    score,
    seed,
    user_id,
)
from graphs.memory.recall import (
    DEFAULT_LIMIT,
    DEFAULT_RELATIVE,
    DEFAULT_THRESHOLD,
    is_trivial,
)
from graphs.memory.scoped import FACTS, ROOT, ScopedMemory, user_label

if TYPE_CHECKING:
    from langgraph.store.base import BaseStore

SWEEP_THRESHOLDS = (0.2, 0.22, 0.25, 0.3, 0.35, 0.4, 0.5)
SWEEP_LIMITS = (3, 5, 8)
BEFORE_LIMIT, BEFORE_THRESHOLD = 3, 0.25
"""Recall before issue 15: the fact's own vector only, top 3 above cosine 0.25, no band."""
_BEFORE_SEARCH = (
    "SELECT v.key, 1 - (v.embedding <=> %s::vector) AS score FROM store_vectors v"
    " WHERE v.prefix = %s AND v.field_name = 'content' ORDER BY score DESC, v.key LIMIT %s"
)


@dataclass(frozen=True)
class RetrievalResult:
    split: str
    """"tuning" and "held-out v1" (defaults chosen on them) or "held-out v2" (never tuned on)."""
    held_out: bool
    """Never tuned on: no sweep, and its misses are counted but neither printed nor saved, so
    that reading the report does not turn it into a tuning set."""
    users: int
    memories: int
    searchable: int
    queries: int
    empty_queries: int
    defaults: Score
    before: Score
    """The same queries through recall as it was before issue 15 (BEFORE_*)."""
    sweep: list[Score]
    misses: list[Outcome]
    """Queries at the defaults whose result differs from the label."""

    @property
    def best(self) -> Score:
        """Highest F1; ties go to the smaller limit, then the higher threshold (less prompt)."""
        return max(
            self.sweep or [self.defaults], key=lambda s: (round(s.f1, 4), -s.limit, s.threshold)
        )

    @property
    def ties(self) -> list[Score]:
        """Every sweep point with the best F1."""
        return [s for s in self.sweep if round(s.f1, 4) == round(self.best.f1, 4)]


async def run_before(store: BaseStore, dataset: RetrievalSet) -> list[Outcome]:
    """Each query as recall ranked it before issue 15: cosine to the fact, top 3 above 0.25."""
    if not isinstance(store, PipelinedStore) or store.embeddings is None:
        msg = "the before-figures need the Postgres store"
        raise TypeError(msg)
    outcomes = []
    for q in dataset.queries:
        got: tuple[tuple[str, float], ...] = ()
        if not is_trivial(q.query):
            vector = await store.embeddings.aembed_query(q.query)
            prefix = ".".join((ROOT, user_label(user_id(q.user)), FACTS))
            async with _ainternal.get_connection(store.conn) as conn:
                # The index the store reads (another model's table during a re-embedding).
                search = _BEFORE_SEARCH.replace("store_vectors", store.vectors_table)
                cur = await conn.execute(search, (str(vector), prefix, BEFORE_LIMIT))
                rows = await cur.fetchall()
            got = tuple(
                (r["key"], round(r["score"], 3)) for r in rows if r["score"] >= BEFORE_THRESHOLD
            )
        outcomes.append(Outcome(query=q, got=got))
    return outcomes


async def evaluate_retrieval(
    store: BaseStore, dataset: RetrievalSet, *, split: str = "tuning", sweep: bool = True
) -> RetrievalResult:
    """Seed, then run every query at the defaults, as before, and at each point of the sweep.

    A held-out split (sweep=False) is run at the defaults only: its figures are to be read, not
    tuned on, and its misses are kept out of the report."""
    await seed(store, dataset)
    at_defaults = await run_queries(
        store, dataset, limit=DEFAULT_LIMIT, threshold=DEFAULT_THRESHOLD
    )
    before = score(await run_before(store, dataset), limit=BEFORE_LIMIT, threshold=BEFORE_THRESHOLD)
    points = [
        score(await run_queries(store, dataset, limit=limit, threshold=t), limit=limit, threshold=t)
        for limit in SWEEP_LIMITS
        for t in SWEEP_THRESHOLDS
        if sweep
    ]
    return RetrievalResult(
        split=split,
        held_out=not sweep,
        before=before,
        users=len({m.user for m in dataset.memories}),
        memories=len(dataset.memories),
        searchable=sum(ScopedMemory.kind_for(m.key) == FACTS for m in dataset.memories),
        queries=len(dataset.queries),
        empty_queries=sum(not q.expected for q in dataset.queries),
        defaults=score(at_defaults, limit=DEFAULT_LIMIT, threshold=DEFAULT_THRESHOLD),
        sweep=points,
        misses=[o for o in at_defaults if {k for k, _ in o.got} != o.query.expected],
    )


def retrieval_json(result: RetrievalResult) -> dict[str, Any]:
    return {
        "split": result.split,
        "relative": DEFAULT_RELATIVE,
        "before": result.before.as_dict(),
        "users": result.users,
        "memories": result.memories,
        "searchable_memories": result.searchable,
        "queries": result.queries,
        "empty_queries": result.empty_queries,
        "defaults": result.defaults.as_dict(),
        "best": result.best.as_dict(),
        "best_f1_ties": [{"limit": s.limit, "threshold": s.threshold} for s in result.ties],
        "sweep": [s.as_dict() for s in result.sweep],
        "misses_at_defaults_count": len(result.misses),
        "misses_at_defaults": []
        if result.held_out
        else [
            {
                "user": o.query.user,
                "query": o.query.query,
                "expected": sorted(o.query.expected),
                "got": [{"key": k, "score": s} for k, s in o.got],
            }
            for o in result.misses
        ],
    }
