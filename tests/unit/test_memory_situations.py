"""Recall's situations table, its per-message band and boost, and last-recalled stamps (in memory)."""

from __future__ import annotations

import re

from langgraph.store.memory import InMemoryStore

from graphs.memory.recall import within_band
from graphs.memory.scoped import Memory, ScopedMemory
from graphs.memory.situations import (
    SITUATIONS,
    Boosts,
    fact_categories,
    fact_pattern,
    request_situations,
    situations_for,
)


def memory(key: str, score: float) -> Memory:
    return Memory(key, key, "fact", "", {}, 1.0, True, score=score)


def names(found: list) -> list[str]:
    return [s.name for s in found]


def test_a_recipe_asks_about_food_and_a_long_run_about_injuries() -> None:
    assert "food" in names(request_situations("Give me a recipe for chocolate brownies"))
    assert "food" in names(situations_for("User has coeliac disease and cannot eat gluten"))
    assert "injury" in names(request_situations("Plan my long run for Sunday"))
    assert "injury" in names(situations_for("User had Achilles tendon pain last month"))
    assert "child" in names(request_situations("Gift ideas for my kid"))
    assert "child" in names(situations_for("User's daughter Layla is five and loves horses"))


def test_words_match_whole_not_inside_other_words() -> None:
    # "son" is not in "sonnets", "car" not in "card", "pet" not in "competition".
    assert situations_for("User writes sonnets on a card for the competition") == []


def test_a_question_with_no_situation_boosts_nothing() -> None:
    assert request_situations("What's the capital of Australia?") == []
    assert fact_pattern([]) is None


def test_the_postgres_pattern_uses_postgres_word_boundaries() -> None:
    pattern = fact_pattern(request_situations("walk my dog"))
    assert pattern is not None
    assert pattern.startswith(r"\y(?:")
    assert pattern.endswith(r")\y")
    # Read as Python would read it with \b, it finds the same facts.
    as_python = re.compile(pattern.replace(r"\y", r"\b"), re.IGNORECASE)
    assert as_python.search("User has a beagle named Biscuit")
    assert not as_python.search("User is learning Japanese")


def test_every_situation_has_fact_and_request_words() -> None:
    assert len({s.name for s in SITUATIONS}) == len(SITUATIONS)
    for s in SITUATIONS:
        assert s.fact
        assert s.request
        assert r"\b" not in s.fact  # Postgres would read it as a backspace


def test_the_band_keeps_matches_close_to_the_best_one() -> None:
    found = [memory("b", 0.30), memory("a", 0.50), memory("c", 0.46)]
    assert [m.key for m in within_band(found, 0.9)] == ["a", "c"]
    assert [m.key for m in within_band(found, 0.0)] == ["a", "c", "b"]
    assert within_band([], 0.9) == []


async def put(mine: ScopedMemory, key: str) -> None:
    await mine.put(
        key, content=f"fact {key}", category="fact", source={}, confidence=1, stated=True
    )


async def test_marking_recalled_stamps_existing_memories_only() -> None:
    mine = ScopedMemory(InMemoryStore(), "alice")
    await put(mine, "home_city")
    await put(mine, "alice_dog")
    await mine.delete("alice_dog")

    stamped = await mine.mark_recalled(["home_city", "alice_dog"], at="2026-12-02T10:00:00+00:00")

    assert stamped == 1
    city = await mine.get("home_city")
    assert city is not None
    assert city.last_recalled_at == "2026-12-02T10:00:00+00:00"
    assert await mine.get("alice_dog") is None  # a deleted memory is never written back


async def test_a_memory_never_recalled_says_so() -> None:
    mine = ScopedMemory(InMemoryStore(), "alice")
    await put(mine, "alice_dog")
    dog = await mine.get("alice_dog")
    assert dog is not None
    assert dog.last_recalled_at is None


async def test_in_memory_words_score_the_situation_boost_and_categories_the_smaller_one() -> None:
    def same_vector(texts: list[str]) -> list[list[float]]:
        return [[1.0, 0.0] for _ in texts]  # every cosine is 1: only the boosts differ

    store = InMemoryStore(index={"dims": 2, "embed": same_vector, "fields": ["content"]})
    mine = ScopedMemory(store, "alice")
    for key, content, category in (
        ("gluten", "User cannot eat gluten", "health"),
        ("gout", "User has gout", "health"),
        ("oslo", "User lives in Oslo", "fact"),
    ):
        await mine.put(
            key, content=content, category=category, source={}, confidence=1, stated=True
        )

    _, _, found = await mine.recall_batch(
        "Give me a recipe for soup",
        limit=10,
        threshold=0.0,
        boosts=Boosts(situation=0.25, category=0.15, lexical=0.05),
    )

    # Words win over the category (not added to it); no lexical part without Postgres.
    assert [(m.key, round(m.score or 0.0, 6)) for m in found] == [
        ("gluten", 1.25),
        ("gout", 1.15),
        ("oslo", 1.0),
    ]
    assert fact_categories(request_situations("Give me a recipe for soup")) == [
        "health",
        "religion",
    ]
