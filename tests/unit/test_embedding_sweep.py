"""evals.embedding_sweep applies limit, threshold and band offline exactly as recall does."""

from __future__ import annotations

import random

from evals.embedding_sweep import Run, apply, figures
from graphs.memory.evaluation.retrieval import LabelledQuery
from graphs.memory.recall import within_band
from graphs.memory.scoped import Memory


def _memory(key: str, score: float) -> Memory:
    return Memory(
        key=key,
        content=key,
        category="other",
        updated_at="",
        source={},
        confidence=1.0,
        stated=True,
        score=score,
    )


def _as_recall_would(got: list[tuple[str, float]], limit: int, threshold: float, rel: float):
    """The store's top `limit` (best first), recall_batch's threshold, then recall's band."""
    page = [_memory(k, s) for k, s in got[:limit] if s >= threshold]
    return [m.key for m in within_band(page, rel)]


def test_apply_matches_recall_on_random_pages() -> None:
    rng = random.Random(15)
    for _ in range(2000):
        scores = sorted((rng.uniform(-0.1, 1.2) for _ in range(rng.randint(0, 8))), reverse=True)
        got = [(f"k{i}", s) for i, s in enumerate(scores)]
        limit, threshold = rng.choice((1, 3, 5, 8)), rng.uniform(0.0, 1.0)
        rel = rng.uniform(0.5, 1.0)
        assert apply(tuple(got), limit, threshold, rel) == _as_recall_would(
            got, limit, threshold, rel
        )


def test_limit_is_applied_before_threshold_and_band() -> None:
    got = (("a", 0.9), ("b", 0.8), ("c", 0.79), ("d", 0.2))
    assert apply(got, 2, 0.5, 0.8) == ["a", "b"]
    assert apply(got, 8, 0.5, 0.8) == ["a", "b", "c"]
    assert apply(got, 8, 0.5, 0.9) == ["a"]
    assert apply(got, 8, 0.95, 0.0) == []


def test_figures_are_micro_averaged_and_count_noise() -> None:
    def query(text: str, *expected: str) -> LabelledQuery:
        return LabelledQuery(kind="query", user="u", query=text, expected=frozenset(expected))

    runs = [
        Run(query("recipe", "allergy", "diet"), "tuning", (("allergy", 0.6), ("pet", 0.55))),
        Run(query("2+2"), "tuning", (("pet", 0.5),)),
        Run(query("weather"), "tuning", (("pet", 0.1),)),
    ]
    # 1 hit of 3 retrieved, of 2 expected; "2+2" got something, "weather" nothing above 0.3.
    assert figures(runs, 3, 0.3, 0.5) == {"precision": 0.333, "recall": 0.5, "noise": 1}
    assert figures(runs, 3, 0.58, 0.5) == {"precision": 1.0, "recall": 0.5, "noise": 0}
