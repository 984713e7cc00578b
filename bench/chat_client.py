"""A Chainlit chat over socket.io as the web client speaks it, timing each turn's first token."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import socketio

SOCKET_PATH = "/ws/socket.io"
TURN_TIMEOUT_S = 10.0
CHAT_START_WAIT_S = 1.0
_WATCHED_EVENTS = ("task_start", "task_end", "stream_start", "new_message")


class TurnFailed(RuntimeError):
    """A turn timed out or did not end with the expected reply."""


@dataclass(frozen=True)
class Turn:
    """One timed exchange: milliseconds from sending the message."""

    ttft_ms: float
    """To the first streamed token of the reply (Chainlit's `stream_start`, which carries it)."""
    total_ms: float
    """To `task_end`, when the server finished the handler."""
    reply: str


@dataclass
class _Event:
    name: str
    data: Any
    at: float


@dataclass
class _TurnProgress:
    """What one turn has shown so far: the reply's first token, then its final text."""

    first_token_at: float | None = None
    reply_id: str | None = None
    reply: str | None = None
    ended_at: float = 0.0

    def see(self, event: _Event) -> None:
        if event.name == "stream_start" and self.reply_id is None and _is_reply(event.data):
            self.first_token_at, self.reply_id = event.at, event.data["id"]
        elif (
            event.name == "new_message" and self.reply_id and event.data.get("id") == self.reply_id
        ):
            self.reply = str(event.data.get("output", ""))


class ChatSession:
    """One browser tab: a socket.io connection, one Chainlit session, one conversation."""

    def __init__(self, base_url: str, *, cookie: str = "", chat_profile: str | None = None) -> None:
        self._base_url = base_url
        self._cookie = cookie
        self._chat_profile = chat_profile
        self._events: asyncio.Queue[_Event] = asyncio.Queue()
        self._sio = socketio.AsyncClient(reconnection=False)
        for name in _WATCHED_EVENTS:
            self._sio.on(name, self._recorder(name))

    def _recorder(self, name: str) -> Any:
        # Synchronous on purpose: the arrival time is taken before anything else can run.
        def record(data: Any = None) -> None:
            self._events.put_nowait(_Event(name, data, time.perf_counter()))

        return record

    async def open(self) -> None:
        auth = {
            "sessionId": str(uuid.uuid4()),
            # What the web client sends for a new chat; a non-empty id would be resumed.
            "threadId": "",
            "clientType": "webapp",
            "chatProfile": quote(self._chat_profile) if self._chat_profile else "",
            "userEnv": "{}",
        }
        # As a browser: the app refuses a chat socket from any other origin (ui/origin_guard.py).
        headers = {"Origin": self._base_url.rstrip("/")}
        if self._cookie:
            headers["Cookie"] = self._cookie
        await self._sio.connect(
            self._base_url,
            headers=headers,
            auth=auth,
            transports=["websocket"],
            socketio_path=SOCKET_PATH,
            wait_timeout=TURN_TIMEOUT_S,
        )
        await self._sio.emit("connection_successful")
        # connection_successful answers with a task_end of its own; consume it here.
        await self._next_event("task_end", deadline=time.perf_counter() + TURN_TIMEOUT_S)
        await self._wait_for_chat_start()

    async def _wait_for_chat_start(self) -> None:
        """An on_chat_start hook runs as a task of its own: let it finish, as a reader would."""
        try:
            await self._next_event("task_start", deadline=time.perf_counter() + CHAT_START_WAIT_S)
        except TurnFailed:
            return  # no on_chat_start hook
        await self._next_event("task_end", deadline=time.perf_counter() + TURN_TIMEOUT_S)

    async def close(self) -> None:
        await self._sio.disconnect()

    async def turn(self, text: str) -> Turn:
        """Send `text`; return once the server ends the task, timing the first reply token."""
        self._discard_pending()
        started = time.perf_counter()
        await self._sio.emit("client_message", _user_message(text))
        progress = _TurnProgress()
        try:
            await self._follow(progress, deadline=started + TURN_TIMEOUT_S)
        except TurnFailed:
            seen = "after its first token" if progress.first_token_at else "before any token"
            msg = f"timed out after {TURN_TIMEOUT_S:.0f} s, {seen}"
            raise TurnFailed(msg) from None
        if progress.first_token_at is None or progress.reply is None:
            msg = f"the task ended without a streamed reply (reply: {progress.reply!r})"
            raise TurnFailed(msg)
        return Turn(
            ttft_ms=(progress.first_token_at - started) * 1000,
            total_ms=(progress.ended_at - started) * 1000,
            reply=progress.reply,
        )

    async def _follow(self, progress: _TurnProgress, *, deadline: float) -> None:
        """Read events until the message's task ends: every task_start has had its task_end."""
        open_tasks = 0
        while True:
            event = await self._next_event(*_WATCHED_EVENTS, deadline=deadline)
            if event.name == "task_start":
                open_tasks += 1
            elif event.name == "task_end" and open_tasks:
                open_tasks -= 1
                if not open_tasks:
                    progress.ended_at = event.at
                    return
            else:
                progress.see(event)

    async def _next_event(self, *names: str, deadline: float) -> _Event:
        while True:
            remaining = deadline - time.perf_counter()
            try:
                event = await asyncio.wait_for(self._events.get(), max(remaining, 0))
            except TimeoutError:
                msg = f"no {'/'.join(names)} event before the deadline"
                raise TurnFailed(msg) from None
            if event.name in names:
                return event

    def _discard_pending(self) -> None:
        while not self._events.empty():
            self._events.get_nowait()


def _user_message(text: str) -> dict[str, Any]:
    """The `client_message` payload, shaped like the web client's."""
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    message = {
        "threadId": "",
        "id": str(uuid.uuid4()),
        "name": "User",
        "type": "user_message",
        "output": text,
        "createdAt": now,
        "metadata": {"location": "http://localhost/"},
    }
    return {"message": message, "fileReferences": []}


def _is_reply(step: Any) -> bool:
    return isinstance(step, dict) and step.get("type") == "assistant_message"
