"""Where a turn runs: every message, edit, retry, button answer, memory-page answer and support fork of every agent.

One path for all of them: ownership → run lock → config → stream → view → interrupts →
after-turn hook. Agents differ only through their `AgentSpec` (ui/agents/); what the user
sees differs only through the `Surface` the caller passes (the chat, or a headless one for
HTTP pages). This module imports no Chainlit, so the whole path runs in unit tests with a
scripted model, an in-memory saver and a fake surface.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from langchain_core.messages import AIMessage
from langgraph.errors import GraphRecursionError
from langgraph.types import Command

from auth.ownership import (
    NOT_FOUND,
    InWorkspace,
    OwnedThread,
    ThreadNotFound,
    claim_thread,
    require_owner,
)
from graphs.core import fence, metrics
from graphs.core.context import Context
from graphs.core.errors import is_database_outage
from graphs.core.ratelimit import limited
from graphs.core.runlock import ThreadBusy
from graphs.core.runs import (
    DURABILITY,
    MAX_ATTEMPTS,
    STALE_S,
    EditedMessage,
    RunJournal,
    StrandedRun,
    TeamTooManyRuns,
    TooManyRuns,
)
from graphs.core.timetravel import (
    checkpoint_id,
    latest_checkpoint_id,
    message_fork_point,
    root_checkpoint_id,
)
from graphs.core.usage import (
    Admission,
    OverBudget,
    RunUsage,
    TeamOverBudget,
    UsageMeter,
    metered,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from fastapi import APIRouter
    from langchain_core.runnables import RunnableConfig
    from langgraph.types import Interrupt, StateSnapshot, StreamMode

    from graphs.core.persistence import Pool
    from graphs.core.ratelimit import Bucket
    from graphs.core.settings import Settings
    from graphs.core.tracing import Tracing
    from graphs.core.usage import UsageLedger
    from graphs.memory.jobs import MemoryJobs

log = logging.getLogger("cairn.turns")

RECURSION_NOTICE = (
    "I went round in circles on that one and stopped. Could you rephrase or break the "
    "request into smaller parts?"
)
MODEL_FAILED = "The model did not answer. Your message is saved; press Retry to try again."
ANSWERED = "That question has already been answered."
MALFORMED_ANSWER = "That button's request was malformed and has been ignored."
NEEDS_REVIEWER = (
    "This plan waits for a reviewer of your team: you cannot approve it yourself. It is in "
    "the reviewers' queue; you may still edit or reject it."
)
WAITING_FOR_REVIEWER = (
    "Your team asks for a reviewer's approval of plans: this one is in the reviewers' queue. "
    "The run goes on once a reviewer approves it; you will see who decided and when."
)
UNAVAILABLE = "This conversation's agent is not available on this server."
DATABASE_DOWN = (
    "Cairn could not reach its database just now, so this message was not answered. "
    "It is kept in the conversation: press Retry to send it again."
)
RUN_LOST = (
    "The server working on this conversation stopped, and its run could not be continued. "
    "Nothing it finished is lost; press Retry to continue from there."
)

Status = Literal[
    "done", "paused", "stopped", "failed", "unavailable", "busy", "not_found", "refused"
]
"""`stopped`: the run hit its step (recursion) limit; `refused`: not run, or stopped midway,
because the user's data was wiped or the request was not theirs to make; `unavailable`:
Postgres was away (the user got DATABASE_DOWN with Retry); `busy`: another run of the thread
really is running."""
LoadState = Callable[[], Awaitable["StateSnapshot"]]
Ask = Callable[[str, int], Awaitable[str | None]]
"""Ask the user a question (text, timeout in seconds); their answer, or None."""
StartFrom = Callable[[Any], Awaitable["RunnableConfig"]]
"""Time travel: under the run lock, given the compiled graph, the checkpoint config a run
starts from (a support fork writes it with update_state first)."""


class AnswerRejected(ValueError):
    """An answer that cannot be used (e.g. an edit that fails its checks); shown to the user,
    and the question stays pending."""


class View(Protocol):
    """How one agent shows one run: told about everything the graph streams, in order.

    A view may set `first_token_at` (time.perf_counter()) when its reply starts streaming;
    the runner logs it as the turn's time to first token.
    """

    async def begin(self, load_state: LoadState) -> None: ...
    async def token(self, namespace: tuple[str, ...], token: Any, meta: dict[str, Any]) -> None: ...
    async def update(self, namespace: tuple[str, ...], node: str, delta: Any) -> None: ...
    async def task(self, namespace: tuple[str, ...], event: dict[str, Any]) -> None: ...
    async def end(self, status: Status, load_state: LoadState) -> str | None:
        """Finish the run's display (the reply, closed steps, final status); the reply text."""
        ...


@dataclass(frozen=True)
class InterruptKind:
    """One kind of question a graph pauses on (`interrupt({"kind": name, ...})`)."""

    name: str
    decisions: frozenset[str]
    """The answers a button may send; anything else is refused before the graph sees it.
    How the question looks in the chat is the Chainlit adapter's (ui/chainlit/agents/)."""
    resume_value: Callable[[str, dict[str, Any], Ask], Awaitable[Any]] = field(
        default=lambda decision, _value, _ask: _decision(decision)
    )
    """The Command(resume=...) value for a decision; may ask the user first (AnswerRejected
    keeps the question pending)."""
    describe: Callable[[dict[str, Any]], dict[str, Any]] = field(default=lambda _value: {})
    """The question's details for a caller without the chat (an MCP client): what it is asked
    to answer, and what an edit should contain."""
    reviewable: bool = False
    """A plan a team may require a reviewer to approve (auth/reviews.py): then "approve" is a
    reviewer's decision, not the requester's."""


def last_ai_text(values: dict[str, Any]) -> str | None:
    messages = values.get("messages") or []
    last = messages[-1] if messages else None
    return str(last.text) if isinstance(last, AIMessage) else None


async def _decision(decision: str) -> dict[str, str]:
    return {"decision": decision}


@dataclass(frozen=True)
class Starter:
    """A suggested first message, offered on an empty chat of its agent."""

    label: str
    """A few words on the button."""
    message: str
    """What is sent when it is chosen."""


@dataclass(frozen=True)
class McpTool:
    """How an agent is offered as an MCP tool (ui/mcp_server.py); its scope on access tokens
    is the agent's key, labelled with its profile name."""

    name: str
    title: str
    description: str
    """The tool's description: written for the calling model."""
    summary: str
    """What the tool does, in the server's instructions (after the tool's name)."""
    text_arg: str
    """The name of the argument carrying the message (the graph input comes from it)."""
    temporary: bool = False
    """Offer `temporary` (a new conversation kept out of memory)."""
    pre_approve: Callable[[dict[str, Any], int], str | None] | None = None
    """Offer `pre_approve`: why a pending question (its value, given the token's model-call
    budget) may not be approved at once, or None when it may."""
    pauses: bool = False
    """Its runs pause for approval (the server's instructions say so)."""
    result: Callable[[dict[str, Any], str], dict[str, Any] | None] | None = None
    """Fields a finished run adds to (or replaces in) the tool's result, from the final
    state and the app's public URL; None keeps the plain reply."""


@dataclass(frozen=True)
class AgentSpec:
    """Everything that makes one agent different, declared once (ui/agents/<key>.py)."""

    key: str
    """Stable name stored with each thread (cairn_threads.agent)."""
    profile: str
    """Chainlit chat profile name shown to users."""
    description: str
    """What the agent does, in a sentence: on the profile list and the empty chat's welcome."""
    build: Callable[..., Any]
    """build_graph(*, checkpointer, store, model=None)."""
    inputs: Callable[[str, str], dict[str, Any]]
    """The graph input for a user's message (text, message id)."""
    interrupts: tuple[InterruptKind, ...] = ()
    stream_modes: tuple[StreamMode, ...] = ("updates",)
    """What the view needs besides `updates` (which the runner always takes, for interrupts)."""
    subgraphs: bool = False
    """Stream the events of subgraphs too (namespaced); only a view that reads them asks, as
    each costs the runner a dispatch."""
    recursion_limit: Callable[[], int] = lambda: 25
    recursion_notice: str = RECURSION_NOTICE
    after_turn: Callable[[Services | None, Context], Awaitable[None]] | None = None
    """Run off the reply's path after a finished or paused run (given the runner's services)."""
    memory_jobs: bool = False
    """Its conversations feed long-term memory: after a finished or paused run with memory on,
    the thread's debounced memory job is pushed back, and the job reads the thread's messages
    from this agent's graph (ui/runtime.memory_loader)."""
    memory_prefetch: bool = False
    """Start embedding the message for recall while ownership and the checkpoint load."""
    order: int = 100
    """Place in the profile list (lowest first; the first is the default)."""
    reply_text: Callable[[dict[str, Any]], str | None] = field(
        default=lambda values: last_ai_text(values)
    )
    """The reply in a finished run's state, for runs nobody watched live."""
    mcp: McpTool | None = None
    """The agent as an MCP tool (and a scope on access tokens); None: chat only."""
    routes: Callable[[Settings], APIRouter] | None = None
    """Extra HTTP routes the agent's pages need, mounted at start-up."""
    starters: tuple[Starter, ...] = ()
    """Suggested first messages, shown on the empty chat (two or three that work offline)."""
    signals: Callable[[dict[str, Any], RunUsage], Mapping[str, float]] | None = None
    """Quality figures of a finished run for /metrics (cairn_run_signals), from its final
    state and what it used; read only for agents that declare it (one state read a run)."""
    step_nodes: tuple[str, str] | None = None
    """(its step node, the inner node that makes one model call): each run's context carries
    the measured model calls per step (Context.step_model_calls) for its cost estimate."""

    def interrupt_kind(self, value: Any) -> InterruptKind | None:
        name = value.get("kind") if isinstance(value, dict) else None
        return next((k for k in self.interrupts if k.name == name), None)


class Services(Protocol):
    """What the runner hands after-turn work: the worker's memory jobs, if it runs them."""

    @property
    def memory_jobs(self) -> MemoryJobs | None: ...


class Surface(Protocol):
    """Where a run's messages go: the chat session, or nowhere visible (an HTTP page)."""

    def view(self, spec: AgentSpec, context: Context) -> View:
        """A fresh view of one run of the agent."""
        ...

    async def restore(self, spec: AgentSpec, state: StateSnapshot) -> None:
        """Show a reopened conversation's panels (task list, final status) from its state."""
        ...

    async def notice(self, text: str) -> None: ...
    async def refuse(self, text: str) -> None: ...
    async def usage(self, usage: RunUsage) -> None:
        """What the run used (tokens, estimated cost), after its reply; only called when the
        runner records usage."""
        ...

    async def failed(self, text: str, *, thread_id: str, message_id: str | None = None) -> None:
        """An error with a Retry button: it resumes the thread from its last checkpoint, or,
        given the message it failed on, sends that message again if the graph never got it."""
        ...

    async def show_interrupt(
        self, kind: InterruptKind | None, interrupt: Any, thread_id: str
    ) -> None: ...
    async def clear_prompt(self, interrupt_id: str) -> None: ...
    def running(self) -> AbstractAsyncContextManager[None]:
        """Around a run the surface did not start itself (button answers): busy, then idle."""
        ...


class ReviewGate(Protocol):
    """Four-eyes approval of a team's plans (auth/reviews.Reviews)."""

    async def required(self, workspace_id: str | None, agent: str) -> bool: ...
    async def after_run(
        self,
        *,
        workspace_id: str | None,
        thread_id: str,
        agent: str,
        requester_id: str,
        waiting: dict[str, dict[str, Any]],
    ) -> bool: ...


class ForkPoints(Protocol):
    """Which checkpoint each user message was sent on (graphs/core/timetravel.py)."""

    async def record(self, thread_id: str, message_id: str, checkpoint: str | None) -> None:
        """Record the checkpoint a message is sent on (None: the thread's head now)."""
        ...

    async def point(self, thread_id: str, message_id: str) -> tuple[bool, str | None]: ...


class RunLocks(Protocol):
    def hold(self, thread_id: str) -> AbstractAsyncContextManager[None]: ...

    def lost(self, thread_id: str) -> bool:
        """The held run is being cancelled because its lock went to another run."""
        ...


class Threads(Protocol):
    """Thread ownership (auth/ownership.py on Postgres; tests may keep it in memory)."""

    async def claim(
        self,
        *,
        thread_id: str,
        user_id: str,
        agent: str,
        temporary: bool,
        workspace: InWorkspace | None = None,
    ) -> OwnedThread:
        """`workspace`: where a new thread goes instead of the user's active one."""
        ...

    async def require(self, *, thread_id: str, user_id: str) -> OwnedThread: ...


@dataclass(frozen=True)
class PostgresThreads:
    pool: Pool

    async def claim(
        self,
        *,
        thread_id: str,
        user_id: str,
        agent: str,
        temporary: bool,
        workspace: InWorkspace | None = None,
    ) -> OwnedThread:
        return await claim_thread(
            self.pool,
            thread_id=thread_id,
            user_id=user_id,
            agent=agent,
            temporary=temporary,
            workspace=workspace,
        )

    async def require(self, *, thread_id: str, user_id: str) -> OwnedThread:
        return await require_owner(self.pool, thread_id=thread_id, user_id=user_id)


@dataclass
class RunOutcome:
    status: Status
    interrupts: list[Interrupt] = field(default_factory=list)
    reply: str | None = None
    owned: OwnedThread | None = None
    usage: RunUsage | None = None
    """What the run used, when the runner records usage."""


@dataclass
class _Run:
    """One run as it goes through the runner's stages (ui.runner.Runner._run_fenced)."""

    spec: AgentSpec
    graph: Any
    context: Context
    owned: OwnedThread
    surface: Surface
    inputs: dict[str, Any] | Command[Any] | None
    message_id: str | None
    admission: Admission | None = None
    meter: UsageMeter | None = None
    outcome: RunOutcome | None = None


class Runner:
    """Runs every turn of every agent; one per worker process."""

    def __init__(
        self,
        *,
        agents: Sequence[AgentSpec],
        graphs: Mapping[str, Any],
        threads: Threads,
        locks: RunLocks,
        services: Services | None = None,
        journal: RunJournal | None = None,
        stale_s: float = STALE_S,
        tracing: Tracing | None = None,
        fork_points: ForkPoints | None = None,
        usage: UsageLedger | None = None,
        model_calls: Bucket | None = None,
        max_runs_per_user: int = 0,
        reviews: ReviewGate | None = None,
    ) -> None:
        if not agents:
            msg = "the runner needs at least one agent"
            raise ValueError(msg)
        self.agents = tuple(agents)
        self.graphs = graphs
        self.threads = threads
        self.locks = locks
        self.services = services
        """Handed to after-turn hooks; its `memory_jobs` takes the memory job of an agent that
        learns from its conversations (AgentSpec.memory_jobs)."""
        self.journal = journal
        """Runs in progress in Postgres, so a dead worker's runs are resumed (None: not kept)."""
        self.stale_s = stale_s
        """A run whose worker has not beaten for this long is resumed by this one."""
        self.tracing = tracing
        """Trace metadata for each run (the user hashed), when tracing is on."""
        self.fork_points = fork_points
        """Each user message's checkpoint, so editing it forks from there (None: not kept)."""
        self.usage = usage
        """Every run's model use in Postgres, and the monthly budget it is admitted against
        (None: neither)."""
        self.model_calls = model_calls
        """The provider key's token bucket, taken before each model call of a run (None: not
        limited)."""
        self.max_runs_per_user = max_runs_per_user
        """Runs one user may have going at once across workers, counted in the run journal
        (0: no limit)."""
        self.reviews = reviews
        """Plans of teams that want a reviewer wait for one (None: the requester decides)."""
        self._background: set[asyncio.Task[None]] = set()

    def spec_for_profile(self, profile: str | None) -> AgentSpec:
        return next((a for a in self.agents if a.profile == profile), self.agents[0])

    def spec(self, key: str) -> AgentSpec | None:
        return next((a for a in self.agents if a.key == key), None)

    # -- the entry points -------------------------------------------------------------

    async def message(
        self,
        surface: Surface,
        *,
        user_id: str,
        thread_id: str,
        profile: str | None,
        text: str,
        message_id: str,
        temporary: bool,
        workspace: InWorkspace | None = None,
    ) -> RunOutcome:
        """A user's message: the thread is claimed (or checked) and the agent it keeps runs.
        A new thread goes to the user's active workspace, or to `workspace` when given (a run
        started with an access token acts in the token's workspace).

        Postgres away (at any point of the run): the user is told, with a Retry that sends
        the message again, and the outcome is `unavailable`; the message is not dropped."""
        try:
            return await self._message(
                surface,
                user_id=user_id,
                thread_id=thread_id,
                profile=profile,
                text=text,
                message_id=message_id,
                temporary=temporary,
                workspace=workspace,
            )
        except Exception as exc:
            if not is_database_outage(exc):
                raise
            log.warning("message on thread %s failed: database unavailable (%s)", thread_id, exc)
            await surface.failed(DATABASE_DOWN, thread_id=thread_id, message_id=message_id)
            return RunOutcome("unavailable")

    async def _message(
        self,
        surface: Surface,
        *,
        user_id: str,
        thread_id: str,
        profile: str | None,
        text: str,
        message_id: str,
        temporary: bool,
        workspace: InWorkspace | None = None,
    ) -> RunOutcome:
        wanted = self.spec_for_profile(profile)
        try:
            # A thread keeps the agent it was started with, whatever profile the client reports.
            owned = await self.threads.claim(
                thread_id=thread_id,
                user_id=user_id,
                agent=wanted.key,
                temporary=temporary,
                workspace=workspace,
            )
        except ThreadNotFound:
            await surface.refuse(NOT_FOUND)
            return RunOutcome("not_found")
        spec = self.spec(owned.agent)
        if spec is None:
            await surface.refuse(UNAVAILABLE)
            return RunOutcome("refused", owned=owned)
        context = _context(owned, user_id, thread_id)
        return await self._run(
            surface, spec, spec.inputs(text, message_id), context, owned, message_id=message_id
        )

    async def resend(
        self,
        surface: Surface,
        *,
        user_id: str,
        thread_id: str,
        profile: str | None,
        text: str,
        message_id: str,
        temporary: bool,
    ) -> RunOutcome:
        """Retry of a message that failed while Postgres was away: resumed from the checkpoint
        when the graph already has the message, otherwise sent again as it was."""
        try:
            owned = await self.threads.require(thread_id=thread_id, user_id=user_id)
        except ThreadNotFound:
            owned = None  # never claimed: the outage came first
        except Exception as exc:
            if not is_database_outage(exc):
                raise
            await surface.failed(DATABASE_DOWN, thread_id=thread_id, message_id=message_id)
            return RunOutcome("unavailable")
        spec = self.spec(owned.agent) if owned is not None else None
        graph = self.graphs.get(spec.key) if spec is not None else None
        if graph is not None and spec is not None:
            values = (await graph.aget_state(_config(thread_id, spec))).values
            if any(getattr(m, "id", None) == message_id for m in values.get("messages") or []):
                return await self.retry(surface, user_id=user_id, thread_id=thread_id)
        return await self.message(
            surface,
            user_id=user_id,
            thread_id=thread_id,
            profile=profile,
            text=text,
            message_id=message_id,
            temporary=temporary,
        )

    async def retry(self, surface: Surface, *, user_id: str, thread_id: str) -> RunOutcome:
        """Resume the thread from its last checkpoint: the failed node runs again."""
        checked = await self._owned(surface, user_id, thread_id)
        if isinstance(checked, RunOutcome):
            return checked
        spec, owned = checked
        return await self._run(surface, spec, None, _context(owned, user_id, thread_id), owned)

    async def answer(
        self,
        surface: Surface,
        *,
        user_id: str,
        thread_id: str,
        interrupt_id: str,
        decision: str,
        ask: Ask | None = None,
        reviewed_by: str | None = None,
    ) -> RunOutcome:
        """A button answering a paused run, checked against the thread, the pause and its kind.
        `reviewed_by`: a reviewer's decision taken from the queue (auth/reviews.py), which
        alone may approve a plan its team wants reviewed."""
        checked = await self._owned(surface, user_id, thread_id)
        if isinstance(checked, RunOutcome):
            return checked
        spec, owned = checked
        pending = await self._pending(spec, thread_id, interrupt_id)
        if pending is None:
            await surface.refuse(ANSWERED)
            return RunOutcome("refused", owned=owned)
        kind = spec.interrupt_kind(pending.value)
        decisions = kind.decisions if kind is not None else frozenset({"confirm", "reject"})
        if decision not in decisions:
            log.warning("refused: decision %r for a %s question", decision[:40], spec.key)
            await surface.refuse(MALFORMED_ANSWER)
            return RunOutcome("refused", owned=owned)
        if await self._needs_reviewer(kind, decision, owned, reviewed_by):
            await surface.refuse(NEEDS_REVIEWER)
            return RunOutcome("paused", [pending], owned=owned)
        value = pending.value if isinstance(pending.value, dict) else {}
        asked: list[str] = []

        async def asking(question: str, seconds: int) -> str | None:
            # The buttons go while the user types (a second press would race this answer,
            # and the pressed one would spin); they come back if the answer is refused.
            asked.append(question)
            await surface.clear_prompt(interrupt_id)
            return await (ask or _no_answer)(question, seconds)

        try:
            resume = (
                await kind.resume_value(decision, value, asking)
                if kind is not None
                else {"decision": decision}
            )
        except AnswerRejected as exc:  # e.g. an Edit whose text never came: still waiting
            await surface.refuse(str(exc))
            if asked:
                await surface.show_interrupt(kind, pending, thread_id)
            return RunOutcome("paused", [pending], owned=owned)
        command: Command[Any] = Command(resume={interrupt_id: resume})
        context = _context(owned, user_id, thread_id)
        async with surface.running():
            return await self._run(surface, spec, command, context, owned, answering=interrupt_id)

    # -- time travel ------------------------------------------------------------------

    async def edit(
        self,
        surface: Surface,
        *,
        user_id: str,
        thread_id: str,
        message_id: str,
        text: str,
        on_fork: Callable[[], Awaitable[None]] | None = None,
    ) -> RunOutcome:
        """An earlier message of the user's, edited and sent again: the thread forks from the
        checkpoint that message was sent on, so the model never sees what followed it (the old
        branch stays in the thread's history).

        One durable unit: under the run lock the edit is recorded with the run (the fork and
        the new text) before `on_fork` changes the conversation, so a worker dying at any point
        leaves either the old branch exactly or a run a live worker finishes (resume_stranded).
        """
        checked = await self._owned(surface, user_id, thread_id)
        if isinstance(checked, RunOutcome):
            return checked
        spec, owned = checked
        graph = self.graphs[spec.key]
        found, point = (
            await self.fork_points.point(thread_id, message_id)
            if self.fork_points is not None
            else (False, None)
        )
        if not found:  # sent before fork points were recorded: look for it in the state
            found, point = await message_fork_point(graph, thread_id, message_id)
        head = await latest_checkpoint_id(graph, thread_id)
        checkpoint = point or await root_checkpoint_id(graph, thread_id)
        if not found or (checkpoint is None and head is not None):
            log.warning("refused: user %s edited unknown message %s", user_id, message_id[:64])
            await surface.refuse(NOT_FOUND)
            return RunOutcome("not_found")
        edit = EditedMessage(message_id=message_id, text=text, checkpoint=checkpoint, head=head)
        context = _context(owned, user_id, thread_id)
        return await self._run_edit(surface, spec, owned, context, edit, on_fork)

    async def _run_edit(
        self,
        surface: Surface,
        spec: AgentSpec,
        owned: OwnedThread,
        context: Context,
        edit: EditedMessage,
        on_fork: Callable[[], Awaitable[None]] | None,
        *,
        budgeted: bool = True,
    ) -> RunOutcome:
        """The edit's fork, run from its checkpoint with the new text (also a dead worker's
        edit whose fork wrote nothing: admitted on that worker, so not budgeted again)."""
        thread_id = context.thread_id

        async def start(graph: Any) -> RunnableConfig:
            # Under the lock: a run that ended meanwhile moved the thread on from what was
            # edited, and the edit would drop it.
            if await latest_checkpoint_id(graph, thread_id) != edit.head:
                raise ThreadBusy
            fork = {"checkpoint_id": edit.checkpoint} if edit.checkpoint else {}  # none: new
            return {"configurable": {"thread_id": thread_id, **fork}}

        inputs = spec.inputs(edit.text, edit.message_id)
        return await self._run(
            surface,
            spec,
            inputs,
            context,
            owned,
            start=start,
            budgeted=budgeted,
            edit=edit,
            on_fork=on_fork,
        )

    async def fork(
        self, surface: Surface, *, owner_id: str, thread_id: str, start: StartFrom
    ) -> RunOutcome:
        """A support fork: `start` writes the forked checkpoint under the run lock, then the run
        resumes from it as the owner's thread, without long-term memory (support never sees
        the owner's memories, and the fork teaches memory nothing)."""
        checked = await self._owned(surface, owner_id, thread_id)
        if isinstance(checked, RunOutcome):
            return checked
        spec, owned = checked
        context = replace(_context(owned, owner_id, thread_id), memory=False)
        return await self._run(surface, spec, None, context, owned, start=start)

    async def reopen(self, surface: Surface, *, user_id: str, thread_id: str) -> RunOutcome:
        """A conversation opened again: its panels come back and a paused run gets its buttons."""
        checked = await self._owned(surface, user_id, thread_id)
        if isinstance(checked, RunOutcome):
            return checked
        spec, owned = checked
        graph = self.graphs.get(spec.key)
        if graph is None:
            return RunOutcome("refused", owned=owned)
        state = await graph.aget_state(_config(thread_id, spec))
        await surface.restore(spec, state)
        if await self.run_lost(thread_id):
            await surface.failed(RUN_LOST, thread_id=thread_id)
        interrupts = list(state.interrupts)
        for interrupt in interrupts:
            await surface.show_interrupt(spec.interrupt_kind(interrupt.value), interrupt, thread_id)
        return RunOutcome("paused" if interrupts else "done", interrupts, owned=owned)

    async def pending(self, *, user_id: str, thread_id: str) -> list[Interrupt]:
        """The thread's pending questions, for its owner (ThreadNotFound for anyone else)."""
        owned = await self.threads.require(thread_id=thread_id, user_id=user_id)
        spec, graph = self.spec(owned.agent), self.graphs.get(owned.agent)
        if spec is None or graph is None:
            return []
        return list((await graph.aget_state(_config(thread_id, spec))).interrupts)

    # -- runs a dead worker left --------------------------------------------------------

    async def stranded(self) -> list[StrandedRun]:
        """Runs whose worker stopped beating, now this worker's to resume (resume_stranded)."""
        return (
            [] if self.journal is None else await self.journal.take_stranded(stale_s=self.stale_s)
        )

    async def resume_stranded(
        self,
        stranded: StrandedRun,
        surface: Surface,
        *,
        on_fork: Callable[[], Awaitable[None]] | None = None,
    ) -> RunOutcome:
        """Resume a dead worker's run from its last checkpoint.

        No completed step runs again (the checkpointer has it); the step in flight may, so
        tools stay read-only or idempotent. A run paused on a question stays paused. An edit
        whose fork wrote nothing yet runs from the fork, `on_fork` first completing the
        conversation's side of it (its worker may have died before or while changing it).
        """
        assert self.journal is not None
        thread_id, user_id = stranded.thread_id, stranded.user_id
        try:
            owned = await self.threads.require(thread_id=thread_id, user_id=user_id)
        except ThreadNotFound:  # deleted or wiped meanwhile: nothing to resume
            await self.journal.forget(thread_id)
            return RunOutcome("not_found")
        spec, graph = self.spec(owned.agent), self.graphs.get(owned.agent)
        if spec is None or graph is None or stranded.attempts > MAX_ATTEMPTS:
            log.error("run on thread %s cannot be continued (agent %s)", thread_id, owned.agent)
            await self.journal.give_up(thread_id)
            metrics.observe_resumed(owned.agent, "given_up")
            await surface.failed(RUN_LOST, thread_id=thread_id)
            return RunOutcome("failed", owned=owned)
        edit = stranded.edit
        if edit is not None and await latest_checkpoint_id(graph, thread_id) == edit.head:
            log.info("carrying out thread %s's edit left by a stopped worker", thread_id)
            context = _context(owned, user_id, thread_id)
            outcome = await self._run_edit(
                surface, spec, owned, context, edit, on_fork, budgeted=False
            )
            return await self._resumed(spec, thread_id, outcome)
        try:
            # Read under the run lock: a live worker that has just taken the run (its row
            # written, its first checkpoint not yet) still shows the question it answers, and
            # the row it runs under would be dropped as "waits for the user".
            async with self.locks.hold(thread_id):
                state = await graph.aget_state(_config(thread_id, spec))
        except ThreadBusy:
            # Its worker is alive after all (it holds the run lock) and will finish it.
            return RunOutcome("busy", owned=owned)
        if not state.next or state.interrupts:
            await self.journal.forget(thread_id)  # it had finished, or waits for the user
            if state.interrupts:
                return RunOutcome("paused", owned=owned)
            # Finished, but its worker may have died before the reply reached the user: the
            # reply goes with the outcome (the stored conversation skips it if it has it).
            return RunOutcome("done", reply=spec.reply_text(state.values), owned=owned)
        log.info("resuming thread %s (%s) left by a stopped worker", thread_id, spec.key)
        context = _context(owned, user_id, thread_id)
        # Admitted when it started: continuing it is never refused for the budget (not mid-run).
        # An edit's fork that wrote its first checkpoint goes on like any run (its worker
        # changed the conversation before that); the row keeps the edit until it ends.
        outcome = await self._run(surface, spec, None, context, owned, budgeted=False, edit=edit)
        return await self._resumed(spec, thread_id, outcome)

    async def _resumed(self, spec: AgentSpec, thread_id: str, outcome: RunOutcome) -> RunOutcome:
        assert self.journal is not None
        metrics.observe_resumed(spec.key, outcome.status)
        if outcome.status == "failed":
            await self.journal.give_up(thread_id)
        # "busy": its worker is alive after all (it holds the run lock) and will finish it.
        return outcome

    async def run_lost(self, thread_id: str) -> bool:
        """A run of this thread was given up after its worker stopped (the user may Retry)."""
        return self.journal is not None and await self.journal.failed_run(thread_id)

    # -- one run --------------------------------------------------------------------

    async def _owned(
        self, surface: Surface, user_id: str, thread_id: str
    ) -> tuple[AgentSpec, OwnedThread] | RunOutcome:
        try:
            owned = await self.threads.require(thread_id=thread_id, user_id=user_id)
        except ThreadNotFound:
            await surface.refuse(NOT_FOUND)
            return RunOutcome("not_found")
        spec = self.spec(owned.agent)
        if spec is None or spec.key not in self.graphs:
            await surface.refuse(UNAVAILABLE)
            return RunOutcome("refused", owned=owned)
        return spec, owned

    async def _pending(self, spec: AgentSpec, thread_id: str, interrupt_id: str) -> Any:
        state = await self.graphs[spec.key].aget_state(_config(thread_id, spec))
        return next((i for i in state.interrupts if i.id == interrupt_id), None)

    async def _run(
        self,
        surface: Surface,
        spec: AgentSpec,
        inputs: dict[str, Any] | Command[Any] | None,
        context: Context,
        owned: OwnedThread,
        *,
        answering: str | None = None,
        start: StartFrom | None = None,
        message_id: str | None = None,
        budgeted: bool = True,
        edit: EditedMessage | None = None,
        on_fork: Callable[[], Awaitable[None]] | None = None,
    ) -> RunOutcome:
        """One run on the thread; a second one while it works is refused (across workers), and
        so is one the user's monthly budget cannot cover (`budgeted`), before it starts.
        An edit's run is journalled with the edit, and `on_fork` (the conversation's side of
        it) runs only once that is committed.

        Everything the run writes (its journal row, checkpoints, memories, fetch log, after-turn
        jobs) carries the authority of the session that asked for it, or of this moment for a
        run the server resumes: an account wipe on any worker refuses the rest of it.
        """
        authority = fence.current()
        if authority is None or authority.user_id != context.user_id:
            authority = fence.Fence.now(context.user_id)
        with fence.acting_for(authority):
            outcome = await self._run_fenced(
                surface,
                spec,
                inputs,
                context,
                owned,
                answering,
                start,
                message_id,
                budgeted,
                edit,
                on_fork,
            )
            await self._queue_reviews(surface, spec, context, owned, outcome)
            return outcome

    async def _needs_reviewer(
        self, kind: InterruptKind | None, decision: str, owned: OwnedThread, reviewer: str | None
    ) -> bool:
        if kind is None or not kind.reviewable or decision != "approve" or reviewer is not None:
            return False
        return self.reviews is not None and await self.reviews.required(
            owned.workspace_id, owned.agent
        )

    async def _queue_reviews(
        self,
        surface: Surface,
        spec: AgentSpec,
        context: Context,
        owned: OwnedThread,
        outcome: RunOutcome,
    ) -> None:
        """A team conversation's plans that want a reviewer go to the queue (and questions
        no longer pending leave it); the requester is told it waits."""
        if self.reviews is None or owned.workspace_id is None:
            return
        if outcome.status not in ("paused", "done", "failed"):
            return
        waiting = {}
        for pending in outcome.interrupts if outcome.status == "paused" else []:
            kind = spec.interrupt_kind(pending.value)
            if kind is not None and kind.reviewable and isinstance(pending.value, dict):
                waiting[pending.id] = kind.describe(pending.value)
        try:
            queued = await self.reviews.after_run(
                workspace_id=owned.workspace_id,
                thread_id=context.thread_id,
                agent=spec.key,
                requester_id=context.user_id,
                waiting=waiting,
            )
        except Exception:
            log.exception("queueing thread %s's plan for review failed", context.thread_id)
            return
        if queued:
            await surface.notice(WAITING_FOR_REVIEWER)

    async def _run_fenced(
        self,
        surface: Surface,
        spec: AgentSpec,
        inputs: dict[str, Any] | Command[Any] | None,
        context: Context,
        owned: OwnedThread,
        answering: str | None,
        start: StartFrom | None,
        message_id: str | None,
        budgeted: bool,
        edit: EditedMessage | None = None,
        on_fork: Callable[[], Awaitable[None]] | None = None,
    ) -> RunOutcome:
        """The run under the thread's lock, its refusals and outages told to the surface, and
        what a finished or paused run leaves behind (usage, questions, background jobs)."""
        graph = self.graphs.get(spec.key)
        if graph is None:
            await surface.refuse(UNAVAILABLE)
            return RunOutcome("refused", owned=owned)
        run = _Run(spec, graph, context, owned, surface, inputs, message_id)
        try:
            async with self.locks.hold(context.thread_id):
                refused = await self._admitted(run, answering, budgeted=budgeted, edit=edit)
                if refused is not None:
                    return refused
                try:
                    refused = await self._started(run, answering, start, on_fork)
                    if refused is not None:
                        return refused
                finally:
                    # However the run ended here, this worker stops beating it: a row left
                    # behind (Postgres away at the end, an error) is resumed by a sweep.
                    if self.journal is not None:
                        self.journal.released(context.thread_id)
        except ThreadBusy as exc:
            metrics.observe_refusal(spec.key, "busy")
            await surface.refuse(str(exc))
            return RunOutcome("busy", owned=owned)
        except fence.WriteRefused as exc:  # wiped before the run could start
            await surface.refuse(str(exc))
            return RunOutcome("refused", owned=owned)
        except Exception as exc:
            if not is_database_outage(exc):
                raise
            log.warning(
                "run on thread %s stopped: database unavailable (%s)", context.thread_id, exc
            )
            if run.outcome is None or run.outcome.status != "unavailable":  # not told yet
                await surface.failed(
                    DATABASE_DOWN, thread_id=context.thread_id, message_id=message_id
                )
            return RunOutcome("unavailable", owned=owned)
        assert run.outcome is not None
        return await self._delivered(run, run.outcome)

    async def _admitted(
        self, run: _Run, answering: str | None, *, budgeted: bool, edit: EditedMessage | None
    ) -> RunOutcome | None:
        """Under the lock: the question still waiting, the budgets' reservation and the run's
        journal row; the refusal when any of them says no (the question stays pending)."""
        spec, context, surface = run.spec, run.context, run.surface
        # Checked again under the lock: two presses of one button, on two workers.
        if (
            answering is not None
            and await self._pending(spec, context.thread_id, answering) is None
        ):
            await surface.refuse(ANSWERED)
            return RunOutcome("refused", owned=run.owned)
        admission = await self._admit(spec, context, budgeted=budgeted)
        if isinstance(admission, str):  # over budget: the question stays pending
            metrics.observe_refusal(spec.key, "budget")
            await surface.refuse(admission)
            return RunOutcome("refused", owned=run.owned)
        run.admission = admission
        refusal = await self._journal_started(spec, context, budgeted=budgeted, edit=edit)
        if refusal is not None:  # the user's (or team's) other runs: this question stays pending
            metrics.observe_refusal(spec.key, "too_many_runs")
            await self._settle(admission, None, "refused", time.perf_counter())
            await surface.refuse(refusal)
            return RunOutcome("refused", owned=run.owned)
        return None

    async def _started(
        self,
        run: _Run,
        answering: str | None,
        start: StartFrom | None,
        on_fork: Callable[[], Awaitable[None]] | None,
    ) -> RunOutcome | None:
        """The admitted run from its starting checkpoint to its end, metered and journalled
        (run.outcome); the refusal when it cannot start (its fork point is gone)."""
        spec, surface, admission = run.spec, run.surface, run.admission
        thread_id = run.context.thread_id
        if answering is not None:
            await surface.clear_prompt(answering)
        run.context = await self._measured(spec, run.context)
        try:
            config = await self._start_config(run.graph, spec, thread_id, start)
        except ThreadBusy:  # an edit overtaken by another run: nothing changes
            await self._settle(admission, None, "refused", time.perf_counter())
            await self._stopped(thread_id)
            raise
        if config is None:
            await self._settle(admission, None, "not_found", time.perf_counter())
            await self._stopped(thread_id)
            await surface.refuse(NOT_FOUND)
            return RunOutcome("not_found", owned=run.owned)
        if run.message_id is not None and self.fork_points is not None:
            # None: the thread's head, which this run (holding the lock) starts from.
            await self.fork_points.record(thread_id, run.message_id, checkpoint_id(config))
        if on_fork is not None:  # the edit is on record: the chat may show it
            await on_fork()
        meter = run.meter = self.usage.meter() if self.usage is not None else None
        started = time.perf_counter()
        # Not in a `finally`: a worker stopped mid-run leaves the row for a live one.
        try:
            with metered(meter) if meter is not None else nullcontext(), limited(self.model_calls):
                run.outcome = await self._stream(
                    surface,
                    spec,
                    run.graph,
                    run.inputs,
                    run.context,
                    config,
                    message_id=run.message_id,
                )
        except asyncio.CancelledError:
            # The user's Stop; a lock lost to another run leaves it the row.
            await self._settle(admission, meter, "cancelled", started)
            if not self.locks.lost(thread_id):
                await self._stopped(thread_id)
            raise
        await self._settle(admission, meter, run.outcome.status, started)
        if self.journal is not None:
            await self._journal_finished(thread_id, run.outcome)
        return None

    async def _delivered(self, run: _Run, outcome: RunOutcome) -> RunOutcome:
        """What a run that ended leaves: its usage shown and observed, its questions asked,
        and (finished or paused) the agent's background jobs."""
        if outcome.status == "unavailable":
            return outcome
        spec, surface, context, meter = run.spec, run.surface, run.context, run.meter
        outcome.owned = run.owned
        if meter is not None:
            outcome.usage = meter.usage
            await surface.usage(meter.usage)
            await self._observe(spec, run.graph, context, outcome.status, meter.usage)
        for interrupt in outcome.interrupts:
            await surface.show_interrupt(
                spec.interrupt_kind(interrupt.value), interrupt, context.thread_id
            )
        if outcome.status in ("done", "paused"):
            if spec.memory_jobs:
                self._in_background(self._schedule_memory_job(context))
            if spec.after_turn is not None:
                self._in_background(spec.after_turn(self.services, context))
        return outcome

    async def _admit(
        self, spec: AgentSpec, context: Context, *, budgeted: bool
    ) -> Admission | str | None:
        """The run's usage row, its expected use reserved against the user's monthly budget and,
        in a team's conversation, the team's (None: usage not recorded); the refusal's text when
        either cannot cover it."""
        if self.usage is None:
            return None
        try:
            return await self.usage.admit(
                user_id=context.user_id,
                thread_id=context.thread_id,
                agent=spec.key,
                budgeted=budgeted,
                workspace_id=context.workspace_id,
            )
        except OverBudget as exc:
            whose = "its team" if isinstance(exc, TeamOverBudget) else "user"
            log.info("%s run refused: %s over the monthly budget", spec.key, whose)
            return str(exc)

    async def _journal_started(
        self,
        spec: AgentSpec,
        context: Context,
        *,
        budgeted: bool,
        edit: EditedMessage | None = None,
    ) -> str | None:
        """The run is recorded as going (for a live worker to resume if this one dies); the
        refusal's text when its user already has `max_runs_per_user` runs going, or its team
        (a team's conversation) the most its admins allow. A run
        continued after its worker died (not `budgeted`) was admitted already: never refused."""
        if self.journal is None:
            return None
        cap = self.max_runs_per_user if budgeted and self.max_runs_per_user > 0 else None
        try:
            await self.journal.started(
                thread_id=context.thread_id,
                user_id=context.user_id,
                agent=spec.key,
                edit=edit,
                cap=cap,
                workspace_id=context.workspace_id if budgeted else None,
            )
        except TooManyRuns as exc:
            whose = "team" if isinstance(exc, TeamTooManyRuns) else "user"
            log.info("%s run refused: its %s has the most runs going", spec.key, whose)
            return str(exc)
        return None

    async def _observe(
        self, spec: AgentSpec, graph: Any, context: Context, status: Status, usage: RunUsage
    ) -> None:
        """A run's cost and quality figures, for /metrics."""
        metrics.observe_run_usage(
            spec.key,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cost=usage.cost,
            model_calls=usage.model_calls,
            tool_calls=usage.tool_calls,
            tool_errors=usage.tool_errors,
        )
        if spec.signals is None or status != "done":
            return
        try:
            state = await graph.aget_state(_config(context.thread_id, spec))
        except Exception as exc:
            if not is_database_outage(exc):
                raise
            log.warning("signals of a %s run not read: %s", spec.key, exc)
            return
        metrics.observe_run_signals(spec.key, spec.signals(state.values, usage))

    async def _measured(self, spec: AgentSpec, context: Context) -> Context:
        """The context with the agent's measured model calls per step, when it has steps."""
        if self.usage is None or spec.step_nodes is None:
            return context
        step, inner = spec.step_nodes
        calls, per_call = await asyncio.gather(
            self.usage.step_model_calls(spec.key, step=step, inner=inner),
            self.usage.per_model_call(spec.key),
        )
        tokens, cost = per_call if per_call is not None else (None, None)
        return replace(context, step_model_calls=calls, call_tokens=tokens, call_cost=cost)

    async def _settle(
        self, admission: Admission | None, meter: UsageMeter | None, status: str, started: float
    ) -> None:
        """What the run used replaces its reservation; Postgres away only loses the figures
        (the reservation lapses by itself)."""
        if self.usage is None or admission is None:
            return
        used = meter.usage if meter is not None else RunUsage()
        try:
            await self.usage.settle(
                admission, used, status=status, wall_s=time.perf_counter() - started
            )
        except Exception as exc:
            if not is_database_outage(exc):
                raise
            log.warning("usage of run %s not recorded: %s", admission.run_id, exc)

    async def _stopped(self, thread_id: str) -> None:
        """The user stopped the run (Chainlit's Stop cancels the chat's task; a worker that
        shuts down never cancels a run, Chainlit ends the process): nothing is left to resume."""
        if self.journal is None:
            return
        try:
            await self.journal.forget(thread_id)
        except Exception as exc:
            if not is_database_outage(exc):
                raise
            log.warning("stopped run of thread %s still recorded: %s", thread_id, exc)

    async def _journal_finished(self, thread_id: str, outcome: RunOutcome) -> None:
        assert self.journal is not None
        try:
            await self.journal.finished(thread_id)
        except Exception as exc:
            # The user was already told Postgres is away; the row is cleared by their Retry.
            if outcome.status != "unavailable" or not is_database_outage(exc):
                raise

    async def _start_config(
        self, graph: Any, spec: AgentSpec, thread_id: str, start: StartFrom | None
    ) -> RunnableConfig | None:
        """The run's config: the thread's head, or the checkpoint `start` forks from (None:
        refused as a missing thread)."""
        config = _config(thread_id, spec)
        if start is None:
            return config
        try:
            forked = await start(graph)
        except ThreadNotFound:
            return None
        configurable = {**forked.get("configurable", {}), "thread_id": thread_id}
        return {**config, "configurable": configurable}

    async def _stream(
        self,
        surface: Surface,
        spec: AgentSpec,
        graph: Any,
        inputs: dict[str, Any] | Command[Any] | None,
        context: Context,
        run_config: RunnableConfig | None = None,
        *,
        message_id: str | None = None,
    ) -> RunOutcome:
        # The thread's head, for reading state: a fork's run starts at `run_config` but its
        # new checkpoints are the head by the time anything reads them.
        config = _config(context.thread_id, spec)
        stream_config: RunnableConfig = run_config or config
        if self.tracing is not None:
            stream_config = {
                **stream_config,
                **self.tracing.run_config(
                    user_id=context.user_id, agent=spec.key, thread_id=context.thread_id
                ),
            }
        modes: list[StreamMode] = list(dict.fromkeys(("updates", *spec.stream_modes)))

        async def load_state() -> StateSnapshot:
            return cast("StateSnapshot", await graph.aget_state(config))

        view = surface.view(spec, context)
        interrupts: dict[str, Interrupt] = {}
        started = time.perf_counter()
        status: Status = "failed"
        reply: str | None = None
        try:
            await view.begin(load_state)
            stream = graph.astream(
                inputs,
                stream_config,
                context=context,
                stream_mode=modes,
                subgraphs=spec.subgraphs,
                durability=DURABILITY,
            )
            async for item in cast("AsyncIterator[tuple[Any, ...]]", stream):
                # (namespace, mode, chunk) with subgraphs; (mode, chunk) from the graph itself.
                namespace, mode, chunk = item if spec.subgraphs else ((), *item)
                await _dispatch(view, namespace, mode, chunk, interrupts)
            status = "paused" if interrupts else "done"
        except fence.WriteRefused as exc:
            # The user's data was wiped (maybe on another worker) while this ran: it stops here,
            # and nothing it would still write is kept.
            log.warning(
                "%s run stopped: its user's data was wiped (thread %s)", spec.key, context.thread_id
            )
            status = "refused"  # as a run refused before it started: nothing of it is kept
            await surface.refuse(str(exc))
        except GraphRecursionError:
            log.warning("%s run hit its recursion limit (thread %s)", spec.key, context.thread_id)
            status = "stopped"
            await surface.notice(spec.recursion_notice)
        except Exception as exc:
            if is_database_outage(exc):
                status = "unavailable"
                log.warning(
                    "%s run lost its database (thread %s): %s", spec.key, context.thread_id, exc
                )
                await surface.failed(
                    DATABASE_DOWN, thread_id=context.thread_id, message_id=message_id
                )
            else:
                log.exception("%s run failed (thread %s)", spec.key, context.thread_id)
                await surface.failed(MODEL_FAILED, thread_id=context.thread_id)
        finally:
            try:
                reply = await view.end(status, load_state)
            except Exception as exc:
                if not is_database_outage(exc):
                    raise
                log.warning("closing the view of thread %s failed: %s", context.thread_id, exc)
        first_token_at = getattr(view, "first_token_at", None)
        total_s = time.perf_counter() - started
        metrics.observe_run(
            spec.key,
            status,
            seconds=total_s,
            first_token_s=(first_token_at - started) if first_token_at else None,
        )
        log.info(
            "run agent=%s thread=%s status=%s first_token_ms=%s total_ms=%.1f",
            spec.key,
            context.thread_id,
            status,
            f"{(first_token_at - started) * 1000:.1f}" if first_token_at else "-",
            total_s * 1000,
        )
        return RunOutcome(status, list(interrupts.values()), reply)

    async def _schedule_memory_job(self, context: Context) -> None:
        """Off the reply's path: push back this thread's debounced memory job."""
        jobs = self.services.memory_jobs if self.services is not None else None
        if jobs is not None and context.memory:
            await jobs.message_arrived(user_id=context.user_id, thread_id=context.thread_id)

    def _in_background(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Future[None]) -> None:
        self._background.discard(task)  # type: ignore[arg-type]
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("after-turn work failed", exc_info=exc)

    async def drain(self) -> None:
        """Wait for after-turn work (tests, shutdown)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)


async def _dispatch(
    view: View,
    namespace: tuple[str, ...],
    mode: str,
    chunk: Any,
    interrupts: dict[str, Interrupt],
) -> None:
    if mode == "messages":
        token, meta = chunk
        await view.token(namespace, token, meta)
    elif mode == "tasks":
        await view.task(namespace, chunk)
    elif mode == "updates" and isinstance(chunk, dict):
        for node, delta in chunk.items():
            if node == "__interrupt__":
                interrupts.update({i.id: i for i in delta})
            else:
                await view.update(namespace, node, delta)


def _config(thread_id: str, spec: AgentSpec) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id}, "recursion_limit": spec.recursion_limit()}


def _context(owned: OwnedThread, user_id: str, thread_id: str) -> Context:
    return Context(
        user_id=user_id,
        thread_id=thread_id,
        agent=owned.agent,
        memory=not owned.temporary,
        workspace_id=owned.workspace_id,
    )


async def _no_answer(_question: str, _timeout: int) -> str | None:
    return None
