"""Sign-out on a real Postgres, two workers (two pools, two guards): a signed-out, expired or
cut-off session is refused on HTTP, the websocket handshake and chat events, on the worker
that signed it out and on the other; the user's other sessions go on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import jwt
import pytest

from auth.sessions import (
    EndedSessionGuard,
    SessionRevocations,
    SessionRevoked,
    SessionTokens,
    session_key,
)
from auth.tokens import AccessTokens, TokenLimits, TokenRejected
from graphs.core import fence
from graphs.core.migrations import migrate
from graphs.core.persistence import Pool, make_pool
from ui.chainlit.identity import clear_session_cookie, session_token

pytestmark = pytest.mark.integration

SECRET = "a-shared-auth-secret-of-more-than-32-characters"


@dataclass
class Worker:
    """The session guard in front of a stand-in app that answers who it acts for."""

    revocations: SessionRevocations
    guard: EndedSessionGuard = field(init=False)
    reached: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.guard = EndedSessionGuard(
            self._inner,
            tokens=SessionTokens(secret=SECRET, from_cookies=session_token),
            revocations=lambda: self.revocations,
            clear_cookie=clear_session_cookie,
        )

    async def _inner(self, scope: Any, receive: Any, send: Any) -> None:
        authority = fence.current()
        self.reached.append(f"{scope['type']} {scope['path']}")
        if scope["type"] == "websocket":
            await send({"type": "websocket.accept"})
            return
        body = (authority.user_id if authority else "-").encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    async def get(self, token: str, path: str = "/api/memory", *, bearer: bool = False) -> int:
        return (await self.request("GET", path, token, bearer=bearer)).status_code

    async def request(
        self, method: str, path: str, token: str, *, bearer: bool = False
    ) -> httpx.Response:
        headers = (
            {"Authorization": f"Bearer {token}"} if bearer else {"Cookie": f"access_token={token}"}
        )
        transport = httpx.ASGITransport(app=self.guard)
        async with httpx.AsyncClient(transport=transport, base_url="http://cairn") as http:
            return await http.request(method, path, headers=headers)

    async def handshake(self, token: str) -> dict[str, Any]:
        """The chat websocket's handshake; returns what the server sent first."""
        sent: list[dict[str, Any]] = []
        scope = {
            "type": "websocket",
            "path": "/ws/socket.io/",
            "headers": [(b"cookie", f"access_token={token}".encode())],
        }

        async def receive() -> dict[str, Any]:
            return {"type": "websocket.connect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await self.guard(scope, receive, send)
        return sent[0]


@pytest.fixture(scope="module")
async def pools(database_url: str) -> AsyncIterator[list[Pool]]:
    found = [make_pool(database_url, max_size=4), make_pool(database_url, max_size=4)]
    for pool in found:
        await pool.open(wait=True)
    await migrate(found[0])
    yield found
    for pool in found:
        await pool.close()


@pytest.fixture
def workers(pools: list[Pool]) -> tuple[Worker, Worker]:
    return Worker(SessionRevocations(pools[0])), Worker(SessionRevocations(pools[1]))


_issued = 0


def session(user: str, *, issued: float | None = None, lives: float = 8 * 3600) -> str:
    """A session token as Chainlit signs it (each one distinct, like two sign-ins)."""
    global _issued
    _issued += 1
    now = issued if issued is not None else time.time()
    claims = {"identifier": user, "metadata": {"n": _issued}, "iat": int(now)}
    claims["exp"] = int(now + lives)
    return jwt.encode(claims, SECRET, algorithm="HS256")


def new_user() -> str:
    return f"cairn:{time.monotonic_ns()}"


async def test_a_signed_out_session_is_refused_on_every_worker_and_path(
    workers: tuple[Worker, Worker],
) -> None:
    first, second = workers
    user = new_user()
    signed_out, other = session(user), session(user)
    # The second worker has just looked at the session: its cache says "fine".
    assert await second.get(signed_out) == 200

    heard: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_signed_out(key: bytes) -> None:
        await heard.put(key)

    async def on_ended(user_id: str) -> None:
        return None

    listening = asyncio.create_task(second.revocations.listen(on_ended, on_signed_out))
    await asyncio.sleep(0.5)  # LISTEN is in place
    try:
        logout = await first.request("POST", "/logout", signed_out)
        assert logout.status_code == 200  # Chainlit's own route ran and clears the cookie
        assert first.reached[-1] == "http /logout"
        # The other worker hears of it and ends that session's live connections.
        assert await asyncio.wait_for(heard.get(), timeout=10) == session_key(signed_out)
    finally:
        listening.cancel()

    for worker in (first, second):
        refused = await worker.request("GET", "/api/memory", signed_out)
        assert refused.status_code == 401
        assert "access_token" in refused.headers.get("set-cookie", "")  # cleared
        assert await worker.get(signed_out, "/api/tokens") == 401
        assert await worker.get(signed_out, bearer=True) == 401
        assert (await worker.handshake(signed_out)) == {"type": "websocket.close", "code": 4401}
        with pytest.raises(SessionRevoked):
            await worker.revocations.check(user, signed_out, SECRET)
        # Signing out again changes nothing; the user's other session goes on.
        assert (await worker.request("POST", "/logout", signed_out)).status_code == 401
        assert (await worker.request("GET", "/api/memory", other)).text == user
        assert (await worker.handshake(other))["type"] == "websocket.accept"
        assert (await worker.revocations.check(user, other, SECRET)).user_id == user


async def test_a_chat_event_sees_a_sign_out_on_another_worker_at_once(
    workers: tuple[Worker, Worker],
) -> None:
    """No listener, a warm cache: chat events look afresh, HTTP within the cache's 2 s."""
    first, second = workers
    user = new_user()
    token = session(user)
    assert await second.get(token) == 200

    await first.request("POST", "/logout", token)

    with pytest.raises(SessionRevoked):
        await second.revocations.check(user, token, SECRET)
    await asyncio.sleep(2.1)
    assert await second.get(token) == 401


async def test_a_signature_spelled_otherwise_names_the_same_session(
    workers: tuple[Worker, Worker],
) -> None:
    first, second = workers
    user = new_user()
    token = session(user)
    await first.request("POST", "/logout", token)
    head, claims, signature = token.split(".")

    other_last = "A" if signature[-1] != "A" else "B"
    for variant in (f"{token}=", f"{head}.{claims}.{signature[:-1]}{other_last}"):
        # Either not a valid session at all, or the same signed-out one.
        assert await second.get(variant) in (200, 401)
        if jwt_valid(variant):
            assert await second.get(variant) == 401
        assert session_key(variant) == session_key(token)


def jwt_valid(token: str) -> bool:
    try:
        jwt.decode(token, SECRET, algorithms=["HS256"])
    except jwt.PyJWTError:
        return False
    return True


async def test_an_expired_session_cannot_chat(workers: tuple[Worker, Worker]) -> None:
    """A chat connection opened before its session expired is refused at its next event."""
    _, second = workers
    user = new_user()
    expired = session(user, issued=time.time() - 3600, lives=60)
    with pytest.raises(SessionRevoked):
        await second.revocations.check(user, expired, SECRET)
    with pytest.raises(SessionRevoked):
        await second.revocations.check(user, "not-a-token", SECRET)
    # The guard lets it pass as no session at all (Chainlit's routes then answer 401): it
    # acts for nobody.
    assert (await second.request("GET", "/api/memory", expired)).text == "-"


async def test_sign_out_everywhere_ends_every_session_and_access_token(
    workers: tuple[Worker, Worker], pools: list[Pool]
) -> None:
    first, second = workers
    user = new_user()
    browser, phone = session(user, issued=time.time() - 5), session(user, issued=time.time() - 5)
    tokens = [
        AccessTokens(pool, scopes=("assistant",), cut_off=worker.revocations)
        for pool, worker in zip(pools, workers, strict=True)
    ]
    limits = TokenLimits(max_concurrent=1, max_runs_per_hour=1, max_model_calls=1)
    made = await tokens[0].create(
        user, name="cli", scopes=frozenset({"assistant"}), days=7, limits=limits
    )
    assert (await tokens[1].verify(made.secret)).user_id == user

    ended: asyncio.Queue[str] = asyncio.Queue()
    listening = asyncio.create_task(second.revocations.listen(ended.put))
    await asyncio.sleep(0.5)  # LISTEN is in place
    try:
        await first.revocations.revoke(user)
        assert await tokens[0].revoke_all(user) == 1
        # The other worker hears of it (its cached look at the user, from the token's check
        # above, is dropped) and ends the user's live connections.
        assert await asyncio.wait_for(ended.get(), timeout=10) == user
    finally:
        listening.cancel()

    for worker, pat in zip(workers, tokens, strict=True):
        for token in (browser, phone):
            assert await worker.get(token) == 401
            with pytest.raises(SessionRevoked):
                await worker.revocations.check(user, token, SECRET)
        with pytest.raises(TokenRejected):
            await pat.verify(made.secret)
    [listed] = await tokens[1].owned(user)
    assert not listed.active  # the tokens page shows it revoked
    # Signing in again (a later second than the cut-off) works.
    cut_off = await second.revocations.cut_off(user, cached=False)
    assert cut_off is not None
    await asyncio.sleep(max(0.0, int(cut_off) + 1 - time.time()))
    fresh = session(user)
    assert (await second.request("GET", "/api/memory", fresh)).text == user
