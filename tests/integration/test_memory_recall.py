"""Recall on real Postgres: situations find indirect requests; last-recalled stamps respect forgetting."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.messages.tool import tool_call

from graphs.assistant.graph import build_graph
from graphs.assistant.offline import offline_assistant
from graphs.core import fence
from graphs.core.context import Context
from graphs.core.persistence import Persistence
from graphs.memory.manage import edit_memory
from graphs.memory.recall import recall, stamps_settled
from graphs.memory.scoped import ScopedMemory
from graphs.memory.situations import Boosts, situations_for
from graphs.memory.writer import write_memories
from tests.fakes import ScriptedChatModel

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


STAMPED = "2026-11-30T08:00:00+00:00"


async def say(
    persistence: Persistence, user: str, text: str, model: BaseChatModel | None = None
) -> str:
    """One turn in a new thread; returns the thread."""
    thread = f"thread-{uuid.uuid4()}"
    graph = build_graph(
        checkpointer=persistence.checkpointer,
        store=persistence.store,
        model=model or offline_assistant(),
    )
    await graph.ainvoke(
        {"messages": [HumanMessage(text)]},
        {"configurable": {"thread_id": thread}},
        context=Context(user_id=user, thread_id=thread),
    )
    await stamps_settled()
    return thread


async def edited(persistence: Persistence, mine: ScopedMemory) -> None:
    await edit_memory(mine, "home_city", "User lives in Bengaluru")


async def updated_by_a_job(persistence: Persistence, mine: ScopedMemory) -> None:
    thread = await say(persistence, mine.user_id, "I moved from Pune to Bengaluru")
    graph = build_graph(
        checkpointer=persistence.checkpointer,
        store=persistence.store,
        model=offline_assistant(),
    )

    async def load_messages(thread_id: str) -> list[BaseMessage]:
        state = await graph.aget_state({"configurable": {"thread_id": thread_id}})
        return list(state.values["messages"])

    report = await write_memories(
        store=persistence.store,
        model=offline_assistant(),
        load_messages=load_messages,
        user_id=mine.user_id,
        thread_id=thread,
        run_id="t",
    )
    assert report.written == ["home_city"]


async def remembered(persistence: Persistence, mine: ScopedMemory) -> None:
    # The inferred fact, restated and asked for: written again, as stated, under its key.
    call = tool_call(
        name="remember", args={"fact": "User lives in Pune", "category": "profile"}, id="c1"
    )
    model = ScriptedChatModel([AIMessage("", tool_calls=[call]), "Noted."])
    await say(persistence, mine.user_id, "Please remember that I live in Pune", model)


@pytest.mark.parametrize("update", [edited, updated_by_a_job, remembered])
async def test_an_update_of_a_memory_keeps_when_it_was_last_used(
    persistence: Persistence,
    update: Callable[[Persistence, ScopedMemory], Awaitable[None]],
) -> None:
    mine = ScopedMemory(persistence.store, f"user-{uuid.uuid4()}")
    await mine.put(
        "home_city",
        content="User lives in Pune",
        category="profile",
        source={},
        confidence=0.6,
        stated=False,
    )
    assert await mine.mark_recalled(["home_city"], at=STAMPED) == 1
    before = await mine.get("home_city")
    assert before is not None

    await update(persistence, mine)

    now = await mine.get("home_city")
    assert now is not None
    assert (now.stated, now.updated_at > before.updated_at) == (True, True)  # rewritten
    assert now.last_recalled_at is not None
    # Recalled again by the turn that asked for the update, or not: never wiped.
    assert now.last_recalled_at >= STAMPED


async def _waiting_on_a_lock(persistence: Persistence) -> bool:
    async with persistence.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        row = await cur.fetchone()
    return row is not None and row["n"] > 0


@pytest.mark.parametrize("fenced", [False, True], ids=["job", "session"])
async def test_a_recall_stamping_a_memory_while_it_is_updated_is_not_lost(
    persistence: Persistence, fenced: bool
) -> None:
    user = f"user-{uuid.uuid4()}"
    mine = ScopedMemory(persistence.store, user)
    await put(mine, "dog", "User has a beagle")
    assert await mine.mark_recalled(["dog"], at=STAMPED) == 1
    recalled = "2026-12-03T09:00:00.000001+00:00"

    async def update() -> None:
        with fence.acting_for(fence.Fence.now(user)) if fenced else contextlib.nullcontext():
            await put(mine, "dog", "User has a beagle named Biscuit")

    async with persistence.pool.connection() as conn, conn.transaction():
        # A recall's stamp, written and not yet committed: the update waits for its row lock.
        stamped = await conn.execute(
            "UPDATE store SET value = jsonb_set(value, '{last_recalled_at}', to_jsonb(%s::text))"
            " WHERE prefix = %s AND key = 'dog'",
            (recalled, f"memories.{mine.label}.facts"),
        )
        assert stamped.rowcount == 1
        updating = asyncio.create_task(update())
        for _ in range(200):
            if updating.done() or await _waiting_on_a_lock(persistence):
                break
            await asyncio.sleep(0.05)
    await updating

    now = await mine.get("dog")
    assert now is not None
    assert now.content == "User has a beagle named Biscuit"
    assert now.last_recalled_at == recalled


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
