"""The capacity model on real pilots: measured from one pilot's Postgres, it predicts what a pilot three times larger stores (within 15 %), and the Planner's review estimate uses the measured calls per step."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from bench.pilot import PilotShape, pilot_runner, run_pilot
from graphs.core.capacity import Operator, Pilot, forecast, predicted_bytes
from graphs.core.measured import measure
from graphs.core.persistence import Pool, make_pool
from tests.conftest import create_database
from ui.surface import HeadlessSurface

pytestmark = pytest.mark.integration

SMALL = PilotShape(assistant=40, planner=20, research=20, users=20)
FACTOR = 3
TOLERANCE = 0.15


async def measured(url: str) -> Pilot:
    pool = make_pool(url, max_size=2)
    await pool.open(wait=True)
    try:
        return await measure(pool)
    finally:
        await pool.close()


@pytest.fixture(scope="module")
async def small_pilot(pg_server_url: str) -> AsyncIterator[tuple[str, Pilot]]:
    url = create_database(pg_server_url)
    await run_pilot(url, SMALL, seed=1)
    return url, await measured(url)


@pytest.mark.timeout(900)
async def test_the_pilot_predicts_what_a_larger_pilot_stores(small_pilot, pg_server_url):
    _, pilot = small_pilot
    large = SMALL.scaled(FACTOR)
    predicted = predicted_bytes(pilot, threads=large.threads, users=large.users)
    url = create_database(pg_server_url)
    await run_pilot(url, large, seed=2)
    actual = (await measured(url)).total_bytes
    print(
        f"predicted {predicted:,.0f} B, stored {actual:,.0f} B, off {(predicted - actual) / actual:+.1%}"
    )
    assert abs(predicted - actual) / actual <= TOLERANCE, (predicted, actual)
    # Scaling the pilot's own total by three would not have been as close: the model separates
    # what grows from what does not.
    assert abs(predicted - actual) < abs(pilot.total_bytes * FACTOR - actual)


async def test_every_agents_runs_are_measured(small_pilot):
    _, pilot = small_pilot
    assert set(pilot.agents) == {"assistant", "planner", "research"}
    assistant, planner, research = (pilot.agents[k] for k in ("assistant", "planner", "research"))
    assert assistant.threads == SMALL.assistant
    assert assistant.runs == 4 * SMALL.assistant
    assert planner.runs == 2 * SMALL.planner  # the plan, then the approved run
    assert planner.spreads["steps"].p99 >= 1
    assert planner.per_step_calls is not None
    assert research.spreads["subagents"].p99 >= 1
    assert pilot.memories_per_user > 0  # each Assistant conversation said "remember that ..."
    assert pilot.embedding_dims == 384
    assert pilot.writes_per_run > 1
    assert pilot.transactions_per_run > 1
    for agent in (assistant, planner, research):
        assert agent.bytes_per_thread > 0
        assert sum(agent.role_tokens["chat"]) > 0
    prices = {"chat": (0.001, 0.002)}
    expected = sum(
        a.role_tokens["chat"][0] * 0.001 / 1000 + a.role_tokens["chat"][1] * 0.002 / 1000
        for a in (assistant, planner, research)
    )
    day = forecast(pilot, Operator(daily_users=pilot.users, runs_per_user=1.0, prices=prices))
    # At the pilot's own mix, one run per user: a day costs what the measured runs cost, per run.
    finished = sum(a.spreads["model_calls"].n for a in pilot.agents.values())
    assert day.money_per_day == pytest.approx(expected / finished * pilot.users, rel=0.02)


async def planner_review(url: str) -> dict:
    async with pilot_runner(url) as runner:
        surface = HeadlessSurface()
        outcome = await runner.message(
            surface,
            user_id="estimator",
            thread_id=f"estimate-{uuid.uuid4()}",
            profile="Planner",
            text="Which region had the highest churn last quarter?",
            message_id=str(uuid.uuid4()),
            temporary=False,
        )
    assert outcome.status == "paused", surface.errors
    return outcome.interrupts[0].value


async def set_inner_calls(pool: Pool, per_step: int) -> None:
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE cairn_usage SET nodes = jsonb_set(nodes, '{act}', to_jsonb("
            " (nodes->>'execute_step')::int * %s)) WHERE agent = 'planner'"
            " AND (nodes->>'execute_step')::int > 0",
            (per_step,),
        )


async def test_the_plan_review_estimates_with_measured_calls_per_step(small_pilot):
    url, _ = small_pilot
    measured_review = await planner_review(url)
    steps = len(measured_review["plan"])
    pool = make_pool(url, max_size=2)
    await pool.open(wait=True)
    try:
        # The recorded runs now say each step took 7 executor calls: the estimate follows.
        await set_inner_calls(pool, 7)
        review = await planner_review(url)
    finally:
        await pool.close()
    assert review["estimated_model_calls"] == 1 + steps * (7 + 1)
    assert measured_review["estimated_model_calls"] != review["estimated_model_calls"]


async def test_before_any_run_the_estimate_is_the_constant(pg_server_url):
    from graphs.planner.graph import INNER_CALLS_ESTIMATE

    review = await planner_review(create_database(pg_server_url))
    steps = len(review["plan"])
    assert review["estimated_model_calls"] == 1 + steps * (INNER_CALLS_ESTIMATE + 1)
