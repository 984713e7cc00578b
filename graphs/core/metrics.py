"""Prometheus metrics: what the runner, the saver and the job code count in this process, and the queue, wipe, table and pool figures read when /metrics is scraped (right across workers, since Postgres has them)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from graphs.core.pool import Pool

log = logging.getLogger("cairn.metrics")

REGISTRY = CollectorRegistry(auto_describe=True)
"""Cairn's own registry (not the process-wide default): only these series are served."""

TURNS = Counter(
    "cairn_turns",
    "Runs of the turn runner (messages, retries, button answers, resumed runs) by agent and outcome.",
    ["agent", "outcome"],
    registry=REGISTRY,
)
FIRST_TOKEN = Histogram(
    "cairn_time_to_first_token_seconds",
    "From the start of a run to the first streamed token of its reply.",
    ["agent"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60),
    registry=REGISTRY,
)
RUN_SECONDS = Histogram(
    "cairn_run_duration_seconds",
    "Wall time of one run, by agent and outcome.",
    ["agent", "outcome"],
    buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600),
    registry=REGISTRY,
)
RESUMED = Counter(
    "cairn_runs_resumed",
    "Runs a stopped worker left, resumed by this one, by agent and outcome.",
    ["agent", "outcome"],
    registry=REGISTRY,
)
MEMORY_JOB_RUNS = Counter(
    "cairn_memory_job_runs",
    "Memory-job attempts run in this process by outcome (done, retried, dead_lettered, skipped).",
    ["outcome"],
    registry=REGISTRY,
)
MEMORY_JOBS = Gauge(
    "cairn_memory_jobs",
    "Memory jobs in the shared queue by status (todo, doing, failed, ...), read at scrape time.",
    ["status"],
    registry=REGISTRY,
)
DEAD_LETTERS = Gauge(
    "cairn_memory_dead_letters",
    "Memory jobs dead-lettered after every attempt failed (memory_dead_letters rows).",
    registry=REGISTRY,
)
WIPES = Gauge(
    "cairn_wipes",
    "Account wipes logged in cairn_wipes, by whether their own check passed.",
    ["verified"],
    registry=REGISTRY,
)
PRUNED = Counter(
    "cairn_checkpoint_rows_pruned",
    "Checkpoint rows removed by pruning in this process, by table (checkpoints, writes, blobs).",
    ["table"],
    registry=REGISTRY,
)
POOL = Gauge(
    "cairn_db_pool",
    "The connection pool of this worker (psycopg_pool get_stats): pool_size, pool_available, "
    "requests_waiting, requests_num, requests_wait_ms (cumulative), requests_errors, ...",
    ["stat"],
    registry=REGISTRY,
)

CHECKPOINT_WRITE = Histogram(
    "cairn_checkpoint_write_seconds",
    "One checkpoint write of the saver: a checkpoint (its row and new blobs) or a node's writes.",
    ["kind"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
    registry=REGISTRY,
)
PRUNE_RUNS = Counter(
    "cairn_checkpoint_prune_runs",
    "Pruning jobs run in this process, by outcome (done, failed).",
    ["outcome"],
    registry=REGISTRY,
)
PRUNE_THREADS = Counter(
    "cairn_checkpoint_prune_threads",
    "Threads the pruning job looked at in this process: pruned, or busy (a run held it).",
    ["result"],
    registry=REGISTRY,
)
PRUNE_LAST = Gauge(
    "cairn_checkpoint_prune_last_run_timestamp_seconds",
    "When this process's last pruning job finished (Unix time; 0: none yet).",
    registry=REGISTRY,
)
PRUNE_BACKLOG = Gauge(
    "cairn_checkpoint_prune_threads_pending",
    "Threads active since they were last pruned (or never pruned), read at scrape time.",
    registry=REGISTRY,
)
TABLE_BYTES = Gauge(
    "cairn_table_bytes",
    "Size of each table on disk with its indexes and TOAST (partitions summed into their "
    "table), read at scrape time; growth is deriv() of it.",
    ["table"],
    registry=REGISTRY,
)
TABLE_ROWS = Gauge(
    "cairn_table_rows_estimate",
    "Rows of each table as the planner's statistics estimate them (pg_class.reltuples).",
    ["table"],
    registry=REGISTRY,
)
DATABASE_BYTES = Gauge(
    "cairn_database_bytes", "Size of the whole database on disk.", registry=REGISTRY
)
RUN_TOKENS = Counter(
    "cairn_run_tokens",
    "Model tokens used by finished runs, by agent and direction (input, output).",
    ["agent", "direction"],
    registry=REGISTRY,
)
RUN_COST = Counter(
    "cairn_run_cost",
    "Estimated cost of finished runs at the configured model prices, by agent.",
    ["agent"],
    registry=REGISTRY,
)
RUN_MODEL_CALLS = Counter(
    "cairn_run_model_calls", "Model calls made by runs, by agent.", ["agent"], registry=REGISTRY
)
RUN_TOOL_CALLS = Counter(
    "cairn_run_tool_calls",
    "Tool calls made by runs, by agent and result (ok, error).",
    ["agent", "result"],
    registry=REGISTRY,
)
RUN_SIGNALS = Counter(
    "cairn_run_signals",
    "Per-run quality figures, summed, by agent and signal: the planner's replans and runs ended "
    "at the step budget, Research's first-draft citations checked and passed (pass rate = "
    "passed / checked).",
    ["agent", "signal"],
    registry=REGISTRY,
)

SHARED_READ_TIMEOUT_S = 2.0
SIZES_TTL_S = 15.0
"""Table sizes are read at most this often (each scrape in between gets the last figures)."""
SIZES_STATEMENT_TIMEOUT_MS = 1500
"""A size read that takes longer (a huge catalogue, a busy server) is given up, not waited on."""
JOB_STATUSES = ("todo", "doing", "succeeded", "failed", "cancelled", "aborted")


def observe_run(agent: str, outcome: str, *, seconds: float, first_token_s: float | None) -> None:
    TURNS.labels(agent, outcome).inc()
    RUN_SECONDS.labels(agent, outcome).observe(seconds)
    if first_token_s is not None:
        FIRST_TOKEN.labels(agent).observe(first_token_s)


def observe_refusal(agent: str, outcome: str) -> None:
    """A run refused before it started (busy: another run of the thread is in progress)."""
    TURNS.labels(agent, outcome).inc()


def observe_resumed(agent: str, outcome: str) -> None:
    RESUMED.labels(agent, outcome).inc()


def observe_memory_job(outcome: str) -> None:
    MEMORY_JOB_RUNS.labels(outcome).inc()


def observe_prune(checkpoints: int, writes: int, blobs: int) -> None:
    PRUNED.labels("checkpoints").inc(checkpoints)
    PRUNED.labels("writes").inc(writes)
    PRUNED.labels("blobs").inc(blobs)


def observe_checkpoint_write(kind: str, seconds: float) -> None:
    CHECKPOINT_WRITE.labels(kind).observe(seconds)


def observe_prune_run(outcome: str, *, threads: int = 0, busy: int = 0) -> None:
    PRUNE_RUNS.labels(outcome).inc()
    PRUNE_THREADS.labels("pruned").inc(threads)
    PRUNE_THREADS.labels("busy").inc(busy)
    PRUNE_LAST.set(time.time())


def observe_run_usage(
    agent: str,
    *,
    input_tokens: int,
    output_tokens: int,
    cost: float,
    model_calls: int,
    tool_calls: int,
    tool_errors: int,
) -> None:
    RUN_TOKENS.labels(agent, "input").inc(input_tokens)
    RUN_TOKENS.labels(agent, "output").inc(output_tokens)
    RUN_COST.labels(agent).inc(cost)
    RUN_MODEL_CALLS.labels(agent).inc(model_calls)
    RUN_TOOL_CALLS.labels(agent, "ok").inc(max(tool_calls - tool_errors, 0))
    RUN_TOOL_CALLS.labels(agent, "error").inc(tool_errors)


def observe_run_signals(agent: str, signals: Mapping[str, float]) -> None:
    for signal, value in signals.items():
        RUN_SIGNALS.labels(agent, signal).inc(value)


_SIZES = """
SELECT c.relname AS name,
       CASE WHEN c.relkind = 'p' THEN (
           SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0)
           FROM pg_partition_tree(c.oid) t) ELSE pg_total_relation_size(c.oid) END AS bytes,
       CASE WHEN c.relkind = 'p' THEN (
           SELECT coalesce(sum(greatest(p.reltuples, 0)), 0)
           FROM pg_partition_tree(c.oid) t JOIN pg_class p ON p.oid = t.relid)
       ELSE greatest(c.reltuples, 0) END AS rows
FROM pg_class c
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
  AND NOT c.relispartition
"""
"""Every table of the app's schema (a bounded set: the migrations make them), a partitioned
one as the sum of its partitions."""
_PRUNE_BACKLOG = (
    "SELECT count(*) AS n FROM cairn_threads "
    "WHERE checkpoints_pruned_before IS NULL OR last_active_at > checkpoints_pruned_before"
)


class SlowFigures:
    """Table sizes and the pruning backlog: costlier than a scrape should pay each time, so
    read at most every `ttl_s` by this process, each read bounded by a statement timeout."""

    def __init__(self, *, ttl_s: float = SIZES_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._read_at = float("-inf")

    async def read(self, pool: Pool) -> None:
        if time.monotonic() - self._read_at < self.ttl_s:
            return
        self._read_at = time.monotonic()  # a failed read is not retried every scrape either
        async with pool.connection(timeout=SHARED_READ_TIMEOUT_S) as conn, conn.transaction():
            await conn.execute(f"SET LOCAL statement_timeout = {SIZES_STATEMENT_TIMEOUT_MS}")
            tables = await (await conn.execute(_SIZES)).fetchall()
            database = await (
                await conn.execute("SELECT pg_database_size(current_database()) AS n")
            ).fetchone()
            backlog = await (await conn.execute(_PRUNE_BACKLOG)).fetchone()
        for row in tables:
            TABLE_BYTES.labels(row["name"]).set(row["bytes"])
            TABLE_ROWS.labels(row["name"]).set(row["rows"])
        DATABASE_BYTES.set((database or {"n": 0})["n"])
        PRUNE_BACKLOG.set((backlog or {"n": 0})["n"])


async def read_shared(pool: Pool) -> None:
    """The figures every worker shares, from Postgres, into the gauges (before each scrape)."""
    # A short wait: with the pool exhausted the scrape still answers (pool stats say why).
    async with pool.connection(timeout=SHARED_READ_TIMEOUT_S) as conn:
        cur = await conn.execute(
            "SELECT status::text AS status, count(*) AS n FROM procrastinate_jobs "
            "WHERE queue_name = 'memory' GROUP BY status"
        )
        jobs = {row["status"]: row["n"] for row in await cur.fetchall()}
        cur = await conn.execute("SELECT count(*) AS n FROM memory_dead_letters")
        dead = (await cur.fetchone() or {"n": 0})["n"]
        cur = await conn.execute(
            "SELECT count(*) FILTER (WHERE verified) AS yes, "
            "count(*) FILTER (WHERE NOT verified) AS no FROM cairn_wipes"
        )
        wipes = await cur.fetchone() or {"yes": 0, "no": 0}
    for status in {*JOB_STATUSES, *jobs}:
        MEMORY_JOBS.labels(status).set(jobs.get(status, 0))
    DEAD_LETTERS.set(dead)
    WIPES.labels("true").set(wipes["yes"])
    WIPES.labels("false").set(wipes["no"])


def read_pool(pool: Pool) -> None:
    for stat, value in pool.get_stats().items():
        POOL.labels(stat).set(value)


async def exposition(pool: Pool, slow: SlowFigures | None = None) -> bytes:
    """The text a scrape gets: process counters, pool stats and the shared figures.

    If Postgres cannot be read the shared gauges keep their last values and the rest is still
    served (the pool's own figures then say what is wrong)."""
    read_pool(pool)
    try:
        await read_shared(pool)
    except Exception as exc:
        log.warning("metrics: shared figures not read: %s", exc)
    try:
        if slow is not None:
            await slow.read(pool)
    except Exception as exc:
        log.warning("metrics: table sizes not read: %s", exc)
    return generate_latest(REGISTRY)
