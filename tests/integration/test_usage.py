"""Usage and budgets on a real Postgres: every run's tokens recorded, and a monthly budget raced by
two workers (two pools) is never over-committed; a run it cannot cover is refused before it starts."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from graphs.assistant.graph import build_graph as build_assistant
from graphs.assistant.offline import offline_assistant
from graphs.core.embeddings import LOCAL_MODEL_DIMS, EmbeddingSpec
from graphs.core.migrations import migrate
from graphs.core.persistence import Pool, make_pool, open_persistence
from graphs.core.runlock import ThreadRunLocks
from graphs.core.settings import Settings
from graphs.core.usage import Budget, OverBudget, RunUsage, UsageLedger
from tests.integration.test_durable_runs import FixedEmbeddings
from ui.agents import assistant as assistant_agent
from ui.memory_page import usage_this_month
from ui.runner import PostgresThreads, Runner
from ui.surface import HeadlessSurface

pytestmark = pytest.mark.integration

PRICES = {"chat": (0.001, 0.002)}
ESTIMATE = 4000


@pytest.fixture(scope="module")
async def pools(database_url: str) -> AsyncIterator[list[Pool]]:
    found = [make_pool(database_url, max_size=6), make_pool(database_url, max_size=6)]
    for pool in found:
        await pool.open(wait=True)
    await migrate(found[0])
    yield found
    for pool in found:
        await pool.close()


def ledger(pool: Pool, *, tokens: int = 0, cost: float = 0.0) -> UsageLedger:
    return UsageLedger(pool, budget=Budget(tokens, cost), prices=PRICES, default_estimate=ESTIMATE)


async def admitted(attempts: list) -> int:
    results = await asyncio.gather(*attempts, return_exceptions=True)
    unexpected = [r for r in results if isinstance(r, Exception) and not isinstance(r, OverBudget)]
    assert not unexpected
    return sum(not isinstance(r, Exception) for r in results)


async def test_a_budget_raced_by_two_workers_admits_only_what_it_covers(pools):
    # Room for two runs' reservations (2 x 4000 <= 10000), not three.
    workers = [ledger(pool, tokens=10_000) for pool in pools]
    attempts = [
        workers[i % 2].admit(user_id="racer", thread_id=f"t{i}", agent="race") for i in range(8)
    ]
    assert await admitted(attempts) == 2
    month = await workers[0].month("racer")
    assert month.reserved_tokens == 2 * ESTIMATE
    assert month.reserved_tokens <= 10_000
    # Another user's budget is their own.
    await workers[1].admit(user_id="someone-else", thread_id="t-else", agent="race")


async def test_a_money_budget_is_checked_the_same_way(pools):
    # The estimate's cost: 4000 tokens at the dearest price, 0.002 per 1k = 0.008.
    workers = [ledger(pool, cost=0.02) for pool in pools]
    attempts = [
        workers[i % 2].admit(user_id="spender", thread_id=f"s{i}", agent="spend") for i in range(6)
    ]
    assert await admitted(attempts) == 2


async def test_settling_replaces_the_reservation_with_what_was_used(pools):
    worker = ledger(pools[0], tokens=10_000)
    admission = await worker.admit(user_id="settler", thread_id="s1", agent="settle")
    used = RunUsage(model_calls=2)
    used.add("chat", PRICES, 7000, 1000)
    await worker.settle(admission, used, status="done", wall_s=0.5)
    month = await worker.month("settler")
    assert (month.tokens, month.reserved_tokens, month.runs) == (8000, 0, 1)
    assert month.cost == pytest.approx(0.009)
    # 8000 used + the next run's expected use (now measured: 8000) > 10000: refused, saying
    # why and when the budget renews.
    with pytest.raises(OverBudget, match=r"8,000 of your 10,000 tokens.*renews on"):
        await worker.admit(user_id="settler", thread_id="s2", agent="settle")


async def test_a_dead_workers_reservation_lapses(pools):
    worker = ledger(pools[0], tokens=6000)
    await worker.admit(user_id="lapsed", thread_id="l1", agent="lapse")
    with pytest.raises(OverBudget):
        await worker.admit(user_id="lapsed", thread_id="l2", agent="lapse")
    async with pools[0].connection() as conn:  # its worker was killed an hour and more ago
        await conn.execute(
            "UPDATE cairn_usage SET created_at = now() - interval '61 minutes'"
            " WHERE user_id = 'lapsed' AND thread_id = 'l1'"
        )
    await worker.admit(user_id="lapsed", thread_id="l2", agent="lapse")


@pytest.fixture
async def assistant_runner(database_url: str) -> AsyncIterator[tuple[Runner, UsageLedger]]:
    embedding = EmbeddingSpec("test:fixed", LOCAL_MODEL_DIMS, FixedEmbeddings())
    persistence = await open_persistence(
        Settings(data_dir=Path(tempfile.mkdtemp())),
        pool=make_pool(database_url, max_size=5),
        embedding=embedding,
    )
    graph = build_assistant(
        checkpointer=persistence.checkpointer,
        store=persistence.store,
        model=offline_assistant(),
    )
    usage = ledger(persistence.pool, tokens=1_000_000)
    locks = ThreadRunLocks(persistence.pool)
    runner = Runner(
        agents=[assistant_agent.SPEC],
        graphs={"assistant": graph},
        threads=PostgresThreads(persistence.pool),
        locks=locks,
        usage=usage,
    )
    yield runner, usage
    await locks.close()
    await persistence.close()


async def send(runner: Runner, thread_id: str, text: str) -> tuple:
    surface = HeadlessSurface()
    outcome = await runner.message(
        surface,
        user_id="metered",
        thread_id=thread_id,
        profile=None,
        text=text,
        message_id=f"{thread_id}-{len(text)}",
        temporary=False,
    )
    return outcome, surface


async def test_every_run_records_its_use_and_one_over_budget_is_refused_before_it_starts(
    assistant_runner,
):
    runner, usage = assistant_runner
    outcome, surface = await send(runner, "metered-1", "What is a good way to plan meals?")
    assert outcome.status == "done"
    assert surface.used is not None
    assert surface.used.model_calls >= 1
    assert surface.used.input_tokens > 0
    assert surface.used.output_tokens > 0
    async with usage.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT status, model_calls, input_tokens, output_tokens, cost, wall_s, nodes"
            " FROM cairn_usage WHERE user_id = 'metered'"
        )
        [row] = await cur.fetchall()
    assert row["status"] == "done"
    assert row["model_calls"] == surface.used.model_calls
    assert row["input_tokens"] + row["output_tokens"] == surface.used.tokens
    assert row["cost"] == pytest.approx(surface.used.cost)
    assert row["wall_s"] > 0
    assert row["nodes"].get("assistant", 0) >= 1

    # The budget now leaves less than a run is expected to use (its measured p95).
    used = (await usage.month("metered")).tokens
    runner.usage = ledger(usage.pool, tokens=used + 1)
    graph = runner.graphs["assistant"]
    before = await graph.aget_state({"configurable": {"thread_id": "metered-1"}})
    refused, surface = await send(runner, "metered-1", "And for a week of lunches?")
    assert refused.status == "refused"
    assert surface.errors
    assert "past this month's usage budget" in surface.errors[0]
    after = await graph.aget_state({"configurable": {"thread_id": "metered-1"}})
    assert len(after.values["messages"]) == len(before.values["messages"])


async def test_the_memory_page_shows_the_users_use_this_month_and_their_budget(pools):
    user, other = "page-user", "page-other"
    worker = ledger(pools[0], tokens=50_000)
    for who, tokens in ((user, 1200), (user, 300), (other, 9000)):
        admission = await worker.admit(user_id=who, thread_id="p", agent="page")
        used = RunUsage(model_calls=1)
        used.add("chat", PRICES, tokens, 0)
        await worker.settle(admission, used, status="done", wall_s=0.1)
    shown = await usage_this_month(SimpleNamespace(usage=worker), user)  # type: ignore[arg-type]
    assert shown == {
        "runs": 2,
        "tokens": 1500,
        "estimated_cost": 0.0015,
        "token_budget": 50_000,
        "cost_budget": 0.0,
    }
