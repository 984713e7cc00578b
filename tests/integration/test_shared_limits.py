"""Limits shared by every worker, on a real Postgres with two workers (two pools): the research
subagent cap, the search rate limit, the model-call limit per provider key and the per-user
run cap are never exceeded by the two together."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage

from graphs.core.migrations import migrate
from graphs.core.persistence import Pool, make_pool
from graphs.core.ratelimit import PgTokenBucket, limited, model_call_bucket
from graphs.core.runs import RunJournal, TooManyRuns
from graphs.core.settings import Settings
from graphs.core.slots import PgSlots
from graphs.research.agents import SharedSubagentSlots
from graphs.research.graph import default_tools
from tests.conftest import create_database
from tests.integration.test_durable_runs import make_runner
from ui.surface import HeadlessSurface

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def pools(database_url: str) -> AsyncIterator[list[Pool]]:
    found = [make_pool(database_url, max_size=8), make_pool(database_url, max_size=8)]
    for pool in found:
        await pool.open(wait=True)
    await migrate(found[0])
    yield found
    for pool in found:
        await pool.close()


async def test_two_workers_together_run_no_more_subagents_than_the_cap(pools):
    workers = [SharedSubagentSlots(PgSlots(pool, limit=2, lease_s=60)) for pool in pools]
    running, most = 0, 0

    async def subagent(i: int) -> None:
        nonlocal running, most
        async with workers[i % 2].hold(user_id="alice", thread_id=f"thread-{i % 3}"):
            running += 1
            most = max(most, running)
            await asyncio.sleep(0.3)
            running -= 1

    await asyncio.gather(*(subagent(i) for i in range(6)))
    assert most == 2  # per user, across both workers (each alone would allow 2)


async def test_the_cap_is_per_thread_too(pools):
    slots = PgSlots(pools[0], limit=1, lease_s=60)
    async with slots.hold(["research:thread:x"]):
        other = asyncio.create_task(_enter(slots, ["research:thread:x"]))
        free = asyncio.create_task(_enter(slots, ["research:thread:y"]))
        await asyncio.wait_for(free, 5)
        await asyncio.sleep(0.5)
        assert not other.done()  # waits for the thread's slot
    await asyncio.wait_for(other, 5)


async def test_a_dead_workers_slot_frees_itself_when_its_lease_ends(pools):
    async with pools[0].connection() as conn:
        await conn.execute(
            "INSERT INTO cairn_slots (key, holder, expires_at)"
            " VALUES ('research:user:gone', gen_random_uuid(), now() - interval '1 second')"
        )
    await asyncio.wait_for(
        _enter(PgSlots(pools[1], limit=1, lease_s=60), ["research:user:gone"]), 5
    )


async def _enter(slots: PgSlots, keys: list[str]) -> None:
    async with slots.hold(keys):
        pass


async def test_two_workers_share_one_search_rate_limit(pools):
    # A burst of 3, refilled at one token per 1000 s: across both workers, three calls pass.
    buckets = [PgTokenBucket(pool, "search:test", rate=0.001, capacity=3) for pool in pools]
    attempts = [
        asyncio.create_task(asyncio.wait_for(buckets[i % 2].acquire(), 2)) for i in range(8)
    ]
    results = await asyncio.gather(*attempts, return_exceptions=True)
    assert sum(r is None for r in results) == 3
    assert all(r is None or isinstance(r, TimeoutError) for r in results)


async def test_the_app_graphs_research_limits_live_in_postgres(persistence):
    tools = default_tools(persistence.store, Settings(data_dir=Path(tempfile.mkdtemp())))
    assert isinstance(tools.slots, SharedSubagentSlots)
    assert isinstance(tools.limiter, PgTokenBucket)


def _model() -> GenericFakeChatModel:
    return GenericFakeChatModel(messages=iter([AIMessage("ok")] * 100))


async def test_two_workers_share_one_model_call_limit_per_provider_key(pools):
    # A burst of 3 calls, refilled at one per 1000 s: of 8 calls on both workers, 3 are sent.
    settings = Settings(
        openai_api_key="sk-limit-test-0123456789", model_calls_per_second=0.001, model_call_burst=3
    )
    buckets = [model_call_bucket(pool, settings) for pool in pools]
    assert buckets[0] is not None
    assert buckets[0].name == buckets[1].name  # type: ignore[union-attr]
    assert "sk-limit" not in buckets[0].name

    async def call(i: int) -> None:
        with limited(buckets[i % 2]):
            await asyncio.wait_for(_model().ainvoke("hi"), 2)

    results = await asyncio.gather(*(call(i) for i in range(8)), return_exceptions=True)
    assert sum(r is None for r in results) == 3
    assert all(r is None or isinstance(r, TimeoutError) for r in results)
    # Another provider key has its own bucket.
    other = model_call_bucket(pools[0], settings.model_copy(update={"openai_base_url": "http://x"}))
    with limited(other):
        await asyncio.wait_for(_model().ainvoke("hi"), 2)


async def test_without_a_key_or_a_rate_model_calls_are_not_limited(pools):
    assert model_call_bucket(pools[0], Settings()) is None  # the offline stand-in
    assert model_call_bucket(pools[0], Settings(openai_api_key="sk-x-0123456789abcd")) is None


async def test_two_workers_start_no_more_runs_of_one_user_than_the_cap(pools):
    journals = [RunJournal(pool, worker=f"cap-{i}") for i, pool in enumerate(pools)]

    async def start(i: int) -> bool:
        try:
            await journals[i % 2].started(
                thread_id=f"cap-thread-{i}", user_id="carol", agent="assistant", cap=2
            )
        except TooManyRuns:
            return False
        return True

    started = await asyncio.gather(*(start(i) for i in range(8)))
    assert sum(started) == 2
    # Another user is not held up by carol's runs; carol's run of a thread she already runs is
    # the same run (not one more).
    await journals[0].started(thread_id="cap-dave", user_id="dave", agent="assistant", cap=2)
    first = next(i for i, ok in enumerate(started) if ok)
    await journals[1].started(
        thread_id=f"cap-thread-{first}", user_id="carol", agent="assistant", cap=2
    )
    # A dead worker's run stops counting once its heartbeat is stale; a finished one at once.
    async with pools[0].connection() as conn:
        await conn.execute(
            "UPDATE cairn_runs SET heartbeat_at = now() - interval '1 hour' WHERE thread_id = %s",
            (f"cap-thread-{first}",),
        )
    await journals[0].started(thread_id="cap-late", user_id="carol", agent="assistant", cap=2)
    with pytest.raises(TooManyRuns, match="2 runs going at once"):
        await journals[1].started(thread_id="cap-later", user_id="carol", agent="assistant", cap=2)
    await journals[0].finished("cap-late")
    await journals[1].started(thread_id="cap-later", user_id="carol", agent="assistant", cap=2)


async def test_a_turn_over_the_users_run_cap_is_refused_before_it_starts(pg_server_url):
    # Two workers; each model call takes a second, so the first turn is still going.
    database_url = create_database(pg_server_url)  # the fixed embeddings of make_runner
    busy, close_busy = await make_runner(
        database_url, worker="cap-a", slow_s=1.0, agent="assistant"
    )
    other, close_other = await make_runner(database_url, worker="cap-b", agent="assistant")
    busy.max_runs_per_user = other.max_runs_per_user = 1
    try:
        first = asyncio.create_task(_turn(busy, "cap-run-1", HeadlessSurface()))
        await _running(busy, "cap-run-1")
        refused = HeadlessSurface()
        outcome = await _turn(other, "cap-run-2", refused)
        assert outcome.status == "refused"
        assert refused.errors == [
            "Not started: you already have 1 run going at once, the most allowed. "
            "Send this again when one of them has finished."
        ]
        state = await other.graphs["assistant"].aget_state(
            {"configurable": {"thread_id": "cap-run-2"}}
        )
        assert state.values == {}, "nothing of the refused turn ran"
        assert (await first).status == "done"
        assert (await _turn(other, "cap-run-2", HeadlessSurface())).status == "done"
    finally:
        await close_busy()
        await close_other()


async def _turn(runner, thread_id: str, surface: HeadlessSurface):
    return await runner.message(
        surface,
        user_id="erin",
        thread_id=thread_id,
        profile="Assistant",
        text="Remember that I drink green tea.",
        message_id=f"{thread_id}-m1",
        temporary=False,
    )


async def _running(runner, thread_id: str) -> None:
    async with asyncio.timeout(10):
        while thread_id not in runner.journal._running:
            await asyncio.sleep(0.05)
