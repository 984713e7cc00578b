"""Ending sessions: Chainlit's session is a signed cookie, so "log out everywhere" is a
server-side cut-off time per user. A token issued before it is refused on every path:
HTTP routes, the websocket handshake and every chat event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from http.cookies import CookieError, SimpleCookie
from typing import TYPE_CHECKING, Any

import jwt
from psycopg import AsyncConnection
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse

from graphs.core import fence
from graphs.core.errors import is_database_outage

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from starlette.responses import Response
    from starlette.types import ASGIApp, Receive, Scope, Send

    from graphs.core.persistence import Pool

log = logging.getLogger("cairn.security")

_CACHE_SECONDS = 2.0
"""How long the request guard trusts one worker's last look at a user's cut-off. Only reads
can slip through in that window: every write is checked against the cut-off in Postgres
(graphs.core.fence), and chat events look it up afresh."""


class SessionRevoked(fence.WriteRefused):
    """The signed-in session was ended (its account's data was wiped)."""


def token_claims(token: str | None, secret: str) -> dict[str, Any] | None:
    """The verified claims of a session token, or None when there is none or it is invalid."""
    if not token:
        return None
    try:
        claims: dict[str, Any] = jwt.decode(token, secret, algorithms=["HS256"])
    except jwt.PyJWTError:
        return None
    return claims


class SessionTokens:
    """The session token a request carries (the chat's cookie, or a bearer header), verified.

    The cookie's name and layout are the chat framework's, so `from_cookies` comes from its
    adapter (ui/chainlit/identity.py); what is verified, and how, is decided here.
    """

    def __init__(
        self, *, secret: str, from_cookies: Callable[[Mapping[str, str]], str | None]
    ) -> None:
        self.secret = secret
        self._from_cookies = from_cookies

    def token(self, headers: Headers) -> str | None:
        token = self._from_cookies(dict(_cookies(headers.get("cookie", ""))))
        if not token and (auth := headers.get("authorization", "")).lower().startswith("bearer "):
            token = auth[7:]
        return token or None

    def claims(self, headers: Headers) -> dict[str, Any] | None:
        return token_claims(self.token(headers), self.secret)


class SessionRevocations:
    """Per-user cut-off times in Postgres, shared by every worker."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._cache: dict[str, tuple[float, float | None]] = {}

    async def listen(self, on_ended: Callable[[str], Awaitable[object]]) -> None:
        """Until cancelled: hear every worker's cut-offs (Postgres LISTEN), forget the cached
        look at that user and call on_ended (this worker ends the user's live connections).
        A lost connection is opened again; a cut-off missed meanwhile is still enforced
        in Postgres, and the cache forgets it within its 2 s."""
        while True:
            try:
                conninfo = self._pool.conninfo  # the app's pools are built from a URL string
                assert isinstance(conninfo, str)
                conn = await AsyncConnection.connect(conninfo, autocommit=True)
                async with conn:
                    await conn.execute(f"LISTEN {fence.ENDED_CHANNEL}")
                    async for notice in conn.notifies():
                        self._cache.pop(notice.payload, None)
                        try:
                            await on_ended(notice.payload)
                        except Exception:
                            log.exception("ending the sessions of %s here failed", notice.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("listening for ended sessions failed (%s); trying again", exc)
            await asyncio.sleep(1.0)

    async def revoke(self, user_id: str) -> None:
        """Every session of user_id issued up to now stops working, and every write they (or
        runs and jobs they started) would make, on any worker, is refused (graphs.core.fence)."""
        await fence.cut_off(self._pool, user_id)
        self._cache.pop(user_id, None)
        log.info("ended every session of user %s", user_id)

    async def cut_off(self, user_id: str, *, cached: bool = True) -> float | None:
        now = time.monotonic()
        seen = self._cache.get(user_id)
        if cached and seen is not None and now - seen[0] < _CACHE_SECONDS:
            return seen[1]
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT revoked_at FROM cairn_session_revocations WHERE user_id = %s", (user_id,)
            )
            row = await cur.fetchone()
        value = row["revoked_at"].timestamp() if row else None
        self._cache[user_id] = (now, value)
        return value

    async def is_revoked(
        self, user_id: str, issued_at: float | None, *, cached: bool = True
    ) -> bool:
        """True when the session was issued at or before the user's cut-off.

        Tokens carry whole seconds; one issued in the second of the cut-off itself counts as
        before it, so a session that existed during the wipe never survives it.
        """
        cut_off = await self.cut_off(user_id, cached=cached)
        if cut_off is None:
            return False
        return issued_at is None or int(issued_at) <= int(cut_off)

    async def check(self, user_id: str, token: str | None, secret: str) -> fence.Fence:
        """A chat event's session, looked up afresh (no cache); the authority its writes carry."""
        claims = token_claims(token, secret)
        issued_at = float(claims["iat"]) if claims and "iat" in claims else None
        if await self.is_revoked(user_id, issued_at, cached=False):
            log.warning("refused: ended session of user %s was used", user_id)
            raise SessionRevoked(fence.SESSION_ENDED)
        return fence.Fence(user_id, issued_at or 0.0)


class EndedSessionGuard:
    """ASGI middleware: a request (HTTP or the chat websocket's handshake) carrying an ended
    session is refused before any route, Chainlit's included, sees it."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        tokens: SessionTokens,
        revocations: Callable[[], SessionRevocations | None],
        clear_cookie: Callable[[Request, Response], None],
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.revocations = revocations
        self.clear_cookie = clear_cookie

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        revocations = self.revocations()
        if scope["type"] not in ("http", "websocket") or revocations is None:
            await self.app(scope, receive, send)
            return
        claims = self.tokens.claims(Headers(scope=scope))
        user_id = claims.get("identifier") if claims else None
        if claims is None or not user_id:
            await self.app(scope, receive, send)
            return
        issued_at = float(claims["iat"]) if "iat" in claims else None
        try:
            revoked = await revocations.is_revoked(str(user_id), issued_at)
        except Exception as exc:
            if not is_database_outage(exc):
                raise
            # Not checked, so not let through; but not signed out either: try again later.
            log.warning("session of %s not checked: database unavailable (%s)", user_id, exc)
            await _unavailable(scope, receive, send)
            return
        if not revoked:
            # Everything this request (or this chat connection) writes carries its session's
            # authority, so a wipe's cut-off refuses it wherever it is written.
            with fence.acting_for(fence.Fence(str(user_id), issued_at or 0.0)):
                await self.app(scope, receive, send)
            return
        log.warning("refused: ended session of user %s at %s", user_id, scope.get("path"))
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 4401})
            return
        response = JSONResponse(
            {"detail": "This session has ended. Please sign in again."}, status_code=401
        )
        self.clear_cookie(Request(scope), response)
        await response(scope, receive, send)


async def _unavailable(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1013})  # try again later
        return
    response = JSONResponse(
        {"detail": "Cairn's database is unavailable. Please try again in a moment."},
        status_code=503,
        headers={"Retry-After": "2"},
    )
    await response(scope, receive, send)


def _cookies(header: str) -> list[tuple[str, str]]:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except CookieError:
        return []
    return [(key, morsel.value) for key, morsel in jar.items()]
