"""Recall's "when this matters" cues, its per-message band, and last-recalled stamps (in memory)."""

from __future__ import annotations

from langgraph.store.memory import InMemoryStore

from graphs.memory.cues import cue_for, situations_for
from graphs.memory.recall import within_band
from graphs.memory.scoped import Memory, ScopedMemory


def memory(key: str, score: float) -> Memory:
    return Memory(key, key, "fact", "", {}, 1.0, True, score=score)


def test_a_food_constraint_is_cued_for_recipes_and_an_injury_for_exercise() -> None:
    assert "recipes" in cue_for("User has coeliac disease and cannot eat gluten")
    assert "long runs" in cue_for("User had Achilles tendon pain last month")
    assert "gifts" in cue_for("User's son Pablo is eight and loves dinosaurs")


def test_words_match_whole_not_inside_other_words() -> None:
    # "son" is not in "song", "car" not in "card", "pet" not in "competition".
    assert situations_for("User writes songs on a card for the competition") == []


def test_a_fact_no_rule_matches_is_its_own_cue() -> None:
    fact = "User designs in Figma"
    assert cue_for(fact) == fact


async def test_the_stored_value_carries_the_cue() -> None:
    store = InMemoryStore()
    mine = ScopedMemory(store, "alice")
    await mine.put(
        "alice_lactose",
        content="User is lactose intolerant",
        category="health",
        source={},
        confidence=1.0,
        stated=True,
    )
    item = await store.aget(("memories", "alice", "facts"), "alice_lactose")
    assert item is not None
    assert "restaurants" in item.value["cue"]


def test_the_band_keeps_matches_close_to_the_best_one() -> None:
    found = [memory("b", 0.30), memory("a", 0.50), memory("c", 0.46)]
    assert [m.key for m in within_band(found, 0.9)] == ["a", "c"]
    assert [m.key for m in within_band(found, 0.0)] == ["a", "c", "b"]
    assert within_band([], 0.9) == []


async def test_marking_recalled_stamps_existing_memories_only() -> None:
    store = InMemoryStore()
    mine = ScopedMemory(store, "alice")
    for key in ("home_city", "alice_dog"):
        await mine.put(
            key, content=f"fact {key}", category="fact", source={}, confidence=1, stated=True
        )
    await mine.delete("alice_dog")

    stamped = await mine.mark_recalled(["home_city", "alice_dog"], at="2026-12-02T10:00:00+00:00")

    assert stamped == 1
    city = await mine.get("home_city")
    assert city is not None
    assert city.last_recalled_at == "2026-12-02T10:00:00+00:00"
    assert await mine.get("alice_dog") is None  # a deleted memory is never written back
