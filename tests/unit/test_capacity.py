"""The capacity model's formulas: percentiles, storage with retention and pruning, peak rates, money, workers, the first bottleneck and budget recommendations."""

from __future__ import annotations

import math

import pytest

from graphs.core.capacity import (
    MIN_RUNS,
    AgentFigures,
    Operator,
    Pilot,
    Spread,
    forecast,
    percentile,
    predicted_bytes,
    recommend,
    storage_bytes,
)
from graphs.core.measured import INNER_NODE, NODE_METRICS, figures, grown
from graphs.planner.graph import INNER_CALLS_ESTIMATE, STEP_NODES, review_request


def spread(mean: float, n: int = 100) -> Spread:
    return Spread(n=n, mean=mean, p50=mean, p95=mean, p99=mean)


def agent(key: str = "assistant", **overrides) -> AgentFigures:
    fields = {
        "agent": key,
        "runs": 400,
        "threads": 100,
        "users": 10,
        "spreads": {
            "model_calls": spread(2),
            "input_tokens": spread(1000),
            "output_tokens": spread(200),
        },
        "role_tokens": {"chat": (100_000, 20_000)},
        "thread_bytes": {"checkpoints": 8_000_000, "checkpoint_writes": 2_000_000},
        "store_bytes": 50_000,
    }
    return AgentFigures(**(fields | overrides))


def pilot(*agents: AgentFigures, **overrides) -> Pilot:
    fields = {
        "agents": {a.agent: a for a in agents or (agent(),)},
        "users": 10,
        "total_runs": 400,
        "fixed_bytes": 1_000_000,
        "run_bytes": 400_000,
        "other_store_bytes": 0,
        "row_writes": 20_000,
        "transactions": 8_000,
        "max_connections": 100,
    }
    return Pilot(**(fields | overrides))


def test_percentiles_interpolate_like_postgres():
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert percentile(values, 0.5) == 3.0
    assert percentile(values, 0.95) == pytest.approx(4.8)
    assert percentile([7.0], 0.99) == 7.0
    assert Spread.of([]) is None
    with pytest.raises(ValueError, match="no values"):
        percentile([], 0.5)


def test_storage_grows_with_threads_until_the_retention_window():
    # 100 threads of 100 KB per 400 runs; 1,000 runs a day = 250 threads = 25 MB a day.
    p = pilot()
    op = Operator(daily_users=100, runs_per_user=10, retention_days=30, prune_after_days=400)
    per_day = 250 * 100_000
    per_run = 1000 * 1000  # usage rows, kept whatever the retention: 1 KB a run
    store = 100 * 5_000  # 50 KB over 10 users, for 100 users
    assert storage_bytes(p, op, 10) == pytest.approx(1e6 + 10 * per_day + 10 * per_run + store)
    assert storage_bytes(p, op, 365) == pytest.approx(1e6 + 30 * per_day + 365 * per_run + store)


def test_threads_past_the_pruning_age_count_at_their_pruned_size():
    # Half the threads are old and hold a fifth of the bytes: young 160 KB, pruned 40 KB.
    pruned = agent(old_threads=50, old_bytes=2_000_000)
    assert pruned.young_bytes_per_thread == 160_000
    assert pruned.pruned_bytes_per_thread == 40_000
    op = Operator(daily_users=100, runs_per_user=10, retention_days=365, prune_after_days=7)
    threads = storage_bytes(pilot(pruned), op, 30) - storage_bytes(pilot(pruned), op, 0)
    per_run = 30 * 1000 * 1000
    assert threads - per_run == pytest.approx(250 * (7 * 160_000 + 23 * 40_000))
    # None measured yet: forecast as unpruned (an upper bound), never as the bench's figure.
    assert agent().pruned_bytes_per_thread is None


def test_the_larger_pilot_prediction_separates_what_grows():
    p = pilot()
    small = predicted_bytes(p, threads={"assistant": 100}, users=10)
    assert small == pytest.approx(p.total_bytes)
    large = predicted_bytes(p, threads={"assistant": 300}, users=30)
    assert large == pytest.approx(1e6 + 3 * (10e6 + 400_000 + 50_000))


def test_peak_rates_money_and_workers():
    p = pilot()
    op = Operator(
        daily_users=86_400,
        runs_per_user=1,
        peak_factor=2,
        prices={"chat": (0.001, 0.002)},
        sessions_per_worker=10,
        session_interval_s=10,
    )
    result = forecast(p, op)
    assert result.peak_runs_per_s == pytest.approx(2.0)
    assert result.peak_model_calls_per_s == pytest.approx(4.0)
    assert result.peak_tokens_per_s == pytest.approx(2 * 1200)
    assert result.peak_row_writes_per_s == pytest.approx(2 * 50)
    assert result.peak_transactions_per_s == pytest.approx(2 * 20)
    # Cost per run: (100k x 0.001 + 20k x 0.002) / 1000 over 100 finished runs.
    assert result.money_per_day == pytest.approx(86_400 * 0.14 / 100)
    assert result.workers == math.ceil(2.0 * 10 / 10)


def test_the_first_bottleneck_is_the_most_used_resource_and_when_it_runs_out():
    op = Operator(daily_users=1000, runs_per_user=10, requests_per_min=100, tokens_per_min=1e9)
    result = forecast(pilot(), op)
    worst, at_users = result.first_bottleneck(1000)
    # 10,000 runs a day x 3 at peak x 2 calls = ~41.7 calls a minute of 100.
    assert worst.name == "model requests per minute"
    assert worst.needed == pytest.approx(10_000 * 3 / 86_400 * 2 * 60)
    assert at_users == pytest.approx(1000 / worst.used)


def test_cost_prices_each_role_and_keeps_the_recorded_cost_of_older_runs():
    mixed = agent(
        role_tokens={"planner": (10_000, 0), "executor": (0, 10_000)},
        unpriced_cost=1.0,
        spreads={"model_calls": spread(1, n=4)},
    )
    prices = {"planner": (0.01, 0.0), "executor": (0.0, 0.1), "chat": (5.0, 5.0)}
    assert mixed.cost_per_run(prices) == pytest.approx((0.1 + 1.0 + 1.0) / 4)


def test_budgets_come_from_the_99th_percentile_with_headroom():
    few = Spread(n=MIN_RUNS - 1, mean=3, p50=3, p95=5, p99=6)
    assert recommend("steps", 6, few).recommended is None
    enough = Spread(n=MIN_RUNS, mean=3, p50=3, p95=5, p99=6.2)
    assert recommend("steps", 6, enough).recommended == 8  # ceil(6.2 x 1.25)
    assert recommend("timeout", 900, enough, time=True).recommended == 10  # ceil(6.2 x 1.5)
    assert recommend("none", 1, None).recommended is None


def test_usage_rows_become_distributions():
    rows = [
        {
            "model_calls": 9,
            "input_tokens": 900,
            "output_tokens": 100,
            "tool_calls": 5,
            "subagents": 2,
            "wall_s": 3.0,
            "nodes": {"execute_step": 3, "act": 6, "replan": 3, "reopen_claims": 1},
            "roles": {"planner": [400, 40], "executor": [500, 60]},
            "cost": 0.5,
        },
        {
            "model_calls": 1,
            "input_tokens": 100,
            "output_tokens": 10,
            "tool_calls": 0,
            "subagents": 0,
            "wall_s": None,
            "nodes": {"plan": 1},
            "roles": {},
            "cost": 0.25,
        },
    ]
    found = figures("planner", rows, runs=2, threads=1, users=1, thread_bytes={})
    assert found.spreads["steps"].p99 == pytest.approx(3 * 0.99)
    assert found.spreads["wall_s"].n == 1
    assert found.per_step_calls == Spread(n=1, mean=2.0, p50=2.0, p95=2.0, p99=2.0)
    assert found.per_subagent_tool_calls is not None
    assert found.per_subagent_tool_calls.mean == 1.5  # 5 tools, 2 of them starting subagents
    assert found.per_subagent_tokens is not None
    assert found.per_subagent_tokens.mean == 500
    assert found.role_tokens == {"planner": (400, 40), "executor": (500, 60)}
    assert (found.priced_runs, found.unpriced_cost) == (1, 0.25)


def test_the_measured_node_names_are_the_graphs_own():
    from graphs.planner.graph import build_graph as build_planner
    from graphs.research.graph import build_graph as build_research

    planner = build_planner(checkpointer=None, store=None, tools=[])
    research = build_research(checkpointer=None, store=None)
    assert (NODE_METRICS["steps"], INNER_NODE) == STEP_NODES
    assert {NODE_METRICS["steps"], NODE_METRICS["replans"]} <= set(planner.get_graph().nodes)
    assert NODE_METRICS["critique_rounds"] in research.get_graph().nodes
    executor = planner.get_graph(xray=1).nodes
    assert any(name.endswith(INNER_NODE) for name in executor)


def test_the_review_estimate_uses_measured_calls_per_step():
    state = {"input": "goal", "plan": ["a", "b", "c"]}
    constant = review_request(state, budget=6, max_rounds=3)
    assert constant["estimated_model_calls"] == 1 + 3 * (INNER_CALLS_ESTIMATE + 1)
    measured = review_request(state, budget=6, max_rounds=3, inner_calls=4.5)
    assert measured["estimated_model_calls"] == 1 + math.ceil(3 * 5.5)
    capped = review_request(state, budget=2, max_rounds=3, inner_calls=1.0)
    assert capped["estimated_model_calls"] == 1 + 2 * 2


def test_the_review_estimate_says_what_its_model_calls_come_to_once_measured():
    from ui.chainlit.agents.planner import review_text

    state = {"input": "goal", "plan": ["a", "b"]}
    unmeasured = review_request(state, budget=6, max_rounds=3, inner_calls=1.0)
    assert "estimated_tokens" not in unmeasured
    assert "tokens" not in review_text(unmeasured)
    measured = review_request(
        state, budget=6, max_rounds=3, inner_calls=1.0, per_call=(1200.0, 0.0005)
    )
    calls = measured["estimated_model_calls"]
    assert measured["estimated_tokens"] == calls * 1200
    assert measured["estimated_cost"] == pytest.approx(calls * 0.0005)
    assert f"about {calls} model calls (≈ {calls * 1200:,} tokens, est. $0.0025)" in review_text(
        measured
    )


def test_a_tables_growth_leaves_out_its_first_pages_but_never_its_rows():
    sizes = {"big": (10_000_000, 40_960), "tiny": (40_960, 40_960)}
    assert grown(sizes, "big", 9_000_000) == 10_000_000 - 40_960
    assert grown(sizes, "tiny", 2_000) == 2_000  # a few rows in pages that exist anyway
    assert grown(sizes, "tiny", 100_000) == 40_960  # never more than the table
    assert grown(sizes, "missing", 10) == 0
