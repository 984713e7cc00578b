"""Sessions: Chainlit's socket registry, context and task signals, for code outside a socket event."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from chainlit.context import context as chainlit_context
from chainlit.context import init_ws_context
from chainlit.session import WebsocketSession, ws_sessions_id

from auth.sessions import session_key

log = logging.getLogger("cairn.security")
T = TypeVar("T")

SESSION_PINS = {
    "chainlit.context.init_ws_context": "c3d4ceaec38b2fd6",
    "chainlit.emitter.ChainlitEmitter.task_start": "8ef945646a14e8be",
    "chainlit.emitter.ChainlitEmitter.task_end": "bfb2c3a2969eccff",
    "chainlit.session.WebsocketSession.__init__": "497d8ea08531b384",
}
"""The Chainlit code this module relies on (qualified name: digest of its source as checked),
tripped by tests/unit/test_chainlit_patches.py when an upgrade changes it."""


@asynccontextmanager
async def task_signals() -> AsyncIterator[None]:
    """Show the run as busy, and idle again afterwards.

    Chainlit sends `task_start`/`task_end` around `on_message` only (socket.py
    `process_message`); action callbacks run without them, and an AskUserMessage ends the task
    early (emitter.py `send_ask_user`): without this the input and the next buttons stay
    disabled.
    """
    await chainlit_context.emitter.task_start()
    try:
        yield
    finally:
        await chainlit_context.emitter.task_end()


async def stoppable(work: Awaitable[T]) -> T | None:
    """Run `work` as the live session's current task: the one Chainlit's Stop cancels
    (socket.py `stop`). None if Stop cancelled it.

    A button's callback runs inside Chainlit's HTTP request (server.py `call_action`), a task
    Stop knows nothing of: Stop pressed under an approved plan or a retried turn posted its
    notice and the run went on. Run apart from the request, a Stop ends only the run; the
    request itself cancelled (its client gone) cancels the run too, as before.
    """
    task = asyncio.ensure_future(work)
    session = chainlit_context.session
    if isinstance(session, WebsocketSession):
        session.current_task = task
    try:
        return await task
    except asyncio.CancelledError:
        request = asyncio.current_task()
        if request is not None and request.cancelling():
            raise
        return None


SIGNED_OUT = {"cairn": "signed_out"}
"""Told to a chat whose session ended, before its connection closes: Chainlit relays a
window_message to the page (window.parent.postMessage), where public/cairn.js takes the tab
to the sign-in page. A connection that is only closed would sit on a dead chat."""


async def _end(sio: Any, socket_id: str) -> None:
    try:
        await sio.emit("window_message", SIGNED_OUT, to=socket_id)
    finally:
        await sio.disconnect(socket_id)


async def disconnect_user_sockets(user_id: str) -> int:
    """End this worker's live chat connections of the user; returns how many.

    Chainlit keeps its sessions in session.py `ws_sessions_id` only (no public look-up by
    user); other workers refuse the ended session at its next event.
    """
    from chainlit.server import sio

    sessions = [s for s in list(ws_sessions_id.values()) if isinstance(s, WebsocketSession)]
    ended = 0
    for session in sessions:
        if getattr(session.user, "identifier", None) == user_id:
            await _end(sio, session.socket_id)
            ended += 1
    return ended


async def disconnect_session_sockets(key: bytes) -> int:
    """End this worker's live chat connections of one signed-out session (by
    auth.sessions.session_key of its token); returns how many. As disconnect_user_sockets."""
    from chainlit.server import sio

    sessions = [s for s in list(ws_sessions_id.values()) if isinstance(s, WebsocketSession)]
    ended = 0
    for session in sessions:
        if session.token and session_key(session.token) == key:
            await _end(sio, session.socket_id)
            ended += 1
    return ended


async def close_all_transports() -> int:
    """Close every socket.io connection of this worker at the transport (engine.io) level;
    returns how many. The client takes that for a lost connection and reconnects by itself,
    where a socket.io disconnect (disconnect_user_sockets) tells it not to come back."""
    from chainlit.server import sio

    closed = 0
    for eio_sid in list(sio.eio.sockets):
        await sio.eio.disconnect(eio_sid)
        closed += 1
    return closed


def enter_live_session(*, thread_id: str, user_id: str) -> bool:
    """Make the user's open chat of that conversation on this worker, if any, the current
    Chainlit context (so a resumed run streams into it); returns whether there was one.

    Chainlit looks sessions up by socket id only (session.py `ws_sessions_id`) and sets the
    context from a socket event (context.py `init_ws_context`); a run resumed by the server
    has no event.
    """
    session = next(
        (
            s
            for s in list(ws_sessions_id.values())
            if isinstance(s, WebsocketSession)
            and s.thread_id == thread_id
            and getattr(s.user, "identifier", None) == user_id
        ),
        None,
    )
    if session is None:
        return False
    init_ws_context(session)
    return True
