"""Limits shared by every worker, on a real Postgres with two workers (two pools): the research
subagent cap and the search rate limit are never exceeded by the two together."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from graphs.core.migrations import migrate
from graphs.core.persistence import Pool, make_pool
from graphs.core.settings import Settings
from graphs.core.slots import PgSlots
from graphs.research.agents import SharedSubagentSlots
from graphs.research.graph import default_tools
from graphs.tools.ratelimit import PgTokenBucket

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
