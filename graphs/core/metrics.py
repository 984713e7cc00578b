"""Prometheus metrics: what the runner and the job code count in this process, and the queue,
wipe and pool figures read when /metrics is scraped (right across workers, since Postgres has them)."""

from __future__ import annotations

import logging
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

SHARED_READ_TIMEOUT_S = 2.0
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


async def exposition(pool: Pool) -> bytes:
    """The text a scrape gets: process counters, pool stats and the shared figures.

    If Postgres cannot be read the shared gauges keep their last values and the rest is still
    served (the pool's own figures then say what is wrong)."""
    read_pool(pool)
    try:
        await read_shared(pool)
    except Exception as exc:
        log.warning("metrics: shared figures not read: %s", exc)
    return generate_latest(REGISTRY)
