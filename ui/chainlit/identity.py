"""The signed-in user of a Chainlit socket event, and Chainlit's session cookie, for auth/."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from chainlit.auth.cookie import clear_auth_cookie, get_token_from_cookies
from chainlit.context import context

from auth.identity import NotAuthenticated

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

SESSION_COOKIE = b"access_token"
"""Chainlit's session cookie (auth/cookie.py `_auth_cookie_name`) and the prefix of its chunks."""


def session_user_id() -> str:
    """user_id of the current Chainlit websocket/HTTP context: its verified user's identifier
    (set from the login's verified claims, auth/oauth.py)."""
    identifier = getattr(context.session.user, "identifier", None)
    if not identifier:
        msg = "no authenticated user in this session"
        raise NotAuthenticated(msg)
    return str(identifier)


def session_token(cookies: Mapping[str, str]) -> str | None:
    """The session token in a request's cookies (Chainlit splits a long one over several)."""
    return get_token_from_cookies(dict(cookies))


def clear_session_cookie(request: Request, response: Response) -> None:
    clear_auth_cookie(request, response)


class SessionCookieFlags:
    """ASGI middleware: the session cookie leaves as strictly as the deployment allows.

    Chainlit sets it SameSite=Lax and Secure only with SameSite=None (auth/cookie.py), so a page
    of another site could still make top-level navigations that carry it. SameSite=Strict keeps
    it to requests this site itself makes (the UI's own fetches and socket): a link from
    elsewhere opens the page, whose requests then carry it. Behind https it is Secure too.
    Chainlit's OAuth state cookie stays Lax, or a real provider's redirect back would lose it.
    """

    def __init__(self, app: ASGIApp, *, secure: bool) -> None:
        self.app = app
        self.secure = secure

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def flagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [
                    (name, self._flag(value) if name.lower() == b"set-cookie" else value)
                    for name, value in message.get("headers", [])
                ]
            await send(message)

        await self.app(scope, receive, flagged)

    def _flag(self, value: bytes) -> bytes:
        if not value.startswith(SESSION_COOKIE):
            return value
        parts = [p.strip() for p in value.split(b";")]
        kept = [p for p in parts if not p.lower().startswith((b"samesite", b"secure"))]
        kept.append(b"SameSite=strict")
        if self.secure:
            kept.append(b"Secure")
        return b"; ".join(kept)
