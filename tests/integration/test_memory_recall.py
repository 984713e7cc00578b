"""Recall on real Postgres: cues find indirect requests, and last-recalled stamps respect forgetting."""

from __future__ import annotations

import uuid

import pytest
from langchain_core.messages import HumanMessage

from graphs.assistant.graph import build_graph
from graphs.assistant.offline import offline_assistant
from graphs.core.context import Context
from graphs.core.persistence import Persistence
from graphs.memory.recall import recall, stamps_settled
from graphs.memory.scoped import ScopedMemory

pytestmark = pytest.mark.integration


async def put(memory: ScopedMemory, key: str, content: str) -> None:
    await memory.put(key, content=content, category="fact", source={}, confidence=1, stated=True)


async def test_a_recipe_request_recalls_a_food_intolerance(persistence: Persistence) -> None:
    mine = ScopedMemory(persistence.store, f"user-{uuid.uuid4()}")
    await put(mine, "gluten", "User has coeliac disease and cannot eat gluten")
    await put(mine, "piano", "User is learning piano")

    found = await recall(mine, "Give me a recipe for chocolate brownies")
    nothing = await recall(mine, "Explain how a rainbow forms")

    assert [m.key for m in found.relevant] == ["gluten"]
    assert nothing.relevant == []


async def test_a_recipe_request_missed_the_fact_by_its_own_vector_alone(
    persistence: Persistence,
) -> None:
    """Why cues exist: without the cue vector the fact scores below any usable threshold."""
    mine = ScopedMemory(persistence.store, f"user-{uuid.uuid4()}")
    await put(mine, "gluten", "User has coeliac disease and cannot eat gluten")
    vector = await persistence.embedding.embeddings.aembed_query(
        "Give me a recipe for chocolate brownies"
    )
    async with persistence.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT field_name, 1 - (embedding <=> %s::vector) AS score FROM store_vectors"
            " WHERE prefix = %s AND key = 'gluten'",
            (str(vector), f"memories.{mine.label}.facts"),
        )
        scores = {r["field_name"]: r["score"] for r in await cur.fetchall()}
    assert scores["content"] < 0.2 < 0.3 < scores["cue"]


async def test_a_turn_stamps_what_it_recalled_without_touching_the_fact(
    persistence: Persistence,
) -> None:
    user, thread = f"user-{uuid.uuid4()}", f"thread-{uuid.uuid4()}"
    mine = ScopedMemory(persistence.store, user)
    await put(mine, "home_city", "User lives in Pune")
    await put(mine, "lactose", "User is lactose intolerant")
    before = {m.key: m for m in await mine.all_memories()}
    graph = build_graph(
        checkpointer=persistence.checkpointer, store=persistence.store, model=offline_assistant()
    )

    await graph.ainvoke(
        {"messages": [HumanMessage("Find me a quick breakfast recipe")]},
        {"configurable": {"thread_id": thread}},
        context=Context(user_id=user, thread_id=thread),
    )
    await stamps_settled()

    after = {m.key: m for m in await mine.all_memories()}
    assert after["home_city"].last_recalled_at  # pinned facts are recalled every turn
    assert after["lactose"].last_recalled_at
    for key, m in after.items():
        assert (m.content, m.updated_at) == (before[key].content, before[key].updated_at)


async def test_a_stamp_after_a_forget_does_not_bring_the_memory_back(
    persistence: Persistence,
) -> None:
    mine = ScopedMemory(persistence.store, f"user-{uuid.uuid4()}")
    await put(mine, "dog", "User has a beagle named Biscuit")
    forgotten = await mine.get("dog")
    assert forgotten is not None
    await mine.forget(forgotten, reason="user asked")

    stamped = await mine.mark_recalled(["dog"])

    assert stamped == 0
    assert await mine.get("dog") is None
    async with persistence.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM store WHERE prefix = %s AND key = 'dog'",
            (f"memories.{mine.label}.facts",),
        )
        row = await cur.fetchone()
    assert row is not None and row["n"] == 0
