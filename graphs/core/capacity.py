"""The capacity and cost model: a deployment's measured figures filled into the seeds' formulas."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

DAY_S = 86_400
MONTH_DAYS = 30
YEAR_DAYS = 365
METRICS = (
    "model_calls",
    "input_tokens",
    "output_tokens",
    "tool_calls",
    "subagents",
    "steps",
    "replans",
    "critique_rounds",
    "wall_s",
)
"""Per-run figures kept for every finished run (graphs/core/usage.py writes them)."""
COUNT_HEADROOM = 1.25
"""A budget is the 99th percentile plus this margin: ordinary runs never meet it, runaways do."""
TIME_HEADROOM = 1.5
"""Times vary more with the model server's load than counts do."""
MIN_RUNS = 20
"""Fewer finished runs than this recommend nothing: their 99th percentile is their maximum."""


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks, as Postgres's percentile_cont."""
    if not values:
        msg = "a percentile of no values"
        raise ValueError(msg)
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Spread:
    """One figure's distribution over runs."""

    n: int
    mean: float
    p50: float
    p95: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread | None:
        if not values:
            return None
        return cls(
            n=len(values),
            mean=sum(values) / len(values),
            p50=percentile(values, 0.5),
            p95=percentile(values, 0.95),
            p99=percentile(values, 0.99),
        )


@dataclass(frozen=True)
class AgentFigures:
    """What one agent's recorded runs and threads measured."""

    agent: str
    runs: int
    """Runs that ran (finished, paused, stopped or failed), all of them."""
    threads: int
    users: int
    spreads: Mapping[str, Spread]
    """METRICS per finished run (the most recent ones)."""
    per_step_calls: Spread | None = None
    """Inner model calls per executed step (the Planner's executor), per run that ran a step."""
    per_subagent_tool_calls: Spread | None = None
    """Tool calls per subagent (other than starting one), per run that started any."""
    per_subagent_tokens: Spread | None = None
    """Tokens per subagent, the orchestrator's share included: an upper bound."""
    role_tokens: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    """Input and output tokens per model role, summed over the runs that recorded them."""
    priced_runs: int = 0
    """Finished runs whose tokens per role were recorded."""
    unpriced_cost: float = 0.0
    """Recorded cost of the finished runs without tokens per role (priced when they ran)."""
    thread_bytes: Mapping[str, int] = field(default_factory=dict)
    """Per table: bytes of this agent's threads (rows and their share of indexes and TOAST)."""
    thread_rows: Mapping[str, int] = field(default_factory=dict)
    """Per table: rows of this agent's threads."""
    old_threads: int = 0
    """Threads idle past the checkpoint pruning age (already pruned, or about to be)."""
    old_bytes: int = 0
    """Their share of thread_bytes."""
    store_bytes: int = 0
    """Store items this agent keeps per user (values and vectors), over all users."""
    store_items: int = 0

    @property
    def runs_per_thread(self) -> float:
        return self.runs / self.threads if self.threads else 0.0

    @property
    def bytes_per_thread(self) -> float:
        return sum(self.thread_bytes.values()) / self.threads if self.threads else 0.0

    @property
    def young_bytes_per_thread(self) -> float:
        """A thread within the pruning age (every thread, when none is older)."""
        young = self.threads - self.old_threads
        if young <= 0:
            return self.bytes_per_thread
        return (sum(self.thread_bytes.values()) - self.old_bytes) / young

    @property
    def pruned_bytes_per_thread(self) -> float | None:
        """A thread past the pruning age, as measured; None before any was that old."""
        return self.old_bytes / self.old_threads if self.old_threads else None

    @property
    def bytes_per_run(self) -> float:
        return sum(self.thread_bytes.values()) / self.runs if self.runs else 0.0

    def mean(self, metric: str) -> float:
        spread = self.spreads.get(metric)
        return spread.mean if spread is not None else 0.0

    def cost_per_run(self, prices: Mapping[str, tuple[float, float]]) -> float:
        """Mean money per finished run at `prices` (per 1,000 tokens and role)."""
        finished = self.spreads["model_calls"].n if "model_calls" in self.spreads else 0
        if not finished:
            return 0.0
        fallback = prices.get("chat", (0.0, 0.0))
        priced = sum(
            (tin * prices.get(role, fallback)[0] + tout * prices.get(role, fallback)[1]) / 1000
            for role, (tin, tout) in self.role_tokens.items()
        )
        return (priced + self.unpriced_cost) / finished


@dataclass(frozen=True)
class Pilot:
    """Everything measured in one deployment's Postgres."""

    agents: Mapping[str, AgentFigures]
    users: int
    """Users with at least one run."""
    total_runs: int
    """Every run recorded, of every agent."""
    fixed_bytes: int
    """Tables that do not grow with threads, runs or users (schema, corpus index, demo data)."""
    run_bytes: int
    """Tables kept per run beyond retention (usage rows, the job queue)."""
    other_store_bytes: int
    """Store items of users not tied to one agent."""
    row_writes: int
    """Rows inserted, updated or deleted in Cairn's tables since Postgres's statistics began."""
    transactions: int
    """Transactions of this database since then (every statement runs in one)."""
    max_connections: int
    embedding_dims: int | None = None
    value_bytes: float = 0.0
    """Mean bytes of one store item's row (key, namespace, JSON value)."""
    vector_bytes: float = 0.0
    """Mean bytes of one stored embedding (dims x 4 bytes + 8)."""

    @property
    def total_bytes(self) -> int:
        threads = sum(sum(a.thread_bytes.values()) for a in self.agents.values())
        store = sum(a.store_bytes for a in self.agents.values()) + self.other_store_bytes
        return self.fixed_bytes + self.run_bytes + threads + store

    @property
    def store_bytes_per_user(self) -> float:
        store = sum(a.store_bytes for a in self.agents.values()) + self.other_store_bytes
        return store / self.users if self.users else 0.0

    @property
    def memories_per_user(self) -> float:
        assistant = self.agents.get("assistant")
        return assistant.store_items / self.users if assistant and self.users else 0.0

    @property
    def writes_per_run(self) -> float:
        return self.row_writes / self.total_runs if self.total_runs else 0.0

    @property
    def transactions_per_run(self) -> float:
        return self.transactions / self.total_runs if self.total_runs else 0.0

    @property
    def run_bytes_per_run(self) -> float:
        return self.run_bytes / self.total_runs if self.total_runs else 0.0

    def mix(self) -> dict[str, float]:
        """Each agent's share of runs, as measured."""
        total = sum(a.runs for a in self.agents.values())
        return {k: a.runs / total for k, a in self.agents.items()} if total else {}


@dataclass(frozen=True)
class Operator:
    """What the operator expects (flags of `make capacity`)."""

    daily_users: int
    runs_per_user: float = 10.0
    """Runs per active user per day: messages, plan and topic approvals."""
    users: int | None = None
    """Users whose memories are kept (default: the daily users)."""
    peak_factor: float = 3.0
    """The busiest hour's rate over the day's mean rate."""
    retention_days: int = 365
    prune_after_days: float = 7.0
    """Checkpoints of threads idle this long are pruned (CAIRN_CHECKPOINT_PRUNE_AFTER_HOURS)."""
    prices: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    requests_per_min: float = 10_000.0
    """The model provider's rate limit: requests per minute."""
    tokens_per_min: float = 2_000_000.0
    """The model provider's rate limit: tokens per minute."""
    sessions_per_worker: int = 280
    """Chat sessions one worker serves within the latency goal (bench/README.md)."""
    session_interval_s: float = 10.0
    """How often each of those sessions sent a message."""
    pool_per_worker: int = 10
    """Postgres connections one worker may hold."""
    disk_gb: float = 500.0
    """Postgres's disk."""
    row_writes_per_s: float = 20_000.0
    """Row writes per second the Postgres primary sustains (measure yours)."""
    mix: Mapping[str, float] | None = None
    """Share of runs per agent (default: as measured)."""


@dataclass(frozen=True)
class Limit:
    """One resource at the forecast load: what is needed against what there is."""

    name: str
    needed: float
    available: float
    unit: str

    @property
    def used(self) -> float:
        return self.needed / self.available if self.available else math.inf


@dataclass(frozen=True)
class Forecast:
    """The seeds' formulas filled with a pilot's figures, for one operator's inputs."""

    runs_per_day: dict[str, float]
    storage_month: float
    storage_year: float
    peak_runs_per_s: float
    peak_row_writes_per_s: float
    peak_transactions_per_s: float
    peak_model_calls_per_s: float
    peak_tokens_per_s: float
    money_per_day: float
    workers: int
    limits: list[Limit]

    def first_bottleneck(self, daily_users: int) -> tuple[Limit, float]:
        """The resource that runs out first, and the daily users at which it does. Every need
        grows in proportion to the users (connections in whole workers, nearly so)."""
        worst = max(self.limits, key=lambda limit: limit.used)
        return worst, daily_users / worst.used if worst.used else math.inf


def storage_bytes(pilot: Pilot, operator: Operator, days: int) -> float:
    """Bytes after `days`: threads within the retention window (pruned past the pruning age, at
    their measured pruned size, unpruned while none was measured), usage rows of every run,
    every user's store items, and what does not grow."""
    runs = runs_per_day(pilot, operator)
    kept_days = min(days, operator.retention_days)
    young_days = min(kept_days, operator.prune_after_days)
    threads = 0.0
    for key, per_day in runs.items():
        agent = pilot.agents.get(key)
        if agent is not None and agent.runs_per_thread:
            pruned = agent.pruned_bytes_per_thread
            old = agent.young_bytes_per_thread if pruned is None else pruned
            per_thread = young_days * agent.young_bytes_per_thread + (kept_days - young_days) * old
            threads += per_day / agent.runs_per_thread * per_thread
    per_run = sum(runs.values()) * days * pilot.run_bytes_per_run
    users = operator.users if operator.users is not None else operator.daily_users
    return pilot.fixed_bytes + threads + per_run + users * pilot.store_bytes_per_user


def predicted_bytes(pilot: Pilot, *, threads: Mapping[str, int], users: int) -> float:
    """What a deployment with `threads` per agent of the pilot's shape and `users` stores."""
    total = float(pilot.fixed_bytes) + users * pilot.store_bytes_per_user
    for key, count in threads.items():
        agent = pilot.agents[key]
        total += count * agent.bytes_per_thread
        total += count * agent.runs_per_thread * pilot.run_bytes_per_run
    return total


def runs_per_day(pilot: Pilot, operator: Operator) -> dict[str, float]:
    mix = operator.mix if operator.mix is not None else pilot.mix()
    total = operator.daily_users * operator.runs_per_user
    return {agent: total * share for agent, share in mix.items()}


def forecast(pilot: Pilot, operator: Operator) -> Forecast:
    runs = runs_per_day(pilot, operator)
    peak = operator.peak_factor / DAY_S
    peak_runs = sum(runs.values()) * peak
    calls = sum(n * _mean(pilot, k, "model_calls") for k, n in runs.items()) * peak
    tokens = sum(n * _tokens(pilot, k) for k, n in runs.items()) * peak
    money = sum(
        n * pilot.agents[k].cost_per_run(operator.prices)
        for k, n in runs.items()
        if k in pilot.agents
    )
    workers = max(
        1, math.ceil(peak_runs * operator.session_interval_s / operator.sessions_per_worker)
    )
    year = storage_bytes(pilot, operator, YEAR_DAYS)
    writes = peak_runs * pilot.writes_per_run
    limits = [
        Limit("model requests per minute", calls * 60, operator.requests_per_min, "req/min"),
        Limit("model tokens per minute", tokens * 60, operator.tokens_per_min, "tokens/min"),
        Limit("Postgres row writes per second", writes, operator.row_writes_per_s, "rows/s"),
        Limit(
            "Postgres connections",
            workers * operator.pool_per_worker,
            pilot.max_connections,
            "connections",
        ),
        Limit("Postgres disk after a year", year / 1e9, operator.disk_gb, "GB"),
    ]
    return Forecast(
        runs_per_day=runs,
        storage_month=storage_bytes(pilot, operator, MONTH_DAYS),
        storage_year=year,
        peak_runs_per_s=peak_runs,
        peak_row_writes_per_s=writes,
        peak_transactions_per_s=peak_runs * pilot.transactions_per_run,
        peak_model_calls_per_s=calls,
        peak_tokens_per_s=tokens,
        money_per_day=money,
        workers=workers,
        limits=limits,
    )


def _mean(pilot: Pilot, agent: str, metric: str) -> float:
    figures = pilot.agents.get(agent)
    return figures.mean(metric) if figures is not None else 0.0


def _tokens(pilot: Pilot, agent: str) -> float:
    return _mean(pilot, agent, "input_tokens") + _mean(pilot, agent, "output_tokens")


@dataclass(frozen=True)
class Recommendation:
    """A budget setting next to what the recorded runs say it should be."""

    setting: str
    configured: float
    measured: Spread | None
    recommended: float | None
    """None: fewer than MIN_RUNS runs measured it."""


def recommend(
    setting: str, configured: float, measured: Spread | None, *, time: bool = False
) -> Recommendation:
    """The 99th percentile with headroom, rounded up (a whole number for counts)."""
    if measured is None or measured.n < MIN_RUNS:
        return Recommendation(setting, configured, measured, None)
    value = measured.p99 * (TIME_HEADROOM if time else COUNT_HEADROOM)
    return Recommendation(setting, configured, measured, float(max(1, math.ceil(value))))
