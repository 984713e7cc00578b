"""The labelled retrieval set and its scoring through the app's recall path."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from importlib.resources import files
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from graphs.memory.policy import Category
from graphs.memory.recall import DEFAULT_LIMIT, DEFAULT_THRESHOLD, recall
from graphs.memory.scoped import FACTS, ScopedMemory

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

    from langgraph.store.base import BaseStore

LABELLED_SET: Traversable = files("graphs.memory.evaluation") / "data" / "retrieval.jsonl"
"""The tuning split of `make eval`, and the set the re-embedding gate scores both models on.
Package data (pyproject `[tool.setuptools.package-data]`), so an installed Cairn has it."""


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


def load_retrieval_set(path: Traversable = LABELLED_SET) -> RetrievalSet:
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


def _lines(path: Traversable) -> list[str]:
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


async def score_at_defaults(store: BaseStore, dataset: RetrievalSet) -> Score:
    """The set's queries through recall at its defaults, on a store it is seeded in (or was)."""
    outcomes = await run_queries(store, dataset, limit=DEFAULT_LIMIT, threshold=DEFAULT_THRESHOLD)
    return score(outcomes, limit=DEFAULT_LIMIT, threshold=DEFAULT_THRESHOLD)
