"""Ending sessions: Chainlit's session is a signed cookie, so the server keeps what ended.

Signing out records that one session token (`cairn_ended_sessions`); "sign out everywhere" and
a wipe record a cut-off time for the user (`cairn_session_revocations`, graphs.core.fence).
Either is refused on every path, on every worker: HTTP routes, the websocket handshake and
every chat event.
"""

from __future__ import annotations

import hashlib
import logging
import time
from http.cookies import CookieError, SimpleCookie
from typing import TYPE_CHECKING, Any

import jwt
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse

from graphs.core import fence
from graphs.core.errors import is_database_outage
from graphs.core.notify import listen_forever

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from starlette.responses import Response
    from starlette.types import ASGIApp, Receive, Scope, Send

    from graphs.core.persistence import Pool

log = logging.getLogger("cairn.security")

_CACHE_ENTRIES = 100_000
"""Bounds the per-session cache (a client may present many different valid tokens)."""
_CACHE_SECONDS = 2.0
"""How long the request guard trusts one worker's last look at a user's cut-off. Only reads
can slip through in that window: every write is checked against the cut-off in Postgres
(graphs.core.fence), and chat events look it up afresh."""


LOGOUT_PATH = "/logout"
"""Chainlit's sign-out route (POST); the guard records the session as ended before it runs."""
SIGNED_OUT_CHANNEL = "cairn_session_signed_out"
"""Postgres NOTIFY channel: one session was signed out (payload: its session_key, in hex)."""


class SessionRevoked(fence.WriteRefused):
    """The signed-in session was ended (signed out, signed out everywhere, or account wiped)."""


def session_key(token: str) -> bytes:
    """What a signed-out session is recorded under: the SHA-256 of its signed part (header and
    claims). Only the auth secret can make that part, and any other spelling of the signature
    would still name the same session."""
    signed, _, _ = token.rpartition(".")
    return hashlib.sha256(signed.encode()).digest()


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
        self._ended: dict[bytes, tuple[float, bool]] = {}

    async def listen(
        self,
        on_ended: Callable[[str], Awaitable[object]],
        on_signed_out: Callable[[bytes], Awaitable[object]] | None = None,
    ) -> None:
        """Until cancelled: hear every worker's cut-offs and sign-outs (Postgres LISTEN), update
        the cached look and call on_ended(user_id) / on_signed_out(session_key) (this worker
        ends those live connections). A lost connection is opened again; anything missed
        meanwhile is still enforced in Postgres, and the cache forgets it within its 2 s."""

        async def heard(channel: str, payload: str) -> None:
            await self._heard(channel, payload, on_ended, on_signed_out)

        await listen_forever(
            self._pool, (fence.ENDED_CHANNEL, SIGNED_OUT_CHANNEL), heard, what="ended sessions"
        )

    async def _heard(
        self,
        channel: str,
        payload: str,
        on_ended: Callable[[str], Awaitable[object]],
        on_signed_out: Callable[[bytes], Awaitable[object]] | None,
    ) -> None:
        try:
            if channel == SIGNED_OUT_CHANNEL:
                key = bytes.fromhex(payload)
                self._ended[key] = (time.monotonic(), True)
                if on_signed_out is not None:
                    await on_signed_out(key)
                return
            self._cache.pop(payload, None)
            await on_ended(payload)
        except Exception:
            log.exception("ending the sessions of %s here failed", payload)

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

    async def end_session(self, token: str, claims: dict[str, Any]) -> None:
        """Sign this one session out: refused from now on by every worker until it would have
        expired anyway (the user's other sessions go on). Other workers hear of it at once
        (NOTIFY) and end its live chat connections."""
        key = session_key(token)
        expires = float(claims.get("exp") or time.time() + 30 * 24 * 3600)
        async with self._pool.connection() as conn, conn.transaction():
            # Piggy-back clean-up: only sessions that could still be used are kept.
            await conn.execute("DELETE FROM cairn_ended_sessions WHERE expires_at < now()")
            await conn.execute(
                "INSERT INTO cairn_ended_sessions (session_key, expires_at) "
                "VALUES (%s, to_timestamp(%s)) ON CONFLICT (session_key) DO NOTHING",
                (key, expires),
            )
            await conn.execute("SELECT pg_notify(%s, %s)", (SIGNED_OUT_CHANNEL, key.hex()))
        self._ended[key] = (time.monotonic(), True)
        log.info("signed out a session of user %s", claims.get("identifier"))

    async def is_ended(self, key: bytes, *, cached: bool = True) -> bool:
        """True when the session with this session_key was signed out."""
        now = time.monotonic()
        seen = self._ended.get(key)
        if seen is not None and (seen[1] or (cached and now - seen[0] < _CACHE_SECONDS)):
            return seen[1]  # a sign-out is for good: only "not ended" needs a fresh look
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT 1 FROM cairn_ended_sessions WHERE session_key = %s", (key,)
            )
            ended = await cur.fetchone() is not None
        if len(self._ended) > _CACHE_ENTRIES:
            self._ended.clear()
        self._ended[key] = (now, ended)
        return ended

    async def refuses(
        self, user_id: str, claims: dict[str, Any], token: str, *, cached: bool = True
    ) -> bool:
        """True when this session may not be used: signed out, or issued before the user's
        cut-off (signed out everywhere, account wiped)."""
        issued_at = float(claims["iat"]) if "iat" in claims else None
        if await self.is_revoked(user_id, issued_at, cached=cached):
            return True
        return await self.is_ended(session_key(token), cached=cached)

    async def check(self, user_id: str, token: str | None, secret: str) -> fence.Fence:
        """A chat event's session, looked up afresh (no cache); the authority its writes carry."""
        claims = token_claims(token, secret)
        issued_at = float(claims["iat"]) if claims and "iat" in claims else None
        if (
            claims is None
            or token is None
            or await self.refuses(user_id, claims, token, cached=False)
        ):
            log.warning("refused: ended session of user %s was used", user_id)
            raise SessionRevoked(fence.SESSION_ENDED)
        return fence.Fence(user_id, issued_at or 0.0)


class EndedSessionGuard:
    """ASGI middleware: a request (HTTP or the chat websocket's handshake) carrying an ended
    session is refused before any route, Chainlit's included, sees it; a sign-out (POST
    /logout) is recorded before Chainlit's route clears the cookie."""

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
        token = self.tokens.token(Headers(scope=scope))
        claims = token_claims(token, self.tokens.secret)
        user_id = claims.get("identifier") if claims else None
        if token is None or claims is None or not user_id:
            await self.app(scope, receive, send)
            return
        try:
            refused = await revocations.refuses(str(user_id), claims, token)
            if not refused and _is_sign_out(scope):
                await revocations.end_session(token, claims)
        except Exception as exc:
            if not is_database_outage(exc):
                raise
            # Not checked, so not let through; but not signed out either: try again later.
            log.warning("session of %s not checked: database unavailable (%s)", user_id, exc)
            await _unavailable(scope, receive, send)
            return
        if not refused:
            # Everything this request (or this chat connection) writes carries its session's
            # authority, so a wipe's cut-off refuses it wherever it is written.
            issued_at = float(claims["iat"]) if "iat" in claims else 0.0
            with fence.acting_for(fence.Fence(str(user_id), issued_at)):
                await self.app(scope, receive, send)
            return
        log.warning("refused: ended session of user %s at %s", user_id, scope.get("path"))
        await self._ended(scope, receive, send)

    async def _ended(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 4401})
            return
        response = JSONResponse(
            {"detail": "This session has ended. Please sign in again."}, status_code=401
        )
        self.clear_cookie(Request(scope), response)
        await response(scope, receive, send)


def _is_sign_out(scope: Scope) -> bool:
    return (
        scope["type"] == "http"
        and scope.get("method") == "POST"
        and (scope.get("path") == LOGOUT_PATH)
    )


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
