"""Retrieval eval: labelled queries against seeded memories, scored through the app's recall path."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from langgraph.checkpoint.postgres import _ainternal
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from graphs.core.store import PipelinedStore
from graphs.memory.policy import Category
from graphs.memory.recall import (
    DEFAULT_LIMIT,
    DEFAULT_RELATIVE,
    DEFAULT_THRESHOLD,
    is_trivial,
    recall,
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


class SeedMemory(BaseModel):
    """One stored memory of a synthetic user."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["memory"]
    user: str
    key: str
    content: str
    category: Category


class LabelledQuery(BaseModel):
    """A message as a user would send it, and the searchable memories that should come back."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["query"]
    user: str
    query: str
    expected: frozenset[str]


Record: TypeAdapter[SeedMemory | LabelledQuery] = TypeAdapter(
    Annotated[SeedMemory | LabelledQuery, Field(discriminator="kind")]
)


@dataclass(frozen=True)
class RetrievalSet:
    memories: list[SeedMemory]
    queries: list[LabelledQuery]


def load_retrieval_set(path: Path) -> RetrievalSet:
    """Read the JSONL file; every expected key must be one of that user's searchable facts."""
    records = [Record.validate_python(json.loads(line)) for line in _lines(path)]
    memories = [r for r in records if isinstance(r, SeedMemory)]
    queries = [r for r in records if isinstance(r, LabelledQuery)]
    searchable = {(m.user, m.key) for m in memories if ScopedMemory.kind_for(m.key) == FACTS}
    for q in queries:
        unknown = sorted(k for k in q.expected if (q.user, k) not in searchable)
        if unknown:
            msg = f"{path.name}: query {q.query!r} expects {unknown}, not searchable facts of {q.user}"
            raise ValueError(msg)
    return RetrievalSet(memories=memories, queries=queries)


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def user_id(name: str) -> str:
    return f"eval-retrieval-{name}"


@dataclass(frozen=True)
class Outcome:
    """What recall returned for one query (its `relevant` part; pinned facts are not scored)."""

    query: LabelledQuery
    got: tuple[tuple[str, float], ...]

    @property
    def hits(self) -> int:
        return sum(key in self.query.expected for key, _ in self.got)


@dataclass(frozen=True)
class Score:
    """Micro-averaged over all queries: every retrieved and every expected memory counts once."""

    limit: int
    threshold: float
    hits: int
    retrieved: int
    expected: int
    noisy_empty_queries: int
    """Queries with nothing relevant to recall that still got something."""

    @property
    def precision(self) -> float:
        return self.hits / self.retrieved if self.retrieved else 1.0

    @property
    def recall(self) -> float:
        return self.hits / self.expected if self.expected else 1.0

    @property
    def f1(self) -> float:
        total = self.precision + self.recall
        return 2 * self.precision * self.recall / total if total else 0.0

    def as_dict(self) -> dict[str, Any]:
        figures = {"precision": self.precision, "recall": self.recall, "f1": self.f1}
        return {**asdict(self), **{k: round(v, 4) for k, v in figures.items()}}


def score(outcomes: list[Outcome], *, limit: int, threshold: float) -> Score:
    return Score(
        limit=limit,
        threshold=threshold,
        hits=sum(o.hits for o in outcomes),
        retrieved=sum(len(o.got) for o in outcomes),
        expected=sum(len(o.query.expected) for o in outcomes),
        noisy_empty_queries=sum(1 for o in outcomes if not o.query.expected and o.got),
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


async def seed(store: BaseStore, dataset: RetrievalSet) -> None:
    for m in dataset.memories:
        await ScopedMemory(store, user_id(m.user)).put(
            m.key,
            content=m.content,
            category=m.category,
            source={"eval": "retrieval"},
            confidence=1.0,
            stated=True,
        )


async def run_queries(
    store: BaseStore, dataset: RetrievalSet, *, limit: int, threshold: float
) -> list[Outcome]:
    outcomes = []
    for q in dataset.queries:
        found = await recall(
            ScopedMemory(store, user_id(q.user)), q.query, limit=limit, threshold=threshold
        )
        got = tuple((m.key, round(m.score or 0.0, 3)) for m in found.relevant)
        outcomes.append(Outcome(query=q, got=got))
    return outcomes


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
