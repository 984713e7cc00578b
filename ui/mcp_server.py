"""The agents as MCP tools at /mcp (the official SDK's streamable HTTP server), for callers
holding a personal access token (auth/tokens.py). Each tool, what it shows a caller and its
token scope come from the agent's spec (`AgentSpec.mcp`, ui/agents/); nothing here names one.

A token stands for its user exactly like a web session: every run goes through the one turn
runner (ui/runner.py) with a headless surface, so thread ownership, memory scoping and the run
lock are the chat's own. A run that pauses for a plan approval returns the pending plan and
its thread id at once; `answer_approval` resumes it in a later call (the state is in the
checkpoint, so any worker can). The server is stateless (no MCP session is kept in a worker's
memory), so several workers behind a load balancer serve one caller.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import uuid
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from fastapi import APIRouter
from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.tracers.context import register_configure_hook
from mcp.server.fastmcp import Context, FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.routing import Route

from auth.ownership import NOT_FOUND, InWorkspace, ThreadNotFound
from auth.tokens import INVALID, LimitExceeded, TokenRejected
from graphs.core.offline import OFFLINE_STRUCTURED
from ui.runner import NEEDS_REVIEWER, UNAVAILABLE
from ui.surface import HeadlessSurface, HeadlessView

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator, Sequence

    from starlette.types import Receive, Scope, Send

    from auth.ownership import OwnedThread
    from auth.tokens import AccessTokens, TokenInfo
    from graphs.core.context import Context as RunContext
    from graphs.core.pool import Pool
    from graphs.core.settings import Settings
    from ui.port import ChatPort
    from ui.runner import AgentSpec, LoadState, McpTool, Runner, RunOutcome, Status, View

log = logging.getLogger("cairn.mcp")

PATH = "/mcp"
TOKEN_KEY = "cairn.access_token"  # noqa: S105 (a scope key, not a secret)
"""Where the authenticated token travels in the ASGI scope to the tool handlers."""
CHALLENGE = 'Bearer realm="cairn"'
KEEP_ALIVE_S = 15.0
"""How often a caller waiting on a run hears that it is still going."""
NOT_WAITING = "Nothing in that conversation is waiting for an answer."
NO_PRE_APPROVAL = (
    "This token does not allow pre-approval. Its owner can allow it on the access token "
    "settings page; otherwise answer the returned approval with answer_approval."
)
PAUSED = (
    "runs pause for approval: the result then has status 'paused', the thread_id and what "
    "is waiting (approval); call answer_approval with one of the decisions it lists."
)


def offered(agents: Sequence[AgentSpec]) -> tuple[AgentSpec, ...]:
    """The agents with an MCP tool, in profile order."""
    return tuple(spec for spec in agents if spec.mcp is not None)


def token_scopes(agents: Sequence[AgentSpec]) -> dict[str, str]:
    """The scopes an access token may hold: one per agent offered over MCP (its key), with
    the label the tokens page shows (its profile name)."""
    return {spec.key: spec.profile for spec in offered(agents)}


def instructions(agents: Sequence[AgentSpec]) -> str:
    """The server's instructions: each agent's tool, and which of them pause for approval."""
    tools = [spec.mcp for spec in offered(agents) if spec.mcp is not None]
    text = "Cairn's agents as tools. " + "; ".join(f"{t.name} {t.summary}" for t in tools) + "."
    pausing = [spec.profile for spec in offered(agents) if spec.mcp and spec.mcp.pauses]
    if pausing:
        text += f" {_listed(pausing, 'and')} {PAUSED}"
    return text + " Pass a thread_id to continue a conversation."


def _listed(names: Sequence[str], last: str) -> str:
    return names[-1] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


def pre_approvable(agents: Sequence[AgentSpec]) -> list[str]:
    """The profile names of the agents whose pending questions a token may pre-approve."""
    return [spec.profile for spec in offered(agents) if spec.mcp and spec.mcp.pre_approve]


def answer_decisions(agents: Sequence[AgentSpec]) -> list[str]:
    """Every decision a question of an agent offered over MCP accepts."""
    return sorted(
        {d for spec in offered(agents) for kind in spec.interrupts for d in kind.decisions}
    )


def answer_description(agents: Sequence[AgentSpec]) -> str:
    """answer_approval's description for the calling model: whose runs pause, and how an
    answer is given (each question lists its own decisions and what an edit holds)."""
    asking = [spec.profile for spec in offered(agents) if spec.interrupts]
    text = (
        f"Answer what a paused {_listed(asking, 'or')} run of yours is waiting for, and let "
        "it continue: give one of the decisions its approval lists."
    )
    if "edit" in answer_decisions(agents):
        text += " For 'edit', put in `edit` what the approval's `edit` field asks for."
    return text


def tool_signature(tool: McpTool) -> inspect.Signature:
    """The tool's arguments as FastMCP reads them: the agent's text argument, the context,
    thread_id, and the options the agent offers."""
    arg = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [
        inspect.Parameter(tool.text_arg, arg, annotation=str),
        inspect.Parameter("ctx", arg, annotation=Context),
        inspect.Parameter("thread_id", arg, default=None, annotation=str | None),
    ]
    if tool.temporary:
        params.append(inspect.Parameter("temporary", arg, default=False, annotation=bool))
    if tool.pre_approve is not None:
        params.append(inspect.Parameter("pre_approve", arg, default=False, annotation=bool))
    return inspect.Signature(params, return_annotation=dict[str, Any])


class Logged(ToolError):
    """A tool error already recorded in the token's call log."""


class BudgetExceeded(Exception):
    """A run made more model calls than its token allows."""


class ModelCallBudget(AsyncCallbackHandler):
    """Counts a run's model calls (every chat model in every node and subagent) and stops the
    run at the token's budget. Added to every callback manager configured inside the run via
    LangChain's configure hook, so the runner needs no MCP-specific argument."""

    run_inline = True
    raise_error = True

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.calls = 0

    @property
    def exceeded(self) -> bool:
        return self.calls > self.limit

    async def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
        self._count()

    async def on_llm_start(self, serialized: Any, prompts: Any, **kwargs: Any) -> None:
        self._count()

    async def on_chain_start(self, serialized: Any, inputs: Any, **kwargs: Any) -> None:
        # The offline stand-in answers structured output without a chat-model run
        # (graphs/core/offline.py); it counts as the model call it stands in for.
        if kwargs.get("name") == OFFLINE_STRUCTURED:
            self._count()

    def _count(self) -> None:
        self.calls += 1
        if self.exceeded:
            msg = f"model-call budget of {self.limit} exceeded"
            raise BudgetExceeded(msg)


_budget: ContextVar[ModelCallBudget | None] = ContextVar("cairn_mcp_budget", default=None)
register_configure_hook(_budget, inheritable=True)


@contextmanager
def counted(budget: ModelCallBudget) -> Iterator[None]:
    """Every model call made inside (in this task and the tasks it starts) counts against
    `budget`."""
    reset = _budget.set(budget)
    try:
        yield
    finally:
        _budget.reset(reset)


class McpView(HeadlessView):
    """A headless run that keeps the finished state for the tool's structured result."""

    def __init__(self, spec: AgentSpec, surface: McpSurface) -> None:
        super().__init__(spec)
        self.surface = surface

    async def end(self, status: Status, load_state: LoadState) -> str | None:
        if status != "done":
            return None
        values = dict((await load_state()).values)
        self.surface.values = values
        return self.spec.reply_text(values)


class McpSurface(HeadlessSurface):
    """The runner's surface for one MCP call: errors kept, the final state kept."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, Any] = {}

    def view(self, spec: AgentSpec, context: RunContext) -> View:
        return McpView(spec, self)


@dataclass
class Call:
    """One tool call: its token, its limits record and its model-call budget."""

    token: TokenInfo
    tool: str
    thread_id: str | None
    worker: str | None = None
    """The worker running the call (its run journal's id): the call is closed if it dies."""
    budget: ModelCallBudget = field(init=False)

    def __post_init__(self) -> None:
        self.budget = ModelCallBudget(self.token.limits.max_model_calls)


def approval(interrupt: Any, spec: AgentSpec) -> dict[str, Any]:
    """A pending question as the caller sees it: what to approve and how to answer."""
    value = interrupt.value if isinstance(interrupt.value, dict) else {}
    kind = spec.interrupt_kind(value)
    shown: dict[str, Any] = {
        "interrupt_id": interrupt.id,
        "kind": value.get("kind"),
        "decisions": sorted(kind.decisions) if kind else ["confirm", "reject"],
    }
    if kind is not None:
        shown.update(kind.describe(value))
    return shown


class McpEndpoint:
    """The FastMCP server, its bearer-token gate and the session manager's lifetime."""

    def __init__(
        self,
        *,
        settings: Settings,
        public_url: str,
        pool: Pool,
        agents: Sequence[AgentSpec],
        runner: Callable[[], Runner],
        tokens: Callable[[], AccessTokens],
        chat: Callable[[], ChatPort],
    ) -> None:
        self.settings = settings
        self.agents = offered(agents)
        self.public_url = public_url
        self.pool = pool
        self.runner = runner
        self.tokens = tokens
        self.chat = chat
        """The chat port (ui/port.py): MCP conversations show in the user's sidebar too."""
        self.server = FastMCP(
            name="Cairn",
            instructions=instructions(self.agents),
            streamable_http_path=PATH,
            stateless_http=True,
            transport_security=_transport_security(public_url, settings),
        )
        self._register_tools()
        self.server.streamable_http_app()  # creates the session manager
        self._task: asyncio.Task[None] | None = None
        self._runs: set[asyncio.Task[dict[str, Any]]] = set()
        self._stopping = asyncio.Event()

    # -- lifetime -----------------------------------------------------------------------

    def router(self) -> APIRouter:
        router = APIRouter()
        router.routes.append(Route(PATH, self))  # an ASGI app: every method reaches it
        return router

    async def start(self) -> None:
        """The session manager's task group, for the worker's lifetime (a sub-app mounted
        under Chainlit gets no lifespan of its own)."""
        ready = asyncio.Event()

        async def serve() -> None:
            async with self.server.session_manager.run():
                ready.set()
                await self._stopping.wait()

        self._task = asyncio.create_task(serve(), name="cairn-mcp")
        await ready.wait()

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            await asyncio.wait({self._task}, timeout=5)

    # -- the gate -------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.settings.mcp_enabled or self._task is None:
            await JSONResponse({"detail": "Not found"}, status_code=404)(scope, receive, send)
            return
        header = Headers(scope=scope).get("authorization", "")
        secret = header[7:].strip() if header.lower().startswith("bearer ") else None
        try:
            token = await self.tokens().verify(secret)
        except TokenRejected:
            await _unauthorized(scope, receive, send, presented=secret is not None)
            return
        scope[TOKEN_KEY] = token
        await self.server.session_manager.handle_request(scope, receive, send)

    # -- tools ----------------------------------------------------------------------------

    def _register_tools(self) -> None:
        for spec in self.agents:
            self._add_agent_tool(spec)
        decisions = answer_decisions(self.agents)
        if decisions:
            self._add_answer_tool(decisions)

    def _add_answer_tool(self, decisions: Sequence[str]) -> None:
        """answer_approval, taking the decisions the agents' questions declare."""

        async def answer_approval(
            thread_id: str,
            decision: str,
            ctx: Context,
            edit: str | None = None,
            interrupt_id: str | None = None,
        ) -> dict[str, Any]:
            return await self._answer(ctx, thread_id, decision, edit, interrupt_id)

        # FastMCP builds the argument schema from the annotations: the decisions as an enum.
        answer_approval.__annotations__["decision"] = Literal[tuple(decisions)]  # type: ignore[valid-type]
        self.server.add_tool(
            answer_approval,
            name="answer_approval",
            title="Answer a pending approval",
            description=answer_description(self.agents),
        )

    def _add_agent_tool(self, spec: AgentSpec) -> None:
        """The tool that starts a run of one agent, as its spec declares it."""
        tool = spec.mcp
        assert tool is not None

        async def start_run(ctx: Context, **arguments: Any) -> dict[str, Any]:
            return await self._new_turn(
                ctx,
                spec,
                arguments[tool.text_arg],
                arguments.get("thread_id"),
                temporary=bool(arguments.get("temporary")),
                pre_approve=bool(arguments.get("pre_approve")),
            )

        signature = tool_signature(tool)
        start_run.__name__ = tool.name  # FastMCP names the argument schema after it
        start_run.__signature__ = signature  # type: ignore[attr-defined]
        start_run.__annotations__ = {
            name: p.annotation for name, p in signature.parameters.items()
        } | {"return": signature.return_annotation}
        self.server.add_tool(
            start_run, name=tool.name, title=tool.title, description=tool.description
        )

    # -- one call -------------------------------------------------------------------------

    async def _new_turn(
        self,
        ctx: Context,
        spec: AgentSpec,
        text: str,
        thread_id: str | None,
        *,
        temporary: bool = False,
        pre_approve: bool = False,
    ) -> dict[str, Any]:
        token = _token(ctx)
        assert spec.mcp is not None
        async with self._refusals_logged(token, spec.mcp.name, thread_id):
            return await self._start(
                ctx, token, spec, text, thread_id, temporary=temporary, pre_approve=pre_approve
            )

    async def _start(
        self,
        ctx: Context,
        token: TokenInfo,
        spec: AgentSpec,
        text: str,
        thread_id: str | None,
        *,
        temporary: bool,
        pre_approve: bool,
    ) -> dict[str, Any]:
        assert spec.mcp is not None
        _in_scope(token, spec.key)
        text = text.strip()
        if not text or len(text) > self.settings.max_message_chars:
            msg = f"The text must be 1 to {self.settings.max_message_chars} characters."
            raise ToolError(msg)
        if pre_approve and not token.pre_approve:
            raise ToolError(NO_PRE_APPROVAL)
        runner = self.runner()
        if runner.spec(spec.key) is None:  # its profile would reach the runner's default agent
            raise ToolError(UNAVAILABLE)
        if thread_id is not None:
            await self._check_thread(token, thread_id, spec.key)
        call = Call(token, spec.mcp.name, thread_id or str(uuid.uuid4()), _worker(runner))

        async def run(surface: McpSurface) -> RunOutcome:
            await self._show_in_chat(token, str(call.thread_id), spec, text)
            outcome = await runner.message(
                surface,
                user_id=token.user_id,
                thread_id=str(call.thread_id),
                profile=spec.profile,
                text=text,
                message_id=str(uuid.uuid4()),
                temporary=temporary,
                workspace=InWorkspace(token.workspace_id),  # the token's, not the active one
            )
            if pre_approve and outcome.status == "paused":
                outcome = await self._pre_approve(surface, runner, spec, call, outcome)
            return outcome

        return await self._tracked(ctx, call, spec, run)

    async def _pre_approve(
        self, surface: McpSurface, runner: Runner, spec: AgentSpec, call: Call, outcome: RunOutcome
    ) -> RunOutcome:
        pending = outcome.interrupts[0] if outcome.interrupts else None
        value = pending.value if pending is not None and isinstance(pending.value, dict) else {}
        check = spec.mcp.pre_approve if spec.mcp is not None else None
        why = (
            check(value, call.token.limits.max_model_calls)
            if check is not None
            else f"{spec.profile} runs cannot be pre-approved"
        )
        if pending is None or why is not None:
            surface.values["pre_approval"] = f"not applied: {why}"
            return outcome
        log.info("token %s pre-approved the question on thread %s", call.token.id, call.thread_id)
        answered = await runner.answer(
            surface,
            user_id=call.token.user_id,
            thread_id=str(call.thread_id),
            interrupt_id=pending.id,
            decision="approve",
        )
        refused = answered.status == "paused" and NEEDS_REVIEWER in surface.errors
        surface.values["pre_approval"] = (
            "not applied: this team's plans wait for a reviewer" if refused else "applied"
        )
        return answered

    async def _answer(
        self,
        ctx: Context,
        thread_id: str,
        decision: str,
        edit: str | None,
        interrupt_id: str | None,
    ) -> dict[str, Any]:
        token = _token(ctx)
        async with self._refusals_logged(token, "answer_approval", thread_id):
            return await self._resume(ctx, token, thread_id, decision, edit, interrupt_id)

    async def _resume(
        self,
        ctx: Context,
        token: TokenInfo,
        thread_id: str,
        decision: str,
        edit: str | None,
        interrupt_id: str | None,
    ) -> dict[str, Any]:
        runner = self.runner()
        try:
            owned = await runner.threads.require(thread_id=thread_id, user_id=token.user_id)
            _in_workspace(token, owned)
            pending = await runner.pending(user_id=token.user_id, thread_id=thread_id)
        except ThreadNotFound:
            raise ToolError(NOT_FOUND) from None
        _in_scope(token, owned.agent)
        spec = runner.spec(owned.agent)
        if spec is None:
            raise ToolError(NOT_FOUND)
        if interrupt_id is None:
            if len(pending) != 1:
                raise ToolError(NOT_WAITING if not pending else "Give the interrupt_id to answer.")
            interrupt_id = pending[0].id
        answer_id = interrupt_id

        async def edited(_question: str, _timeout: int) -> str | None:
            return edit.strip() if edit and edit.strip() else None

        async def run(surface: McpSurface) -> RunOutcome:
            return await runner.answer(
                surface,
                user_id=token.user_id,
                thread_id=thread_id,
                interrupt_id=answer_id,
                decision=decision,
                ask=edited,
            )

        call = Call(token, "answer_approval", thread_id, _worker(runner))
        return await self._tracked(ctx, call, spec, run)

    @asynccontextmanager
    async def _refusals_logged(
        self, token: TokenInfo, tool: str, thread_id: str | None
    ) -> AsyncIterator[None]:
        """A call refused before its run started is logged with its token id too."""
        try:
            yield
        except Logged:
            raise
        except ToolError as exc:
            await self.tokens().log_refusal(token, tool, thread_id, str(exc))
            log.info(
                "mcp call token=%s user=%s tool=%s thread=%s status=refused",
                token.id,
                token.user_id,
                tool,
                thread_id,
            )
            raise

    async def _check_thread(self, token: TokenInfo, thread_id: str, agent: str) -> None:
        try:
            owned = await self.runner().threads.require(thread_id=thread_id, user_id=token.user_id)
            _in_workspace(token, owned)
        except ThreadNotFound:
            raise ToolError(NOT_FOUND) from None
        if owned.agent != agent:
            msg = f"That conversation is with the {owned.agent} agent; use its tool."
            raise ToolError(msg)

    async def _tracked(
        self, ctx: Context, call: Call, spec: AgentSpec, run: Callable[[McpSurface], Any]
    ) -> dict[str, Any]:
        """The run within the token's limits and model-call budget, logged with its token id.

        It runs as its own task: a caller that disconnects does not cut it off half-way (its
        result stays in the conversation, under the returned thread id). While it works, a log
        message every KEEP_ALIVE_S keeps the caller's stream from timing out."""
        try:
            call_id = await self.tokens().begin_call(
                call.token, call.tool, call.thread_id, worker=call.worker
            )
        except LimitExceeded as exc:
            raise Logged(str(exc)) from None
        work = asyncio.create_task(self._limited(call, call_id, spec, run))
        self._runs.add(work)
        work.add_done_callback(self._runs.discard)
        beat = asyncio.create_task(_keep_alive(ctx, call))
        try:
            return await asyncio.shield(work)
        finally:
            beat.cancel()

    async def _limited(
        self, call: Call, call_id: int, spec: AgentSpec, run: Callable[[McpSurface], Any]
    ) -> dict[str, Any]:
        surface = McpSurface()
        status, detail = "failed", None
        try:
            with counted(call.budget):
                outcome: RunOutcome = await run(surface)
            status = outcome.status
            if call.budget.exceeded:
                status = "over_budget"
                detail = (
                    f"The run stopped at this token's budget of {call.budget.limit} model "
                    "calls. What it finished is saved in the conversation."
                )
            elif outcome.status not in ("done", "paused") or surface.errors:
                # A paused run with an error is an answer that was refused (e.g. an edit
                # without its steps): the question is still waiting.
                detail = _refusal(outcome, surface)
        finally:
            await self.tokens().finish_call(
                call_id,
                status=status,
                thread_id=call.thread_id,
                model_calls=call.budget.calls,
                detail=detail,
            )
            log.info(
                "mcp call token=%s user=%s tool=%s thread=%s status=%s model_calls=%d",
                call.token.id,
                call.token.user_id,
                call.tool,
                call.thread_id,
                status,
                call.budget.calls,
            )
        if detail is not None:
            raise Logged(detail)
        result = self._result(call, spec, outcome, surface)
        if result.get("reply") and call.thread_id is not None:
            await self.chat().append_reply(
                call.thread_id, result["reply"], author=spec.profile, once=True
            )
        return result

    async def _show_in_chat(
        self, token: TokenInfo, thread_id: str, spec: AgentSpec, text: str
    ) -> None:
        """The conversation in the user's chat sidebar too, with what was asked over MCP.
        The thread is the caller's (checked) or new (its id chosen here)."""
        await self.chat().add_outside_turn(
            thread_id=thread_id, user_id=token.user_id, profile=spec.profile, text=text
        )

    def _result(
        self, call: Call, spec: AgentSpec, outcome: RunOutcome, surface: McpSurface
    ) -> dict[str, Any]:
        result: dict[str, Any] = {
            "status": outcome.status,
            "thread_id": call.thread_id,
            "agent": spec.key,
            "model_calls": call.budget.calls,
        }
        if surface.used is not None:
            result["usage"] = {
                "input_tokens": surface.used.input_tokens,
                "output_tokens": surface.used.output_tokens,
                "estimated_cost": round(surface.used.cost, 6),
            }
        if "pre_approval" in surface.values:
            result["pre_approval"] = surface.values["pre_approval"]
        if outcome.status == "paused":
            result["approval"] = [approval(i, spec) for i in outcome.interrupts]
            return result
        result["reply"] = outcome.reply
        finished = spec.mcp.result if spec.mcp is not None else None
        if finished is not None:
            result.update(finished(surface.values, self.public_url) or {})
        return result


async def _keep_alive(ctx: Context, call: Call) -> None:
    while True:
        await asyncio.sleep(KEEP_ALIVE_S)
        try:
            await ctx.info(f"{call.tool} is still running ({call.budget.calls} model calls so far)")
        except Exception as exc:  # the caller went away; the run goes on
            log.info("token %s: progress not delivered: %s", call.token.id, exc)
            return


def _worker(runner: Runner) -> str | None:
    return runner.journal.worker if runner.journal is not None else None


def _token(ctx: Context) -> TokenInfo:
    request = ctx.request_context.request
    token = request.scope.get(TOKEN_KEY) if request is not None else None
    if token is None:  # the gate always sets it; a tool reached another way gets nothing
        raise ToolError(INVALID)
    return token  # type: ignore[no-any-return]


def _in_workspace(token: TokenInfo, owned: OwnedThread) -> None:
    """A token acts in its own workspace: a conversation of another one (the user's personal
    one for a team token, or another team) is refused like a missing one."""
    if owned.workspace_id != token.workspace_id:
        log.warning(
            "refused: token %s (workspace %s) reached thread of workspace %s",
            token.id,
            token.workspace_id or "personal",
            owned.workspace_id or "personal",
        )
        raise ThreadNotFound


def _in_scope(token: TokenInfo, agent: str) -> None:
    if agent not in token.scopes:
        msg = (
            f"This token may not use the {agent} agent (its scopes: "
            f"{', '.join(sorted(token.scopes))})."
        )
        raise ToolError(msg)


def _refusal(outcome: RunOutcome, surface: McpSurface) -> str:
    if outcome.status == "not_found":
        return NOT_FOUND
    return surface.errors[-1] if surface.errors else f"The run ended: {outcome.status}."


async def _unauthorized(scope: Scope, receive: Receive, send: Send, *, presented: bool) -> None:
    """RFC 6750: no credentials get the bare challenge; a bad one says invalid_token."""
    challenge = CHALLENGE
    if presented:
        challenge += f', error="invalid_token", error_description="{INVALID}"'
        log.warning("refused: invalid access token at %s", PATH)
    response = JSONResponse(
        {"error": "invalid_token" if presented else "unauthorized", "error_description": INVALID},
        status_code=401,
        headers={"WWW-Authenticate": challenge, "Cache-Control": "no-store"},
    )
    await response(scope, receive, send)


def _transport_security(public_url: str, settings: Settings) -> TransportSecuritySettings:
    """DNS-rebinding protection: the app's own host names and the allowed origins only."""
    host = urlsplit(public_url).netloc
    hosts = [host, "localhost:*", "127.0.0.1:*", "[::1]:*"]
    origins = [*settings.allow_origins, public_url]
    return TransportSecuritySettings(allowed_hosts=hosts, allowed_origins=origins)
