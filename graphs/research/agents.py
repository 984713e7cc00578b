"""The deep agents of a research run: the orchestrator (create_deep_agent) and its budgeted research subagent."""

from __future__ import annotations

import asyncio
import logging
import re
from collections import defaultdict
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

from deepagents import create_deep_agent
from deepagents.middleware.filesystem import FilesystemMiddleware
from deepagents.middleware.subagents import CompiledSubAgent
from langchain.agents import create_agent
from langchain.agents.middleware import (
    AgentMiddleware,
    ModelCallLimitMiddleware,
    ToolCallLimitMiddleware,
)
from langchain.agents.middleware.types import hook_config
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langgraph.runtime import get_runtime

from graphs.core.context import Context
from graphs.core.slots import PgSlots
from graphs.memory.policy import detect_secret, has_injection_marker
from graphs.research.files import orchestrator_backend, researcher_backend
from graphs.research.prompts import ORCHESTRATOR_PROMPT, RESEARCHER_PROMPT
from graphs.research.state import OrchestratorState, Usage

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Collection

    from langchain_core.language_models import BaseChatModel
    from langchain_core.tools import BaseTool
    from langgraph.graph.state import CompiledStateGraph

    from graphs.core.settings import Settings

log = logging.getLogger("cairn.research")

RESEARCHER = "researcher"
APPROVED_NOTES = "research_approved_notes"
"""Config key set by the research node: the notes slugs of the todos approved for this round."""
MAX_TASK_CHARS = 2000
ORCHESTRATOR_MODEL_CALLS = 40
"""Model calls of the orchestrator in one research round."""
ORCHESTRATOR_TASKS = 16
"""Research subagents one round may start: two per topic of the largest plan (8 topics)."""
ORCHESTRATOR_TOOL_CALLS = 60
"""Tool calls of the orchestrator in one research round, subagent tasks included."""
REFUSED = "Refused: "
"""How every task refusal written by code begins; the chat shows such a task as refused."""
_NOTES_IN_TASK = re.compile(r"notes/([a-z0-9][a-z0-9_-]*)\.md")
_UNKNOWN_SUBAGENT = re.compile(r"^We cannot invoke subagent (.{0,80}?) because it does not exist")


def task_refusal(description: str, approved: Collection[str] | None) -> str | None:
    """Why code refuses to run a research task, or None. `approved` None: no approved plan
    (a subagent used on its own), so only the description itself is checked."""
    if not description.strip() or len(description) > MAX_TASK_CHARS:
        return f"the task description is empty or longer than {MAX_TASK_CHARS} characters"
    if has_injection_marker(description) or detect_secret(description) is not None:
        return "the task description holds instruction-like text or a secret"
    if approved is not None:
        match = _NOTES_IN_TASK.search(description)
        if match is None or match[1] not in approved:
            return "it names no approved topic's notes file (notes/<slug>.md from the plan)"
    return None


def refusal_reason(result: str) -> str | None:
    """The reason, when a task's result says code refused to run it; None for a task that ran."""
    if result.startswith(REFUSED):
        return result.removeprefix(REFUSED).strip()
    if match := _UNKNOWN_SUBAGENT.match(result):
        return f"there is no subagent named {match[1]}"
    return None


def _refused(why: str) -> dict[str, Any]:
    log.warning("research task refused: %s", why)
    text = f"{REFUSED}{why}. Nothing was searched or fetched for it."
    return {
        "messages": [AIMessage(text)],
        "usage": [{"agent": RESEARCHER, "tool_calls": 0, "tokens": 0}],
    }


class Slots(Protocol):
    def hold(self, *, user_id: str, thread_id: str) -> AbstractAsyncContextManager[None]:
        """Until a subagent of this user and thread may run, then while it does."""
        ...


class SharedSubagentSlots:
    """Caps research subagents running at once, per thread and per user, across every worker
    (graphs/core/slots.py)."""

    def __init__(self, slots: PgSlots) -> None:
        self.slots = slots

    def hold(self, *, user_id: str, thread_id: str) -> AbstractAsyncContextManager[None]:
        return self.slots.hold([f"research:user:{user_id}", f"research:thread:{thread_id}"])


def shared_slots(store: Any, limit: int, *, lease_s: float = 3600.0) -> Slots | None:
    """Slots in Postgres when the graph runs on the app's Postgres store, else None."""
    pool = getattr(store, "conn", None)
    if pool is None or not hasattr(pool, "connection"):
        return None
    return SharedSubagentSlots(PgSlots(pool, limit=limit, lease_s=lease_s))


class SubagentSlots:
    """Caps research subagents running at once, per thread and per user, in this process
    only (graphs without the app's Postgres: tests, Studio)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._slots: defaultdict[str, asyncio.Semaphore] = defaultdict(
            lambda: asyncio.Semaphore(limit)
        )

    @asynccontextmanager
    async def hold(self, *, user_id: str, thread_id: str) -> AsyncIterator[None]:
        async with self._slots[f"user:{user_id}"], self._slots[f"thread:{thread_id}"]:
            yield


class TokenBudget(AgentMiddleware[Any, Any, Any]):
    """Stops a subagent before a model call once its run has used `max_tokens` tokens."""

    def __init__(self, max_tokens: int) -> None:
        super().__init__()
        self.max_tokens = max_tokens

    @hook_config(can_jump_to=["end"])
    def before_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        used = usage_of(RESEARCHER, list(state.get("messages") or []))["tokens"]
        if used < self.max_tokens:
            return None
        text = (
            f"Token budget reached ({used} of {self.max_tokens}). Stopping here; "
            "whatever is not in the notes is a gap."
        )
        return {"jump_to": "end", "messages": [AIMessage(text)]}


def usage_of(agent: str, messages: list[Any]) -> Usage:
    tool_calls = sum(isinstance(m, ToolMessage) for m in messages)
    tokens = sum(
        int((getattr(m, "usage_metadata", None) or {}).get("total_tokens", 0))
        for m in messages
        if isinstance(m, AIMessage)
    )
    return {"agent": agent, "tool_calls": tool_calls, "tokens": tokens}


def build_researcher(
    model: BaseChatModel,
    tools: list[BaseTool],
    settings: Settings,
    slots: Slots,
) -> CompiledSubAgent:
    """Fresh context, narrow tools (search, fetch, write notes/), budgets and a timeout, in code."""
    middleware: list[Any] = [
        FilesystemMiddleware(
            backend=researcher_backend(),
            tools=["ls", "read_file", "write_file"],
            tool_token_limit_before_evict=None,
        ),
        ToolCallLimitMiddleware(
            run_limit=settings.research_subagent_tool_calls, exit_behavior="end"
        ),
        ModelCallLimitMiddleware(
            run_limit=settings.research_subagent_tool_calls + 2, exit_behavior="end"
        ),
        TokenBudget(settings.research_subagent_tokens),
    ]
    agent: Any = create_agent(
        model,
        tools=tools,
        system_prompt=RESEARCHER_PROMPT,
        middleware=middleware,
        context_schema=Context,
        name=RESEARCHER,
    )
    timeout_s = settings.research_subagent_timeout_s

    async def run_researcher(state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        context = get_runtime(Context).context
        approved = (config.get("configurable") or {}).get(APPROVED_NOTES)
        if (why := task_refusal(_task_text(state), approved)) is not None:
            return _refused(why)
        before = dict(state.get("files") or {})
        async with slots.hold(user_id=context.user_id, thread_id=context.thread_id):
            try:
                async with asyncio.timeout(timeout_s):
                    result = await agent.ainvoke(state, config, context=context)
            except TimeoutError:
                text = f"The research subagent stopped at its {timeout_s:g}s limit; record this topic as a gap."
                return {
                    "messages": [AIMessage(text)],
                    "usage": [{"agent": RESEARCHER, "tool_calls": 0, "tokens": 0}],
                }
        files = result.get("files") or {}
        changed = {path: data for path, data in files.items() if before.get(path) != data}
        return {
            "messages": result["messages"],
            "files": changed,
            "usage": [usage_of(RESEARCHER, result["messages"])],
        }

    return {
        "name": RESEARCHER,
        "description": (
            "Researches one topic with web search and page fetches, writes sourced findings "
            "(claim, exact quote, URL, title, fetch time, fetch-log id) to notes/<slug>.md and "
            "returns a short summary with the notes path."
        ),
        "runnable": RunnableLambda(run_researcher, name=RESEARCHER),
    }


def _task_text(state: dict[str, Any]) -> str:
    """The task description: the subagent's opening message, written by the orchestrator."""
    messages = state.get("messages") or []
    return str(messages[-1].text) if messages else ""


def disabled_general_purpose() -> CompiledSubAgent:
    """Replaces deepagents' default general-purpose subagent, which would get the orchestrator's
    file tools without the researcher's budgets: Research delegates to `researcher` only."""

    async def refuse(state: dict[str, Any]) -> dict[str, Any]:
        text = f"{REFUSED}only the researcher subagent is available in Research."
        return {"messages": [AIMessage(text)]}

    return {
        "name": "general-purpose",
        "description": "Not available in Research. Use the researcher subagent.",
        "runnable": RunnableLambda(refuse, name="general-purpose"),
    }


def orchestrator_limits() -> list[AgentMiddleware[Any, Any, Any]]:
    """Hard bounds on one research round, in code: deepagents lets an orchestrator run 9,999
    steps, so without these only the round's time limit would stop a model that delegates or
    lists files forever."""
    return [
        ModelCallLimitMiddleware(run_limit=ORCHESTRATOR_MODEL_CALLS, exit_behavior="end"),
        ToolCallLimitMiddleware(
            tool_name="task", run_limit=ORCHESTRATOR_TASKS, exit_behavior="continue"
        ),
        ToolCallLimitMiddleware(run_limit=ORCHESTRATOR_TOOL_CALLS, exit_behavior="end"),
    ]


def build_orchestrator(
    model: BaseChatModel, researcher: CompiledSubAgent
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """The orchestrator: write_todos, task (research subagents), file tools over the guarded backend."""
    return create_deep_agent(
        model,
        tools=[],
        system_prompt=ORCHESTRATOR_PROMPT,
        subagents=[researcher, disabled_general_purpose()],
        middleware=orchestrator_limits(),
        backend=orchestrator_backend(),
        state_schema=OrchestratorState,
        context_schema=Context,
        name="research_orchestrator",
    )
