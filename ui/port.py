"""The one port through which pages, MCP and recovery reach the chat; the Chainlit adapter
(ui/chainlit/adapter.py) implements it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from ui.runner import Surface


class ChatPort(Protocol):
    """What the rest of the app may do to the chat, with no chat framework in sight."""

    async def append_reply(
        self, thread_id: str, text: str, *, author: str = "Cairn", once: bool = False
    ) -> None:
        """Add a reply to a stored conversation, outside any live chat session (a run answered
        from a page, resumed for a user not connected). `once`: not when the conversation
        already ends on the same reply (a resumed run may have delivered it)."""
        ...

    async def add_outside_turn(
        self, *, thread_id: str, user_id: str, profile: str, text: str
    ) -> None:
        """A message sent from outside the chat (MCP): the conversation appears in the user's
        sidebar, opening in the agent's profile, with the message in it."""
        ...

    async def store_edit(self, thread_id: str, message_id: str, text: str) -> None:
        """The stored conversation as an edit of the user's message leaves it: the new text,
        nothing after it (idempotent: a resumed edit's run does it again)."""
        ...

    async def end_sessions(self, user_id: str) -> int:
        """Close this worker's live chat connections of the user; how many there were."""
        ...

    async def end_session(self, key: bytes) -> int:
        """Close this worker's live chat connections of one signed-out session (by
        auth.sessions.session_key of its token); how many there were."""
        ...

    async def reconnect_elsewhere(self) -> int:
        """Close every live chat connection on this worker as a lost connection (the browser
        reconnects on its own, to a live worker); how many there were."""
        ...

    async def tell_live(self, *, thread_id: str, user_id: str, text: str) -> bool:
        """A passing notice (not stored) in the user's open chat of that conversation on this
        worker; False when they have none open here. Call it in a task of its own."""
        ...

    def live_surface(self, *, thread_id: str, user_id: str) -> Surface | None:
        """The user's open chat of that conversation on this worker, as the surface a resumed
        run streams into; None when they have none open here."""
        ...

    def sign_out(self, request: Request, response: Response) -> None:
        """Clear the session cookie on the response (the server-side cut-off is auth's)."""
        ...
