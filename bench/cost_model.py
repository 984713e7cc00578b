"""`make capacity`: the capacity and cost model on this deployment's Postgres (or on a scripted pilot), printed."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from graphs.core.capacity import (
    MONTH_DAYS,
    YEAR_DAYS,
    AgentFigures,
    Forecast,
    Operator,
    Pilot,
    Recommendation,
    Spread,
    forecast,
    recommend,
)
from graphs.core.measured import measure
from graphs.core.persistence import database_url, make_pool, start_embedded_postgres
from graphs.core.settings import Settings
from graphs.research.graph import MAX_TODOS

SESSIONS_PER_WORKER = 280
"""bench/README.md, "Sessions per worker": p95 time to first token within 150 ms."""
TABLE_GROUPS = {
    "checkpoints": ("checkpoints", "checkpoint_blobs"),
    "checkpoint writes": ("checkpoint_writes",),
    "Chainlit steps": ("Thread", "Step", "Element"),
    "fetch log": ("research_fetch_log",),
    "run journal": ("cairn_runs",),
    "other": ("cairn_threads", "cairn_message_checkpoints"),
}
SPREADS = (
    ("model calls", "model_calls"),
    ("input tokens", "input_tokens"),
    ("output tokens", "output_tokens"),
    ("tool calls", "tool_calls"),
    ("subagents", "subagents"),
    ("steps", "steps"),
    ("replans", "replans"),
    ("critique rounds", "critique_rounds"),
    ("wall s", "wall_s"),
)

Out = Callable[[str], None]


def arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    settings = Settings()
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="make capacity", description=__doc__)
    add = parser.add_argument
    add(
        "--daily-users",
        type=_ints,
        default=_ints(env("DAU", "10000,1000000")),
        help="daily active users, comma-separated for several forecasts (env DAU)",
    )
    add(
        "--runs-per-user",
        type=float,
        default=float(env("RUNS_PER_USER", "10")),
        help="runs per active user a day: messages, plan and topic approvals (env RUNS_PER_USER)",
    )
    add("--users", type=int, default=None, help="users whose memories are kept (default: DAU)")
    add(
        "--peak-factor",
        type=float,
        default=float(env("PEAK_FACTOR", "3")),
        help="busiest hour's rate over the day's mean (env PEAK_FACTOR)",
    )
    add(
        "--retention-days",
        type=int,
        default=int(env("RETENTION_DAYS", settings.retention_days)),
        help="conversations kept this long (default CAIRN_RETENTION_DAYS)",
    )
    add(
        "--prices",
        type=json.loads,
        default=None,
        help="per role, per 1,000 input and output tokens: '{\"chat\": [0.0004, 0.0016]}' "
        "(default CAIRN_MODEL_PRICES)",
    )
    add(
        "--rpm",
        type=float,
        default=float(env("RPM", "10000")),
        help="the model provider's requests per minute (env RPM)",
    )
    add(
        "--tpm",
        type=float,
        default=float(env("TPM", "2000000")),
        help="the model provider's tokens per minute (env TPM)",
    )
    add(
        "--sessions-per-worker",
        type=int,
        default=int(env("SESSIONS_PER_WORKER", SESSIONS_PER_WORKER)),
    )
    add(
        "--session-interval-s",
        type=float,
        default=10.0,
        help="how often each benchmarked session sent a message",
    )
    add("--disk-gb", type=float, default=float(env("DISK_GB", "500")))
    add(
        "--pg-writes-per-s",
        type=float,
        default=float(env("PG_WRITES_PER_S", "20000")),
        help="row writes per second your Postgres primary sustains (measure it)",
    )
    add(
        "--pilot",
        type=int,
        default=0,
        metavar="N",
        help="measure a scripted pilot of N conversations per agent (2N Assistant) in a throwaway "
        "Postgres instead of this deployment's",
    )
    return parser.parse_args(argv)


def _ints(text: str) -> list[int]:
    try:
        values = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        msg = f"expected whole numbers separated by commas, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None
    if not values or min(values) < 1:
        msg = "daily users must be at least 1"
        raise argparse.ArgumentTypeError(msg)
    return values


def operator(args: argparse.Namespace, settings: Settings, daily_users: int) -> Operator:
    prices = {str(k): tuple(v) for k, v in settings.model_prices.items()}
    prices |= {k: (float(v[0]), float(v[1])) for k, v in (args.prices or {}).items()}
    return Operator(
        daily_users=daily_users,
        runs_per_user=args.runs_per_user,
        users=args.users,
        peak_factor=args.peak_factor,
        retention_days=args.retention_days,
        prune_after_days=settings.checkpoint_prune_after_hours / 24,
        prices=prices,
        requests_per_min=args.rpm,
        tokens_per_min=args.tpm,
        sessions_per_worker=args.sessions_per_worker,
        session_interval_s=args.session_interval_s,
        pool_per_worker=settings.pool_max_size,
        disk_gb=args.disk_gb,
        row_writes_per_s=args.pg_writes_per_s,
    )


def print_measured(pilot: Pilot, out: Out, *, source: str) -> None:
    out(f"== Measured ({source})")
    out(f"users with runs {pilot.users:,}; runs recorded {pilot.total_runs:,}")
    for agent in pilot.agents.values():
        print_agent(agent, out)
    out(
        f"store: {pilot.memories_per_user:.1f} Assistant items (memories, markers) per user; an item {pilot.value_bytes:,.0f} B"
        f" + its vector {pilot.vector_bytes:,.0f} B ({pilot.embedding_dims or '-'} dims x 4 B + 8);"
        f" {pilot.store_bytes_per_user / 1e3:,.1f} KB per user, all agents"
    )
    out(
        f"per run (every agent, background jobs included): {pilot.writes_per_run:,.1f} row writes,"
        f" {pilot.transactions_per_run:,.1f} transactions (statements >= transactions),"
        f" {pilot.run_bytes_per_run:,.0f} B kept beyond retention (usage row, job queue)"
    )
    out(f"not growing: {pilot.fixed_bytes / 1e6:,.1f} MB; max_connections {pilot.max_connections}")


def print_agent(agent: AgentFigures, out: Out) -> None:
    out(
        f"-- {agent.agent}: {agent.runs:,} runs, {agent.threads:,} threads"
        f" ({agent.runs_per_thread:.2f} runs/thread), {agent.users:,} users;"
        f" {agent.bytes_per_thread / 1e3:,.1f} KB/thread, {agent.bytes_per_run / 1e3:,.1f} KB/run;"
        f" {agent.store_items:,} store items"
    )
    parts = []
    for group, tables in TABLE_GROUPS.items():
        size = sum(agent.thread_bytes.get(t, 0) for t in tables)
        rows = sum(agent.thread_rows.get(t, 0) for t in tables)
        if size and agent.runs:
            parts.append(
                f"{group} {size / agent.runs / 1e3:,.1f} KB ({rows / agent.runs:,.1f} rows)"
            )
    out("   per run: " + ("; ".join(parts) or "-"))
    pruned = agent.pruned_bytes_per_thread
    out(
        f"   a thread within the pruning age {agent.young_bytes_per_thread / 1e3:,.1f} KB, past it "
        + (
            f"{pruned / 1e3:,.1f} KB ({agent.old_threads:,} threads)"
            if pruned is not None
            else "not measured yet (forecast as unpruned: an upper bound)"
        )
    )
    out(f"   {'':16} {'mean':>10} {'p50':>10} {'p95':>10} {'p99':>10}")
    for label, metric in SPREADS:
        if (spread := agent.spreads.get(metric)) is not None and spread.p99:
            out("   " + _spread_row(label, spread))
    if agent.per_step_calls is not None:
        out("   " + _spread_row("calls per step", agent.per_step_calls))


def _spread_row(label: str, spread: Spread) -> str:
    cells = (spread.mean, spread.p50, spread.p95, spread.p99)
    digits = 2 if spread.p99 < 10 else 1
    return f"{label:16} " + " ".join(f"{value:>10,.{digits}f}" for value in cells)


def recommendations(pilot: Pilot, settings: Settings) -> list[Recommendation]:
    research = pilot.agents.get("research")
    planner = pilot.agents.get("planner")
    spread = lambda agent, metric: agent.spreads.get(metric) if agent else None  # noqa: E731
    return [
        recommend("research todos (MAX_TODOS)", MAX_TODOS, spread(research, "subagents")),
        recommend(
            "CAIRN_RESEARCH_SUBAGENT_TOOL_CALLS",
            settings.research_subagent_tool_calls,
            research.per_subagent_tool_calls if research else None,
        ),
        recommend(
            "CAIRN_RESEARCH_SUBAGENT_TOKENS",
            settings.research_subagent_tokens,
            research.per_subagent_tokens if research else None,
        ),
        recommend(
            "CAIRN_RESEARCH_CRITIQUE_ROUNDS",
            settings.research_critique_rounds,
            spread(research, "critique_rounds"),
        ),
        recommend(
            "CAIRN_PLANNER_STEP_BUDGET", settings.planner_step_budget, spread(planner, "steps")
        ),
        recommend(
            "CAIRN_RESEARCH_RUN_TIMEOUT_S",
            settings.research_run_timeout_s,
            spread(research, "wall_s"),
            time=True,
        ),
        recommend(
            "CAIRN_RESEARCH_SUBAGENT_TIMEOUT_S (whole run: an upper bound)",
            settings.research_subagent_timeout_s,
            spread(research, "wall_s"),
            time=True,
        ),
    ]


def print_budgets(found: list[Recommendation], out: Out) -> None:
    out("== Budgets (recommended: the 99th percentile + 25 %, times + 50 %)")
    out(f"{'setting':62} {'configured':>10} {'p95':>9} {'p99':>9} {'recommended':>11}")
    for rec in found:
        p95 = f"{rec.measured.p95:,.1f}" if rec.measured else "-"
        p99 = f"{rec.measured.p99:,.1f}" if rec.measured else "-"
        value = f"{rec.recommended:,.0f}" if rec.recommended is not None else "too few runs"
        out(f"{rec.setting:62} {rec.configured:>10,.0f} {p95:>9} {p99:>9} {value:>11}")


def print_forecast(result: Forecast, op: Operator, out: Out) -> None:
    runs = sum(result.runs_per_day.values())
    out(
        f"== Forecast: {op.daily_users:,} daily users x {op.runs_per_user:g} runs, peak x"
        f" {op.peak_factor:g}, retention {op.retention_days} days"
    )
    mix = ", ".join(f"{k} {v:,.0f}" for k, v in result.runs_per_day.items())
    out(f"runs per day {runs:,.0f} ({mix}); at peak {result.peak_runs_per_s:,.1f}/s")
    out(
        f"storage after {MONTH_DAYS} days {result.storage_month / 1e9:,.2f} GB,"
        f" after {YEAR_DAYS} days {result.storage_year / 1e9:,.2f} GB"
    )
    out(
        f"Postgres at peak: {result.peak_row_writes_per_s:,.0f} row writes/s,"
        f" {result.peak_transactions_per_s:,.0f} transactions/s"
    )
    out(
        f"model at peak: {result.peak_model_calls_per_s * 60:,.0f} calls/min (limit {op.requests_per_min:,.0f}),"
        f" {result.peak_tokens_per_s * 60:,.0f} tokens/min (limit {op.tokens_per_min:,.0f})"
    )
    out(f"money per day ${result.money_per_day:,.2f}; workers at peak {result.workers:,}")
    for limit in sorted(result.limits, key=lambda item: -item.used):
        out(
            f"   {limit.name:34} {limit.needed:>14,.1f} of {limit.available:>12,.0f} {limit.unit:11} {limit.used:>8.1%}"
        )
    worst, at_users = result.first_bottleneck(op.daily_users)
    out(f"runs out first: {worst.name} (at about {at_users:,.0f} daily users)")


async def read_pilot(args: argparse.Namespace, settings: Settings) -> Pilot:
    if args.pilot:
        url = await scripted_pilot(args.pilot)
    else:
        url = await database_url(settings)
    pool = make_pool(url, max_size=2)
    await pool.open(wait=True, timeout=30)
    try:
        return await measure(pool, prune_after_hours=settings.checkpoint_prune_after_hours)
    finally:
        await pool.close()


def _throwaway_postgres() -> str:
    folder = Path(tempfile.mkdtemp(prefix="cairn-pilot-"))
    folder.chmod(0o755)  # the server runs as its own system user when we are root
    return start_embedded_postgres(folder, throwaway=True)


async def scripted_pilot(conversations: int) -> str:
    """A throwaway Postgres holding a scripted pilot (bench/pilot.py); its URL."""
    from bench.pilot import PilotShape, run_pilot

    url = await asyncio.to_thread(_throwaway_postgres)
    shape = PilotShape(2 * conversations, conversations, conversations, max(1, conversations // 2))
    # Twice as many Assistant conversations: the chat is what most messages go to.
    await run_pilot(url, shape)
    return url


async def amain(argv: Sequence[str] | None = None, out: Out = print) -> None:
    args = arguments(argv)
    settings = Settings()
    pilot = await read_pilot(args, settings)
    if not pilot.total_runs:
        out("No runs recorded yet: serve a few conversations (make run), then run this again.")
        return
    source = (
        f"a scripted pilot: {args.pilot} Planner and Research, {2 * args.pilot} Assistant conversations"
        if args.pilot
        else "this deployment's Postgres"
    )
    print_measured(pilot, out, source=source)
    print_budgets(recommendations(pilot, settings), out)
    for daily_users in args.daily_users:
        op = operator(args, settings, daily_users)
        print_forecast(forecast(pilot, op), op, out)


def main() -> None:
    asyncio.run(amain())


if __name__ == "__main__":
    main()
