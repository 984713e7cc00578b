"""What runs cost: every run's model calls and tokens counted, recorded in Postgres, and each user's monthly budget (and in a team's conversations, the team's) checked before a run starts."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.prompt_values import PromptValue
from langchain_core.tracers.context import register_configure_hook
from psycopg.types.json import Jsonb

from graphs.core.models import ROLE_KEY
from graphs.core.offline import OFFLINE_STRUCTURED, estimated_tokens

if TYPE_CHECKING:
    from langchain_core.outputs import LLMResult
    from psycopg import AsyncConnection

    from graphs.core.pool import Pool
    from graphs.core.settings import Settings

Prices = Mapping[str, tuple[float, float]]
"""Per role: price per 1,000 input tokens, per 1,000 output tokens."""
DEFAULT_ROLE = "chat"
"""A model built without a role (a test's, an agent's offline stand-in) is priced as chat."""
SUBAGENT_TOOL = "task"
"""The deep agent's tool that starts a subagent."""
RESERVATION_TTL_S = 3600
"""A running run's reservation counts against the budget for this long: a worker killed mid-run
never settles it, and it must not hold the user's budget forever (runs time out well before)."""
ESTIMATE_WINDOW = 200
"""Recent finished runs of an agent whose 95th percentile is the next run's reservation."""
TEAM_BUDGET = "budget"
"""The workspace setting (cairn_workspaces.settings) holding the team's monthly budget:
{"tokens": int | null, "cost": float | null}, set by its managers (ui/workspace_page.py)."""


@dataclass
class RunUsage:
    """One run's model use, as it happened (the offline stand-in's tokens are its estimate)."""

    model_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    """Tool calls that raised or came back as an error message (the model saw the error)."""
    subagents: int = 0
    cost: float = 0.0
    nodes: Counter[str] = field(default_factory=Counter)
    """Graph node runs by name (planner steps, replans, critique rounds ...)."""
    roles: dict[str, list[int]] = field(default_factory=dict)
    """Input and output tokens per model role, to price the run at other prices later."""

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def add(self, role: str, prices: Prices, input_tokens: int, output_tokens: int) -> None:
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        by_role = self.roles.setdefault(role, [0, 0])
        by_role[0] += input_tokens
        by_role[1] += output_tokens
        price_in, price_out = prices.get(role) or prices.get(DEFAULT_ROLE) or (0.0, 0.0)
        self.cost += (input_tokens * price_in + output_tokens * price_out) / 1000

    def summary(self) -> str:
        """One line for the reply's footer."""
        calls = "call" if self.model_calls == 1 else "calls"
        return (
            f"{self.tokens:,} tokens ({self.input_tokens:,} in, {self.output_tokens:,} out) · "
            f"{self.model_calls} model {calls} · est. {money(self.cost)}"
        )


def money(amount: float) -> str:
    return f"${amount:.4f}" if amount < 1 else f"${amount:,.2f}"


class UsageMeter(AsyncCallbackHandler):
    """Counts one run's model calls, tokens (as the server reports them), tool calls, subagents
    and node runs. Added to every callback manager configured inside the run by LangChain's
    configure hook (`metered`), so subagents and nested graphs count too."""

    run_inline = True

    def __init__(self, prices: Prices) -> None:
        self.prices = prices
        self.usage = RunUsage()
        self._roles: dict[uuid.UUID, str] = {}

    async def on_chat_model_start(
        self, serialized: Any, messages: Any, *, run_id: uuid.UUID, **kwargs: Any
    ) -> None:
        self.usage.model_calls += 1
        self._roles[run_id] = _role(kwargs.get("metadata"))

    async def on_llm_start(
        self, serialized: Any, prompts: Any, *, run_id: uuid.UUID, **kwargs: Any
    ) -> None:
        self.usage.model_calls += 1
        self._roles[run_id] = _role(kwargs.get("metadata"))

    async def on_llm_end(self, response: LLMResult, *, run_id: uuid.UUID, **kwargs: Any) -> None:
        role = self._roles.pop(run_id, DEFAULT_ROLE)
        for generations in response.generations:
            for generation in generations:
                reported = getattr(getattr(generation, "message", None), "usage_metadata", None)
                if reported:
                    self.usage.add(
                        role,
                        self.prices,
                        int(reported.get("input_tokens", 0)),
                        int(reported.get("output_tokens", 0)),
                    )

    async def on_llm_error(self, error: BaseException, *, run_id: uuid.UUID, **kwargs: Any) -> None:
        self._roles.pop(run_id, None)

    async def on_chain_start(
        self, serialized: Any, inputs: Any, *, run_id: uuid.UUID, **kwargs: Any
    ) -> None:
        name, metadata = kwargs.get("name"), kwargs.get("metadata") or {}
        if name == OFFLINE_STRUCTURED:
            # The stand-in's structured answer: a model call, its tokens estimated like its chat's.
            role = _role(metadata)
            self.usage.model_calls += 1
            self.usage.add(role, self.prices, estimated_tokens(_chars(inputs)), 0)
            self._roles[run_id] = role
        elif name is not None and name == metadata.get("langgraph_node"):
            self.usage.nodes[name] += 1

    async def on_chain_end(self, outputs: Any, *, run_id: uuid.UUID, **kwargs: Any) -> None:
        role = self._roles.pop(run_id, None)
        if role is not None:
            self.usage.add(role, self.prices, 0, estimated_tokens(_chars(outputs)))

    async def on_tool_error(self, error: BaseException, **kwargs: Any) -> None:
        self.usage.tool_errors += 1

    async def on_tool_end(self, output: Any, **kwargs: Any) -> None:
        # ToolNode turns a handled exception into an error message without an on_tool_error.
        if isinstance(output, ToolMessage) and output.status == "error":
            self.usage.tool_errors += 1

    async def on_tool_start(self, serialized: Any, input_str: str, **kwargs: Any) -> None:
        self.usage.tool_calls += 1
        if kwargs.get("name") == SUBAGENT_TOOL or (serialized or {}).get("name") == SUBAGENT_TOOL:
            self.usage.subagents += 1


def _role(metadata: Mapping[str, Any] | None) -> str:
    return str((metadata or {}).get(ROLE_KEY) or DEFAULT_ROLE)


def _chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, BaseMessage):
        return len(str(value.content))
    if isinstance(value, PromptValue):
        return _chars(value.to_messages())
    if isinstance(value, list | tuple):
        return sum(_chars(v) for v in value)
    if isinstance(value, dict):
        return sum(_chars(v) for v in value.values())
    dump = getattr(value, "model_dump_json", None)
    return len(dump()) if callable(dump) else len(str(value))


_meter: ContextVar[UsageMeter | None] = ContextVar("cairn_usage_meter", default=None)
register_configure_hook(_meter, inheritable=True)


@contextmanager
def metered(meter: UsageMeter) -> Iterator[None]:
    """Every model call made inside (in this task and the tasks it starts) counts in `meter`."""
    reset = _meter.set(meter)
    try:
        yield
    finally:
        _meter.reset(reset)


@dataclass(frozen=True)
class Budget:
    tokens: int
    """Per user and calendar month (UTC); 0: none."""
    cost: float
    """The same in money; 0: none."""

    @property
    def limited(self) -> bool:
        return self.tokens > 0 or self.cost > 0


@dataclass(frozen=True)
class MonthUsage:
    tokens: int
    cost: float
    runs: int
    reserved_tokens: int
    reserved_cost: float


def team_budget(value: Any) -> Budget:
    """The TEAM_BUDGET setting as a Budget (missing, null or malformed parts: no limit)."""
    found = value if isinstance(value, dict) else {}
    tokens, cost = found.get("tokens"), found.get("cost")
    return Budget(
        tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0 else 0,
        float(cost)
        if isinstance(cost, int | float) and not isinstance(cost, bool) and cost > 0
        else 0.0,
    )


class OverBudget(Exception):
    """A run refused before it started: the user's monthly budget would be exceeded."""


class TeamOverBudget(OverBudget):
    """A team conversation's run refused before it started: its team's monthly budget (its
    managers' setting) would be exceeded."""


@dataclass(frozen=True)
class Admission:
    run_id: uuid.UUID
    reserved_tokens: int
    reserved_cost: float


_MONTH = "date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
_LIVE = f"status = 'running' AND created_at > now() - make_interval(secs => {RESERVATION_TTL_S})"
_MONTH_SUMS = (
    "SELECT coalesce(sum(input_tokens + output_tokens), 0)::bigint AS tokens,"  # noqa: S608
    " coalesce(sum(cost), 0)::float8 AS cost, count(*) AS runs,"
    f" coalesce(sum(reserved_tokens) FILTER (WHERE {_LIVE}), 0)::bigint AS reserved_tokens,"
    f" coalesce(sum(reserved_cost) FILTER (WHERE {_LIVE}), 0)::float8 AS reserved_cost"
    f" FROM cairn_usage WHERE created_at >= {_MONTH}"
)
_MONTH_USAGE = _MONTH_SUMS + " AND user_id = %(user)s"
_TEAM_MONTH_USAGE = _MONTH_SUMS + " AND workspace_id = %(ws)s"
"""Every run of the team's conversations this month, whoever ran it (cairn_usage.workspace_id)."""
_LOCK_MONTH = (
    "INSERT INTO cairn_usage_months (user_id, month) "  # noqa: S608 (constants only)
    f"VALUES (%(user)s, ({_MONTH})::date) "
    "ON CONFLICT (user_id, month) DO UPDATE SET user_id = EXCLUDED.user_id"
)
"""Takes the user's row for this month, locked to the end of the transaction: two workers
admitting runs of one user do it one after the other."""
_LOCK_TEAM_MONTH = (
    "INSERT INTO cairn_workspace_usage_months (workspace_id, month) "  # noqa: S608 (constants)
    f"VALUES (%(ws)s, ({_MONTH})::date) "
    "ON CONFLICT (workspace_id, month) DO UPDATE SET workspace_id = EXCLUDED.workspace_id"
)
"""The same for the team's row, always taken after the user's: two workers admitting runs of
one team (of one user or several) take the rows in one order and cannot deadlock."""
_TEAM_BUDGET = "SELECT settings -> %(key)s AS budget FROM cairn_workspaces WHERE id = %(ws)s"
_ESTIMATE = (
    "SELECT percentile_cont(0.95) WITHIN GROUP (ORDER BY tokens) AS tokens,"
    " percentile_cont(0.95) WITHIN GROUP (ORDER BY cost) AS cost FROM ("
    " SELECT input_tokens + output_tokens AS tokens, cost FROM cairn_usage"
    " WHERE agent = %(agent)s AND status IN ('done', 'paused')"
    " ORDER BY created_at DESC LIMIT %(window)s) recent"
)

_STEP_CALLS = (
    "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY calls) AS calls FROM ("
    " SELECT coalesce((nodes->>%(inner)s)::float8, 0) / (nodes->>%(step)s)::float8 AS calls"
    " FROM cairn_usage WHERE agent = %(agent)s AND status IN ('done', 'paused')"
    " AND coalesce((nodes->>%(step)s)::int, 0) > 0"
    " ORDER BY created_at DESC LIMIT %(window)s) recent"
)


_PER_CALL = (
    "SELECT sum(tokens)::float8 / nullif(sum(calls), 0) AS tokens,"
    " sum(cost) / nullif(sum(calls), 0) AS cost FROM ("
    " SELECT input_tokens + output_tokens AS tokens, cost, model_calls AS calls FROM cairn_usage"
    " WHERE agent = %(agent)s AND status IN ('done', 'paused') AND model_calls > 0"
    " ORDER BY created_at DESC LIMIT %(window)s) recent"
)


class UsageLedger:
    """The cairn_usage table: a row per run, reserved against the user's monthly budget when
    the run starts and settled with what it used when it ends."""

    def __init__(
        self, pool: Pool, *, budget: Budget, prices: Prices, default_estimate: int
    ) -> None:
        self.pool = pool
        self.budget = budget
        self.prices = prices
        self.default_estimate = default_estimate

    @classmethod
    def from_settings(cls, pool: Pool, settings: Settings) -> UsageLedger:
        return cls(
            pool,
            budget=Budget(settings.monthly_token_budget, settings.monthly_cost_budget),
            prices={str(role): pair for role, pair in settings.model_prices.items()},
            default_estimate=settings.run_token_estimate,
        )

    def meter(self) -> UsageMeter:
        return UsageMeter(self.prices)

    async def estimate(self, agent: str) -> tuple[int, float]:
        """What a run of `agent` is expected to use: the 95th percentile of its recent runs,
        or the configured guess before any were measured."""
        async with self.pool.connection() as conn:
            return await self._estimate(conn, agent)

    async def _estimate(self, conn: AsyncConnection[Any], agent: str) -> tuple[int, float]:
        cur = await conn.execute(_ESTIMATE, {"agent": agent, "window": ESTIMATE_WINDOW})
        row = await cur.fetchone()
        if row is None or row["tokens"] is None:
            price = max((max(pair) for pair in self.prices.values()), default=0.0)
            return self.default_estimate, self.default_estimate * price / 1000
        return int(row["tokens"]), float(row["cost"])

    async def admit(
        self,
        *,
        user_id: str,
        thread_id: str,
        agent: str,
        budgeted: bool = True,
        workspace_id: str | None = None,
    ) -> Admission:
        """Record a run about to start, its expected use reserved against the user's budget
        and, in a team's conversation (`workspace_id`), against the team's (TEAM_BUDGET);
        OverBudget (TeamOverBudget) when that would exceed either. Atomic across workers: the
        user's month row, then the team's, is locked while its use is summed and the
        reservation written. Not `budgeted` (a run continued after its worker died): recorded,
        never refused."""
        run_id = uuid.uuid4()
        args = {"user": user_id, "thread": thread_id, "agent": agent, "run": run_id}
        args |= {"ws": workspace_id, "key": TEAM_BUDGET}
        async with self.pool.connection() as conn, conn.transaction():
            team = Budget(0, 0.0)
            if budgeted and workspace_id is not None:
                cur = await conn.execute(_TEAM_BUDGET, args)
                team = team_budget((await cur.fetchone() or {}).get("budget"))
            mine = budgeted and self.budget.limited
            checked = mine or team.limited
            tokens, cost = await self._estimate(conn, agent) if checked else (0, 0.0)
            if mine:
                await conn.execute(_LOCK_MONTH, args)
                cur = await conn.execute(_MONTH_USAGE, args)
                self._check(MonthUsage(**(await cur.fetchone() or {})), tokens, cost)
            if team.limited:
                await conn.execute(_LOCK_TEAM_MONTH, args)
                cur = await conn.execute(_TEAM_MONTH_USAGE, args)
                _check_team(team, MonthUsage(**(await cur.fetchone() or {})), tokens, cost)
            await conn.execute(
                "INSERT INTO cairn_usage (run_id, user_id, thread_id, agent, workspace_id,"
                " reserved_tokens, reserved_cost) VALUES (%(run)s, %(user)s, %(thread)s,"
                " %(agent)s, %(ws)s, %(tokens)s, %(cost)s)",
                args | {"tokens": tokens, "cost": cost},
            )
        return Admission(run_id, tokens, cost)

    async def per_model_call(self, agent: str) -> tuple[float, float] | None:
        """Tokens and cost per model call over the agent's recent runs (None before any run
        reported tokens): what an estimate in model calls comes to."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(_PER_CALL, {"agent": agent, "window": ESTIMATE_WINDOW})
            row = await cur.fetchone()
        if row is None or not row["tokens"]:
            return None
        return float(row["tokens"]), float(row["cost"] or 0.0)

    async def step_model_calls(self, agent: str, *, step: str, inner: str) -> float | None:
        """The median of `inner` node runs (one model call each) per run of `step` over the
        agent's recent finished runs; None before any of them ran a step."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                _STEP_CALLS,
                {"agent": agent, "step": step, "inner": inner, "window": ESTIMATE_WINDOW},
            )
            row = await cur.fetchone()
        return float(row["calls"]) if row is not None and row["calls"] is not None else None

    def _check(self, month: MonthUsage, tokens: int, cost: float) -> None:
        committed_tokens = month.tokens + month.reserved_tokens
        committed_cost = month.cost + month.reserved_cost
        if self.budget.tokens and committed_tokens + tokens > self.budget.tokens:
            msg = over_budget(f"{month.tokens:,} of your {self.budget.tokens:,} tokens")
            raise OverBudget(msg)
        if self.budget.cost and committed_cost + cost > self.budget.cost:
            msg = over_budget(f"{money(month.cost)} of your {money(self.budget.cost)}")
            raise OverBudget(msg)

    async def settle(
        self, admission: Admission, usage: RunUsage, *, status: str, wall_s: float
    ) -> None:
        """The run ended: what it used replaces its reservation."""
        async with self.pool.connection() as conn:
            await conn.execute(
                "UPDATE cairn_usage SET status = %(status)s, model_calls = %(calls)s,"
                " input_tokens = %(input)s, output_tokens = %(output)s, tool_calls = %(tools)s,"
                " subagents = %(subagents)s, nodes = %(nodes)s, roles = %(roles)s, cost = %(cost)s,"
                " wall_s = %(wall)s, reserved_tokens = 0, reserved_cost = 0,"
                " finished_at = now() WHERE run_id = %(run)s",
                {
                    "run": admission.run_id,
                    "status": status,
                    "calls": usage.model_calls,
                    "input": usage.input_tokens,
                    "output": usage.output_tokens,
                    "tools": usage.tool_calls,
                    "subagents": usage.subagents,
                    "nodes": Jsonb(dict(usage.nodes)),
                    "roles": Jsonb(usage.roles),
                    "cost": usage.cost,
                    "wall": wall_s,
                },
            )

    async def month(self, user_id: str) -> MonthUsage:
        """The user's use this calendar month (UTC), settled and reserved."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(_MONTH_USAGE, {"user": user_id})
            return MonthUsage(**(await cur.fetchone() or {}))

    async def team_month(self, workspace_id: str) -> MonthUsage:
        return await team_month(self.pool, workspace_id)


async def team_month(pool: Pool, workspace_id: str) -> MonthUsage:
    """The use of the team's conversations this calendar month (UTC), settled and reserved,
    whoever ran them: what its TEAM_BUDGET is checked against."""
    async with pool.connection() as conn:
        cur = await conn.execute(_TEAM_MONTH_USAGE, {"ws": workspace_id})
        return MonthUsage(**(await cur.fetchone() or {}))


def _check_team(budget: Budget, month: MonthUsage, tokens: int, cost: float) -> None:
    if budget.tokens and month.tokens + month.reserved_tokens + tokens > budget.tokens:
        msg = team_over_budget(f"{month.tokens:,} of its {budget.tokens:,} tokens")
        raise TeamOverBudget(msg)
    if budget.cost and month.cost + month.reserved_cost + cost > budget.cost:
        msg = team_over_budget(f"{money(month.cost)} of its {money(budget.cost)}")
        raise TeamOverBudget(msg)


def _renewal() -> datetime:
    now = datetime.now(UTC)
    return datetime(now.year + now.month // 12, now.month % 12 + 1, 1, tzinfo=UTC)


def over_budget(spent: str) -> str:
    return (
        f"Not started: this request could take you past this month's usage budget (you have "
        f"used {spent}). The budget renews on {_renewal():%B %-d} (UTC); the operator can "
        "raise it."
    )


def team_over_budget(spent: str) -> str:
    return (
        "Not started: this request could take this conversation past your team's monthly "
        f"budget, set by its admins (the team has used {spent}). The budget renews on "
        f"{_renewal():%B %-d} (UTC); a team admin can raise it."
    )
