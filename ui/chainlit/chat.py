"""Chainlit handlers: each event checked against the session user, then handed to the runner."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import chainlit as cl
from chainlit.auth.jwt import get_jwt_secret
from chainlit.data import get_data_layer
from chainlit.input_widget import InputWidget, Switch
from chainlit.types import ThreadDict
from pydantic import BaseModel

from auth.identity import flag_client_identity
from auth.ownership import NOT_FOUND, ThreadNotFound, mark_temporary
from graphs.core.errors import is_database_outage
from graphs.core.fence import WriteRefused, adopt
from graphs.core.models import offline_notice
from graphs.memory.recall import is_trivial
from ui.chainlit import welcome
from ui.chainlit.actions import ActionRejected, AnswerPayload, RetryPayload, parse_payload
from ui.chainlit.data_layer import store_edit, stored_user_message, unanswered_message
from ui.chainlit.identity import session_user_id
from ui.chainlit.patches.sessions import stoppable
from ui.chainlit.surface import ChatSurface, ask_text, refuse, retry_message
from ui.input import InputRejected, check_message, compose
from ui.runner import DATABASE_DOWN

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ui.chainlit.agents import Presentations
    from ui.runner import AgentSpec
    from ui.runtime import AppRuntime

log = logging.getLogger("cairn")

P = TypeVar("P", bound=BaseModel)
_deferred: set[asyncio.Task[None]] = set()


H = TypeVar("H", bound=Callable[..., Awaitable[None]])


HANDLER_FAILED = "Something went wrong on the server, and nothing was changed. Please try again."
DATABASE_AWAY = (
    "Cairn could not reach its database just now, and nothing was changed. "
    "Please try again in a moment."
)


def chat_handler(handler: H) -> H:
    """Every chat event: a session ended by an account wipe gets a notice and nothing else, and
    an unexpected error gets a fixed message (Chainlit would show the exception's own text)."""

    @functools.wraps(handler)
    async def guarded(*args: Any, **kwargs: Any) -> None:
        try:
            await handler(*args, **kwargs)
        except WriteRefused as exc:  # the session was ended, here or on another worker
            await refuse(str(exc))
        except Exception as exc:
            if is_database_outage(exc):
                log.warning("chat handler %s: database unavailable (%s)", handler.__name__, exc)
                await refuse(DATABASE_AWAY)
                return
            log.exception("chat handler %s failed", handler.__name__)
            await refuse(HANDLER_FAILED)

    return cast("H", guarded)


TEMPORARY = "temporary"
TEMPORARY_NOTICE = (
    "Temporary chat: this conversation neither uses nor adds to what Cairn remembers about you."
)


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


NOT_ANSWERED = "Your last message was not answered: the database was away."


SUPPORT_NOTICE = (
    "Cairn support opened this conversation's history {count} time(s), last on {when} UTC. "
    "The memory page's export lists each access and why."
)


async def _support_notice(runtime: AppRuntime, thread_id: str) -> None:
    """The owner sees that support opened the conversation (the audit, read for its owner)."""
    if runtime.support_audit is None:
        return
    rows = await runtime.support_audit.for_thread(thread_id)
    if rows:
        when = rows[0]["at"][:16].replace("T", " ")
        await cl.Message(
            content=SUPPORT_NOTICE.format(count=len(rows), when=when), author="Cairn"
        ).send()


def _after_resume(work: Awaitable[Any]) -> None:
    """Chainlit replaces the chat with the stored thread right after on_chat_resume returns,
    so what is sent from inside the hook would be wiped: this waits for the hook's own task."""
    resuming = asyncio.current_task()

    async def later() -> None:
        if resuming is not None:
            await asyncio.wait({resuming})
        await work

    task = asyncio.create_task(later())
    _deferred.add(task)
    task.add_done_callback(_done)


def _done(task: asyncio.Task[None]) -> None:
    _deferred.discard(task)
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("restoring a reopened conversation failed", exc_info=exc)


def _prefetch_recall_query(runtime: AppRuntime, text: str) -> None:
    """Start embedding the recall query now, overlapping the ownership check and checkpoint load."""
    persistence = runtime.persistence
    embeddings = persistence.embedding.embeddings if persistence is not None else None
    prefetch = getattr(embeddings, "prefetch", None)
    if prefetch is not None and not is_trivial(text):
        prefetch(text)


RETRY_SETTLE_S = 10.0
"""How long a Retry waits for the writes held during an outage to be stored."""
MESSAGE_GONE = "That message is no longer in this conversation; please send it again."


class ChatHandlers:
    """Chainlit's hooks for one worker: each event checked against the session user, then
    handed to the runner of `runtime` (ui/chainlit/hooks.py registers them)."""

    def __init__(
        self,
        runtime: Callable[[], AppRuntime],
        agents: Sequence[AgentSpec],
        presentations: Presentations,
    ) -> None:
        self.runtime = runtime
        """The started worker (raises while it is still starting)."""
        self.agents = tuple(agents)
        self.presentations = presentations

    async def chat_profiles(self, user: cl.User | None = None) -> list[cl.ChatProfile]:
        return welcome.chat_profiles(self.agents)

    async def starters(
        self, user: cl.User | None = None, language: str | None = None
    ) -> list[cl.Starter]:
        """The default agent's, for a chat without a chosen profile (each profile has its own)."""
        return welcome.starters(self.agents[0]) if self.agents else []

    @chat_handler
    async def start_chat(self) -> None:
        runtime = self.runtime()
        await self._session_user_id()
        await _chat_settings(temporary=False)
        if notice := offline_notice(runtime.settings):
            # A system message leaves the chat "empty" for Chainlit: the welcome and starters stay.
            await cl.Message(content=notice, author="Cairn", type="system_message").send()

    @chat_handler
    async def update_settings(self, values: dict[str, Any]) -> None:
        """Temporary chat turns on at any time (a queued memory job of the thread is cancelled)
        and never back off: earlier temporary messages must not reach memory later."""
        runtime = self.runtime()
        user_id = await self._session_user_id()
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

    async def _session_user_id(self) -> str:
        """The session's verified user, refused when the session was ended (account wiped)."""
        user_id = session_user_id()
        revocations = self.runtime().revocations
        if revocations is not None:
            # What this event writes (the run, its memories, Chainlit's rows) carries the session's
            # authority; a wipe's cut-off refuses it in Postgres on whichever worker writes it.
            adopt(
                await revocations.check(user_id, cl.context.session.token, get_jwt_secret() or "")
            )
        return user_id

    @chat_handler
    async def resume_chat(self, thread: ThreadDict) -> None:
        """Chainlit already checked its own record; the LangGraph thread is checked here too.

        The conversation's panels (task list, final status) and a paused run's buttons come back,
        so they survive a reload and a server restart.
        """
        runtime = self.runtime()
        user_id = await self._session_user_id()
        try:
            owned = await runtime.runner.threads.require(thread_id=thread["id"], user_id=user_id)
        except ThreadNotFound:
            await refuse(NOT_FOUND)
            return
        await _chat_settings(temporary=owned.temporary)
        _after_resume(self._reopen(runtime, user_id, thread["id"]))
        _after_resume(_support_notice(runtime, thread["id"]))

    async def _reopen(self, runtime: AppRuntime, user_id: str, thread_id: str) -> None:
        await runtime.runner.reopen(
            ChatSurface(self.presentations), user_id=user_id, thread_id=thread_id
        )
        if (message_id := await unanswered_message(runtime.pool, thread_id)) is not None:
            offer = retry_message(NOT_ANSWERED, thread_id=thread_id, message_id=message_id)
            offer.persisted = True  # shown, not stored: the stored error already says it
            await offer.send()

    @chat_handler
    async def handle_message(self, message: cl.Message) -> None:
        runtime = self.runtime()
        try:
            user_id = await self._session_user_id()
        except Exception as exc:
            if not is_database_outage(exc):
                raise
            # The session could not be checked, so nothing runs; the message stays, with Retry.
            await ChatSurface(self.presentations).failed(
                DATABASE_DOWN, thread_id=cl.context.session.thread_id, message_id=message.id
            )
            return
        flag_client_identity(message.metadata, where="message metadata", user_id=user_id)
        try:
            attachments = check_message(message.content, message.elements or [], runtime.settings)
        except InputRejected as exc:
            # The refused message leaves no trace: not in Chainlit's history, not in the checkpoint.
            await message.remove()
            await refuse(str(exc))
            return
        text = compose(message.content, attachments)
        profile = cl.user_session.get("chat_profile")
        temporary = bool(cl.user_session.get(TEMPORARY))
        if not temporary and runtime.runner.spec_for_profile(profile).memory_prefetch:
            _prefetch_recall_query(runtime, text)
        outcome = await runtime.runner.message(
            ChatSurface(self.presentations),
            user_id=user_id,
            thread_id=cl.context.session.thread_id,
            profile=profile,
            text=text,
            message_id=message.id,
            temporary=temporary,
        )
        if outcome.status in ("busy", "not_found", "refused"):
            # Refused: the conversation shows only what the graph actually received.
            await message.remove()

    @chat_handler
    async def edit_message(self, message: cl.Message, text: str, later: list[cl.Message]) -> None:
        """An earlier message edited: the conversation forks from before it (the runner finds the
        checkpoint, under the run lock, for the thread's owner only); the later messages leave the
        chat only once the fork is journalled. Attachments of the original message are not
        re-sent."""
        runtime = self.runtime()
        user_id = await self._session_user_id()
        try:
            check_message(text, [], runtime.settings)
        except InputRejected as exc:
            await refuse(str(exc))
            return

        thread_id = cl.context.session.thread_id
        edited = compose(text, [])

        async def on_fork() -> None:
            # Stored first, in one statement (Chainlit stores an update in a task of its own):
            # the runner has journalled the fork, and a resumed edit stores it the same way.
            await store_edit(runtime.pool, thread_id, message.id, edited)
            for step in later:
                await step.remove()
            message.content = edited
            await message.update()

        await runtime.runner.edit(
            ChatSurface(self.presentations),
            user_id=user_id,
            thread_id=thread_id,
            message_id=message.id,
            text=edited,
            on_fork=on_fork,
        )

    async def _checked(self, action: cl.Action, model: type[P]) -> tuple[str, P] | None:
        """Schema and session-thread checks every button press goes through (ownership and the
        pending question are the runner's)."""
        user_id = await self._session_user_id()
        flag_client_identity(action.payload, where=f"{action.name} action", user_id=user_id)
        try:
            return user_id, parse_payload(model, action, thread_id=cl.context.session.thread_id)
        except ActionRejected as exc:
            await refuse(str(exc))
            return None

    @chat_handler
    async def retry_turn(self, action: cl.Action) -> None:
        if (checked := await self._checked(action, RetryPayload)) is None:
            return
        user_id, payload = checked
        await action.remove()
        runtime = self.runtime()
        surface = ChatSurface(self.presentations, signals_task=True)
        if payload.message_id is None:
            await stoppable(
                runtime.runner.retry(surface, user_id=user_id, thread_id=payload.thread_id)
            )
            return
        await stoppable(
            self._resend(runtime, surface, user_id, payload.thread_id, payload.message_id)
        )

    async def _resend(
        self,
        runtime: AppRuntime,
        surface: ChatSurface,
        user_id: str,
        thread_id: str,
        message_id: str,
    ) -> None:
        """Retry of a message that failed while the database was away: its text is read back
        from the stored conversation (a payload's text would be the client's word)."""
        pending = getattr(get_data_layer(), "pending", None)
        if pending is not None:
            # Pressed as Postgres comes back: the message itself may still be held in this
            # worker (ui/chainlit/data_layer.py PendingWrites), not stored yet.
            await pending.settled(RETRY_SETTLE_S)
        try:
            text = await stored_user_message(runtime.pool, thread_id, message_id)
        except Exception as exc:
            if not is_database_outage(exc):
                raise
            await surface.failed(DATABASE_DOWN, thread_id=thread_id, message_id=message_id)
            return
        if text is None:
            await refuse(MESSAGE_GONE)
            return
        async with surface.running():
            await runtime.runner.resend(
                surface,
                user_id=user_id,
                thread_id=thread_id,
                profile=cl.user_session.get("chat_profile"),
                text=text,
                message_id=message_id,
                temporary=bool(cl.user_session.get(TEMPORARY)),
            )

    @chat_handler
    async def answer_question(self, action: cl.Action) -> None:
        """Any button under a paused run: confirm a memory, approve / edit / reject a plan."""
        if (checked := await self._checked(action, AnswerPayload)) is None:
            return
        user_id, payload = checked
        await stoppable(
            self.runtime().runner.answer(
                ChatSurface(self.presentations, signals_task=True),
                user_id=user_id,
                thread_id=payload.thread_id,
                interrupt_id=payload.interrupt_id,
                decision=payload.decision,
                ask=ask_text,
            )
        )
