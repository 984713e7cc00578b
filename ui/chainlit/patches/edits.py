"""Edits: an edited message forks the LangGraph thread instead of re-sending it on the old history."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from chainlit.chat_context import chat_context
from chainlit.context import init_ws_context
from chainlit.message import ErrorMessage
from chainlit.session import WebsocketSession

from auth.ownership import NOT_FOUND

log = logging.getLogger("cairn.security")


EditHandler = Callable[[Any, str, list[Any]], Awaitable[None]]
"""Cairn's edit handler: (the edited message, its new text, the messages after it)."""


_edit_handler: EditHandler | None = None

EDIT_PINS = {
    "chainlit.socket.edit_message": "ba23f62f2a509ee9",
}
"""The Chainlit code this module relies on (qualified name: digest of its source as checked),
tripped by tests/unit/test_chainlit_patches.py when an upgrade changes it."""


def on_message_edit(handler: EditHandler) -> EditHandler:
    """Register the handler every message edit goes to (app.py: ui/chat.edit_message)."""
    global _edit_handler
    _edit_handler = handler
    return handler


def route_message_edits(sio: Any) -> None:
    """Replace Chainlit's `edit_message` socket handler (socket.py `edit_message`).

    Before: Chainlit removed every later message, changed the text, and called `on_message`
    again, so the graph got the edited text on top of the whole old history, the removal
    happened even when the run was then refused (thread busy), and an id not in the session
    reached `on_message(None)`. Here: only a user message of this session's conversation can be
    edited (anything else gets the missing-thread refusal), and Cairn's handler decides when
    the later messages go (under the run lock, once the fork is certain).
    """
    handlers: dict[str, Any] = sio.handlers["/"]
    if getattr(handlers.get("edit_message"), "cairn_edits", False):
        return

    async def edit_message(sid: str, payload: dict[str, Any]) -> None:
        session = WebsocketSession.require(sid)
        context = init_ws_context(session)
        wanted = payload["message"]["id"]
        messages = chat_context.get()
        index = next(
            (
                i
                for i, m in enumerate(messages)
                if m.id == wanted and getattr(m, "type", None) == "user_message"
            ),
            None,
        )
        if index is None or _edit_handler is None:
            log.warning("refused: edit of message %s not in socket %s's chat", wanted[:64], sid)
            error = ErrorMessage(content=NOT_FOUND)
            error.parent_id = None
            await error.send()
            return
        await context.emitter.task_start()
        # What Chainlit's Stop cancels (socket.py `stop`), as for a sent message: the edit's
        # run went on under the "Task manually stopped." notice.
        session.current_task = asyncio.current_task()
        try:
            await _edit_handler(
                messages[index], payload["message"]["output"], messages[index + 1 :]
            )
        except asyncio.CancelledError:
            pass
        finally:
            await context.emitter.task_end()

    edit_message.cairn_edits = True  # type: ignore[attr-defined]
    handlers["edit_message"] = edit_message
