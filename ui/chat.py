"""Chainlit handlers: chat profiles, messages, resume and buttons, each checked against the session user."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import chainlit as cl
from chainlit.auth.jwt import get_jwt_secret
from chainlit.input_widget import InputWidget, Switch
from chainlit.types import ThreadDict
from langchain_core.messages import HumanMessage
from langgraph.errors import GraphRecursionError
from langgraph.types import Command
from pydantic import BaseModel

from auth.identity import flag_client_identity, session_user_id
from auth.ownership import NOT_FOUND, ThreadNotFound, claim_thread, mark_temporary, require_owner
from auth.sessions import SessionRevoked
from graphs.core.context import Context
from graphs.core.models import offline_notice
from graphs.core.runlock import ThreadBusy
from graphs.memory.recall import is_trivial
from ui import planner
from ui.actions import ActionRejected, RetryPayload, parse_payload
from ui.agents import AGENTS, Agent, agent_by_key, agent_for_profile
from ui.input import InputRejected, check_message, compose
from ui.interrupts import ResumePayload, clear_prompt, show_after_resume, show_interrupt
from ui.research import run_research_turn
from ui.runtime import get_runtime
from ui.streaming import run_turn

log = logging.getLogger("cairn")

P = TypeVar("P", bound=BaseModel)


async def chat_profiles(user: cl.User | None = None) -> list[cl.ChatProfile]:
    return [
        cl.ChatProfile(name=agent.profile, markdown_description=agent.description, default=i == 0)
        for i, agent in enumerate(AGENTS)
    ]


H = TypeVar("H", bound=Callable[..., Awaitable[None]])


HANDLER_FAILED = "Something went wrong on the server, and nothing was changed. Please try again."


def chat_handler(handler: H) -> H:
    """Every chat event: a session ended by an account wipe gets a notice and nothing else, and
    an unexpected error gets a fixed message (Chainlit would show the exception's own text)."""

    @functools.wraps(handler)
    async def guarded(*args: Any, **kwargs: Any) -> None:
        try:
            await handler(*args, **kwargs)
        except SessionRevoked as exc:
            await refuse(str(exc))
        except Exception:
            log.exception("chat handler %s failed", handler.__name__)
            await refuse(HANDLER_FAILED)

    return cast("H", guarded)


TEMPORARY = "temporary"
TEMPORARY_NOTICE = (
    "Temporary chat: this conversation neither uses nor adds to what Cairn remembers about you."
)


@chat_handler
async def start_chat() -> None:
    runtime = get_runtime()
    await _session_user_id()
    await _chat_settings(temporary=False)
    if notice := offline_notice(runtime.settings):
        await cl.Message(content=notice, author="Cairn").send()


async def _chat_settings(*, temporary: bool) -> None:
    cl.user_session.set(TEMPORARY, temporary)
    widgets: list[InputWidget] = [
        Switch(
            id=TEMPORARY,
            label="Temporary chat (nothing is read from or added to memory)",
            initial=temporary,
        )
    ]
    await cl.ChatSettings(widgets).send()


@chat_handler
async def update_settings(values: dict[str, Any]) -> None:
    """Temporary chat turns on at any time (a queued memory job of the thread is cancelled)
    and never back off: earlier temporary messages must not reach memory later."""
    runtime = get_runtime()
    user_id = await _session_user_id()
    wanted = bool(values.get(TEMPORARY))
    thread_id = cl.context.session.thread_id
    was = bool(cl.user_session.get(TEMPORARY))
    if was and not wanted:
        await _chat_settings(temporary=True)
        await refuse("This conversation stays temporary. Start a new chat to use memory again.")
        return
    if wanted and not was:
        cl.user_session.set(TEMPORARY, True)
        existing = await mark_temporary(runtime.pool, thread_id=thread_id, user_id=user_id)
        if existing and runtime.memory_jobs is not None:
            await runtime.memory_jobs.forget_thread(user_id=user_id, thread_id=thread_id)
        await cl.Message(content=TEMPORARY_NOTICE, author="Cairn").send()


async def _session_user_id() -> str:
    """The session's verified user, refused when the session was ended (account wiped)."""
    user_id = session_user_id()
    revocations = get_runtime().revocations
    if revocations is not None:
        await revocations.check(user_id, cl.context.session.token, get_jwt_secret() or "")
    return user_id


@chat_handler
async def resume_chat(thread: ThreadDict) -> None:
    """Chainlit already checked its own record; the LangGraph thread is checked here too.

    A run paused on a question gets its buttons back, so it survives a server restart.
    """
    runtime = get_runtime()
    try:
        owned = await require_owner(
            runtime.pool, thread_id=thread["id"], user_id=await _session_user_id()
        )
    except ThreadNotFound:
        await refuse(NOT_FOUND)
        return
    await _chat_settings(temporary=owned.temporary)
    agent = agent_by_key(owned.agent)
    graph = runtime.graphs.get(agent.key)
    if graph is not None:
        show_after_resume(await _pending_interrupts(graph, thread["id"]), thread_id=thread["id"])


@chat_handler
async def handle_message(message: cl.Message) -> None:
    runtime = get_runtime()
    user_id = await _session_user_id()
    flag_client_identity(message.metadata, where="message metadata", user_id=user_id)
    try:
        attachments = check_message(message.content, message.elements or [], runtime.settings)
    except InputRejected as exc:
        # The refused message leaves no trace: not in Chainlit's history, not in the checkpoint.
        await message.remove()
        await refuse(str(exc))
        return
    thread_id = cl.context.session.thread_id
    agent = agent_for_profile(cl.user_session.get("chat_profile"))
    text = compose(message.content, attachments)
    temporary = bool(cl.user_session.get(TEMPORARY))
    if not temporary and agent.key == "assistant":
        _prefetch_recall_query(runtime, text)
    try:
        # A thread keeps the agent it was started with, whatever profile the client reports.
        owned = await claim_thread(
            runtime.pool,
            thread_id=thread_id,
            user_id=user_id,
            agent=agent.key,
            temporary=temporary,
        )
    except ThreadNotFound:
        await refuse(NOT_FOUND)
        return
    agent = agent_by_key(owned.agent)
    inputs = (
        planner.goal_inputs(text)
        if agent.key == "planner"
        else {"messages": [HumanMessage(text, id=message.id)]}
    )
    context = Context(
        user_id=user_id, thread_id=thread_id, agent=agent.key, memory=not owned.temporary
    )
    await _run(agent, inputs, context, message=message)


def _prefetch_recall_query(runtime: Any, text: str) -> None:
    """Start embedding the recall query now, overlapping the ownership check and checkpoint load."""
    prefetch = getattr(runtime.persistence.embedding.embeddings, "prefetch", None)
    if prefetch is not None and not is_trivial(text):
        prefetch(text)


async def refuse(text: str) -> None:
    """An error shown at the top level of the conversation (never nested under a removed step)."""
    error = cl.ErrorMessage(content=text)
    error.parent_id = None
    await error.send()


@dataclass(frozen=True)
class CheckedAction(Generic[P]):
    payload: P
    agent: Agent
    context: Context


async def _check_action(action: cl.Action, model: type[P]) -> CheckedAction[P] | None:
    """Schema, session thread and ownership checks every button press goes through."""
    runtime = get_runtime()
    user_id = await _session_user_id()
    thread_id = cl.context.session.thread_id
    flag_client_identity(action.payload, where=f"{action.name} action", user_id=user_id)
    try:
        payload = parse_payload(model, action, thread_id=thread_id)
        owned = await require_owner(runtime.pool, thread_id=thread_id, user_id=user_id)
    except ActionRejected as exc:
        await refuse(str(exc))
        return None
    except ThreadNotFound:
        await refuse(NOT_FOUND)
        return None
    agent = agent_by_key(owned.agent)
    context = Context(
        user_id=user_id, thread_id=thread_id, agent=agent.key, memory=not owned.temporary
    )
    return CheckedAction(payload=payload, agent=agent, context=context)


@chat_handler
async def retry_turn(action: cl.Action) -> None:
    if (checked := await _check_action(action, RetryPayload)) is None:
        return
    await action.remove()
    # None resumes the thread from its last checkpoint: the failed node runs again.
    await _run(checked.agent, None, checked.context)


@chat_handler
async def resume_interrupt(action: cl.Action) -> None:
    """A button answering a paused run: checked against the session, the thread and the pause."""
    if (checked := await _check_action(action, ResumePayload)) is None:
        return
    agent, payload, thread_id = checked.agent, checked.payload, checked.context.thread_id
    runtime = get_runtime()
    graph = runtime.graphs.get(agent.key)
    pending = await _pending_interrupts(graph, thread_id) if graph is not None else []
    if payload.interrupt_id not in {i.id for i in pending}:
        await refuse("That question has already been answered.")
        return
    await clear_prompt(payload.interrupt_id)
    command: Command[Any] = Command(resume={payload.interrupt_id: {"decision": payload.decision}})
    await _run(agent, command, checked.context)


@chat_handler
async def review_plan(action: cl.Action) -> None:
    """Approve / Edit / Reject under a pending plan: the same checks as every other button."""
    if (checked := await _check_action(action, planner.PlanReviewPayload)) is None:
        return
    payload, thread_id = checked.payload, checked.context.thread_id
    graph = get_runtime().graphs.get(checked.agent.key)
    answer = await planner.review_answer(payload)
    if answer is None:
        return
    pending = await _pending_interrupts(graph, thread_id) if graph is not None else []
    if payload.interrupt_id not in {i.id for i in pending}:
        await refuse("That plan has already been answered.")
        return
    await clear_prompt(payload.interrupt_id)
    async with planner.busy():
        await _run(checked.agent, Command(resume={payload.interrupt_id: answer}), checked.context)


async def _pending_interrupts(graph: Any, thread_id: str) -> list[Any]:
    state = await graph.aget_state({"configurable": {"thread_id": thread_id}})
    return list(state.interrupts)


async def _run(
    agent: Agent,
    inputs: dict[str, Any] | Command[Any] | None,
    context: Context,
    *,
    message: cl.Message | None = None,
) -> None:
    """One run on the thread; a second one while it works is refused (across workers).

    message is the user's message that started it: refused, it is removed again, so the
    conversation shows only what the graph actually received.
    """
    runtime = get_runtime()
    graph = runtime.graphs.get(agent.key)
    if graph is None:
        await cl.Message(
            content=f"The {agent.profile} agent is not available yet. Switch to the Assistant "
            "profile at the top of the chat to talk to Cairn.",
            author="Cairn",
        ).send()
        return
    assert runtime.run_locks is not None
    try:
        async with runtime.run_locks.hold(context.thread_id):
            await _run_locked(agent, graph, inputs, context)
    except ThreadBusy as exc:
        if message is not None:
            await message.remove()
        await refuse(str(exc))


async def _run_locked(
    agent: Agent, graph: Any, inputs: dict[str, Any] | Command[Any] | None, context: Context
) -> None:
    try:
        if agent.key == "planner":
            result = await planner.run_planner(graph, inputs, context=context)
        else:
            runner = run_research_turn if agent.key == "research" else run_turn
            result = await runner(
                graph,
                inputs,
                context=context,
                reply_node=agent.reply_node,
                durability=agent.durability,
            )
    except GraphRecursionError:
        await cl.Message(
            content="I went round in circles on that one and stopped. Could you rephrase or "
            "break the request into smaller parts?"
        ).send()
    except Exception:
        log.exception("turn failed (thread %s)", context.thread_id)
        await cl.Message(
            author="Cairn",
            content="The model did not answer. Your message is saved; press Retry to try again.",
            actions=[
                cl.Action(name="retry", label="Retry", payload={"thread_id": context.thread_id})
            ],
        ).send()
        return
    for interrupt in result.interrupts:
        await show_interrupt(interrupt, thread_id=context.thread_id)
    if agent.key == "assistant" and context.memory:
        _schedule_memory_job(context)


_background: set[asyncio.Task[None]] = set()


def _schedule_memory_job(context: Context) -> None:
    """Off the reply's path: push back this thread's debounced memory job."""
    jobs = get_runtime().memory_jobs
    if jobs is None:
        return
    task = asyncio.create_task(
        jobs.message_arrived(user_id=context.user_id, thread_id=context.thread_id)
    )
    _background.add(task)
    task.add_done_callback(_finished)


def _finished(task: asyncio.Task[None]) -> None:
    _background.discard(task)
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("scheduling the memory job failed", exc_info=exc)
