"""Recall on real Postgres: situations find indirect requests; last-recalled stamps respect forgetting."""

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
from graphs.memory.situations import Boosts, situations_for

pytestmark = pytest.mark.integration


async def put(memory: ScopedMemory, key: str, content: str) -> None:
    await memory.put(key, content=content, category="fact", source={}, confidence=1, stated=True)


async def test_a_recipe_request_recalls_a_food_intolerance(persistence: Persistence) -> None:
    mine = ScopedMemory(persistence.store, f"user-{uuid.uuid4()}")
    await put(mine, "gluten", "User has coeliac disease and cannot eat gluten")
    await put(mine, "piano", "User is learning piano")

    found = await recall(mine, "Give me a recipe for chocolate brownies")
    without_boost = await recall(mine, "Give me a recipe for chocolate brownies", boosts=Boosts())
    nothing = await recall(mine, "Explain how a rainbow forms")

    assert [m.key for m in found.relevant] == ["gluten"]
    # Why the boost exists: by cosine alone the fact is below any usable threshold.
    assert without_boost.relevant == []
    assert nothing.relevant == []


async def test_a_long_run_recalls_the_injury(persistence: Persistence) -> None:
    mine = ScopedMemory(persistence.store, f"user-{uuid.uuid4()}")
    await put(mine, "achilles", "User had Achilles tendon pain last month")
    await put(mine, "python", "User works as a data analyst using Python and SQL")
    await put(mine, "tea", "User drinks mint tea and avoids caffeine after 3 pm")

    found = await recall(mine, "Plan my long run for Sunday")

    assert [m.key for m in found.relevant] == ["achilles"]


async def test_a_turn_stamps_what_it_recalled_without_touching_the_fact(
    persistence: Persistence,
) -> None:
    user, thread = f"user-{uuid.uuid4()}", f"thread-{uuid.uuid4()}"
    mine = ScopedMemory(persistence.store, user)
    await put(mine, "home_city", "User lives in Pune")
    await put(mine, "lactose", "User is lactose intolerant")
    await put(mine, "guitar", "User plays acoustic guitar")
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
    assert after["guitar"].last_recalled_at is None  # not recalled, not stamped
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
    assert row is not None
    assert row["n"] == 0


async def test_a_health_fact_in_words_nobody_listed_is_recalled_by_its_category(
    persistence: Persistence,
) -> None:
    user = f"user-{uuid.uuid4()}"
    mine = ScopedMemory(persistence.store, user)
    fact = "User has gout and limits red meat"
    assert situations_for(fact) == []  # no situation's words name it
    await mine.put("gout", content=fact, category="health", source={}, confidence=1, stated=True)
    await put(mine, "piano", "User is learning piano")
    found = await recall(mine, "What should I cook for dinner tonight?")

    # The same words under a category that does not bear on food: cosine alone (0.19) is short.
    other = ScopedMemory(persistence.store, f"user-{uuid.uuid4()}")
    await put(other, "gout", fact)
    await put(other, "piano", "User is learning piano")
    not_found = await recall(other, "What should I cook for dinner tonight?")

    assert [m.key for m in found.relevant] == ["gout"]
    assert not_found.relevant == []
