"""The runner's output in a Chainlit chat: notices, errors with Retry, questions with buttons."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

import chainlit as cl
from chainlit.context import context
from chainlit.utils import utc_now

from ui.chainlit.actions import ANSWER_ACTION, RETRY_ACTION
from ui.chainlit.patches.sessions import task_signals
from ui.surface import HeadlessView

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from langgraph.types import Interrupt, StateSnapshot

    from graphs.core.context import Context
    from graphs.core.usage import RunUsage
    from ui.runner import AgentSpec, InterruptKind, LoadState, Status, View

REPLY_PINS = {
    "chainlit.message.MessageBase.stream_token": "eafad86fddd936dd",
    "chainlit.message.Message.send": "cac98893ff2f1ead",
    "chainlit.message.Message.update": "e70206606d0113d8",
    "chainlit.message.MessageBase.remove": "a0424e92d878704f",
}
"""The Chainlit code this module relies on (qualified name: digest of its source as checked),
tripped by tests/unit/test_chainlit_patches.py when an upgrade changes it."""


class Looks(Protocol):
    """What one agent looks like in the chat (ui/chainlit/agents/ `Presentation`)."""

    @property
    def view(self) -> Callable[[Context], View]: ...

    @property
    def restore(self) -> Callable[[StateSnapshot], Awaitable[None]] | None: ...


class Presentations(Protocol):
    """Every agent's looks, by agent key, and how each kind of question is asked."""

    def of(self, key: str) -> Looks: ...

    def question(self, kind: str) -> Callable[[Interrupt, str], Awaitable[None]] | None: ...


log = logging.getLogger("cairn")

MAX_TRACKED_PROMPTS = 1000
_prompts: dict[str, cl.Message] = {}
"""The live question message of each pending interrupt (ids are unique across threads), in
this worker; kept outside the user session, which Chainlit replaces on every resume. Only a
convenience for taking buttons off: a press is always checked against the checkpoint."""


def buttons(thread_id: str, interrupt_id: str, labels: dict[str, str]) -> list[cl.Action]:
    """One button per decision; every kind of question uses the same action and payload."""
    return [
        cl.Action(
            name=ANSWER_ACTION,
            label=label,
            payload={"thread_id": thread_id, "interrupt_id": interrupt_id, "decision": decision},
        )
        for decision, label in labels.items()
    ]


async def ask_question(
    interrupt_id: str, thread_id: str, text: str, labels: dict[str, str], *, author: str = "Cairn"
) -> cl.Message:
    """A question with its buttons, tracked so they can be taken off once answered."""
    message = cl.Message(
        content=text, author=author, actions=buttons(thread_id, interrupt_id, labels)
    )
    await message.send()
    await remember_prompt(interrupt_id, message)
    return message


async def remember_prompt(interrupt_id: str, message: cl.Message) -> None:
    """A question shown again (the browser may resume a thread twice) replaces its earlier
    copy instead of leaving two sets of live buttons."""
    previous = _prompts.pop(interrupt_id, None)
    if previous is not None and previous.id != message.id:
        await previous.remove()
    _prompts[interrupt_id] = message
    while len(_prompts) > MAX_TRACKED_PROMPTS:
        _prompts.pop(next(iter(_prompts)))


def retry_message(text: str, *, thread_id: str, message_id: str | None = None) -> cl.Message:
    """An error with Retry. One for a message that failed while the database was away names
    it in its stored metadata, so a reopened conversation offers the Retry again (Chainlit
    stores no buttons)."""
    payload = {"thread_id": thread_id}
    if message_id is not None:
        payload["message_id"] = message_id
    return cl.Message(
        author="Cairn",
        content=text,
        actions=[cl.Action(name=RETRY_ACTION, label="Retry", payload=payload)],
        metadata={"retry_message_id": message_id} if message_id is not None else {},
    )


STREAM_WINDOW_S = 0.04
"""Tokens that arrive within this long of the last socket message go out together in the next
one. A model streams a token every 10-50 ms, so the text still grows smoothly, but a burst
(a fast model, a finished report, the offline model) costs one socket message per window
instead of one per word: each message is a socket.io emit, an output-sanitiser pass and a
websocket frame, about 0.1 ms of the worker's CPU (bench/README.md, "Sessions per worker")."""


class Reply(cl.Message):
    """A streamed reply: its first token is sent at once (time to first token is unchanged),
    later ones are coalesced per STREAM_WINDOW_S. The content is always whole; only the socket
    messages wait, and a final send, update or removal carries the content itself, so what is
    held then is dropped rather than sent twice."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._held: list[str] = []
        self._sent_at = -math.inf
        self._timer: asyncio.TimerHandle | None = None
        self._later: asyncio.Future[None] | None = None

    async def stream_token(self, token: str, is_sequence: bool = False) -> None:
        if is_sequence or not self.streaming:
            self._drop_held()
            self._sent_at = time.monotonic()
            await super().stream_token(token, is_sequence=is_sequence)
            return
        if not token:
            return
        self.content += token
        self._held.append(token)
        wait = self._sent_at + STREAM_WINDOW_S - time.monotonic()
        if wait <= 0:
            await self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(wait, self._flush_later)

    def _flush_later(self) -> None:
        self._timer = None
        # Scheduled from the streaming task, so it runs in that task's context (the session).
        self._later = asyncio.ensure_future(self.flush())

    def _drop_held(self) -> None:
        self._held.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def flush(self) -> None:
        """Send the held tokens now."""
        text = "".join(self._held)
        self._drop_held()
        if text and self.streaming:
            self._sent_at = time.monotonic()
            await context.emitter.send_token(id=self.id, token=text, is_sequence=False)

    async def send(self) -> Reply:
        self._drop_held()
        await super().send()
        return self

    async def update(self) -> bool:
        self._drop_held()
        return await super().update()

    async def remove(self) -> bool:
        self._drop_held()
        return await super().remove()


def new_reply(*, author: str | None = None) -> Reply:
    """A reply dated when its first token arrives, so it sorts below the steps that led to it
    and above what follows it (Chainlit would date it when the stream ends)."""
    message = Reply(content="", created_at=utc_now())
    if author is not None:
        message.author = author
    return message


async def refuse(text: str) -> None:
    """An error shown at the top level of the conversation (never nested under a removed step)."""
    error = cl.ErrorMessage(content=text)
    error.parent_id = None
    await error.send()


async def show_usage(usage: RunUsage) -> None:
    """A run's tokens and estimated cost below its reply: a closed step, out of the way."""
    step = cl.Step(name="Usage", type="tool", default_open=False, show_input=False)
    step.output = usage.summary()
    # Sent finished, so the data layer stores it with the reply at once (an open step waits).
    step.start = step.end = utc_now()
    await step.send()


async def ask_text(question: str, seconds: int) -> str | None:
    """The user's typed answer to a question (an Edit), or None when none came in time."""
    answer = await cl.AskUserMessage(content=question, author="Cairn", timeout=seconds).send()
    text = str((answer or {}).get("output", "")).strip()
    return text or None


class ChatSurface:
    """The runner's surface for the signed-in user's live chat session."""

    def __init__(self, presentations: Presentations, *, signals_task: bool = False) -> None:
        self.presentations = presentations
        """How each agent's runs and questions look in the chat (ui/chainlit/agents/)."""
        self.signals_task = signals_task
        """True for button answers: Chainlit sends no task signals around action callbacks."""

    def view(self, spec: AgentSpec, context: Context) -> View:
        return self.presentations.of(spec.key).view(context)

    async def restore(self, spec: AgentSpec, state: StateSnapshot) -> None:
        restore = self.presentations.of(spec.key).restore
        if restore is not None:
            await restore(state)

    async def notice(self, text: str) -> None:
        await cl.Message(content=text, author="Cairn").send()

    async def refuse(self, text: str) -> None:
        await refuse(text)

    async def usage(self, usage: RunUsage) -> None:
        if usage.model_calls:
            await show_usage(usage)

    async def failed(self, text: str, *, thread_id: str, message_id: str | None = None) -> None:
        await retry_message(text, thread_id=thread_id, message_id=message_id).send()

    async def show_interrupt(
        self, kind: InterruptKind | None, interrupt: Any, thread_id: str
    ) -> None:
        render = self.presentations.question(kind.name) if kind is not None else None
        if render is not None:
            await render(interrupt, thread_id)
            return
        await ask_question(
            interrupt.id,
            thread_id,
            "The assistant is waiting for your answer.",
            {"confirm": "Continue", "reject": "Cancel"},
        )

    async def clear_prompt(self, interrupt_id: str) -> None:
        if (message := _prompts.pop(interrupt_id, None)) is not None:
            await message.remove_actions()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        if not self.signals_task:
            yield
            return
        async with task_signals():
            yield


class PlainView(HeadlessView):
    """An agent without a presentation module: its reply once the run is done, and nothing
    else (the headless view's reading of the finished state, sent to the chat)."""

    def __init__(self, spec: AgentSpec) -> None:
        super().__init__(spec)
        self.reply: Any = None
        self.first_token_at: float | None = None

    async def end(self, status: Status, load_state: LoadState) -> str | None:
        text = await super().end(status, load_state)
        if text:
            self.reply = new_reply()
            self.reply.content = text
            await self.reply.send()
        return text
