"""The request guard in front of Chainlit's routes that name a chat session: its owner's only."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import jwt
import pytest
from chainlit.session import WebsocketSession
from chainlit.user import User
from starlette.types import Receive, Scope, Send

from ui.chainlit.request_guard import RequestGuard

SECRET = "test-secret-of-at-least-thirty-two-bytes"


class _Chainlit:
    """Stands in for Chainlit's routes: records what reached them."""

    def __init__(self) -> None:
        self.reached: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


@pytest.fixture
def chainlit_routes(monkeypatch: pytest.MonkeyPatch) -> _Chainlit:
    monkeypatch.setenv("CHAINLIT_AUTH_SECRET", SECRET)
    return _Chainlit()


@pytest.fixture
async def sessions() -> AsyncIterator[Callable[..., WebsocketSession]]:
    made: list[WebsocketSession] = []

    def session(owner: str, *, begun: bool = True) -> WebsocketSession:
        async def emit(*_args: Any, **_kwargs: Any) -> None:
            return None

        live = WebsocketSession(
            id=str(uuid.uuid4()),
            socket_id=f"sid-{uuid.uuid4()}",
            emit=emit,
            emit_call=emit,
            client_type="webapp",
            user_env={},
            user=User(identifier=owner),
            token=None,
            chat_profile=None,
            thread_id=None,
        )
        live.has_first_interaction = begun
        made.append(live)
        return live

    yield session
    for live in made:
        await live.delete()


def _client(app: _Chainlit, user: str | None) -> httpx.AsyncClient:
    headers = {}
    if user is not None:
        token = jwt.encode({"identifier": user}, SECRET, algorithm="HS256")
        headers["Authorization"] = f"Bearer {token}"
    transport = httpx.ASGITransport(app=RequestGuard(app))
    return httpx.AsyncClient(transport=transport, base_url="http://cairn", headers=headers)


def _press(session_id: str) -> dict[str, Any]:
    action = {"name": "answer", "payload": {"thread_id": "t", "interrupt_id": "i", "decision": "x"}}
    return {"sessionId": session_id, "action": action}


async def test_a_button_press_on_another_users_session_is_refused_like_a_missing_one(
    chainlit_routes: _Chainlit, sessions: Callable[..., WebsocketSession]
) -> None:
    alices = sessions("alice")
    async with _client(chainlit_routes, "bob") as http:
        foreign = await http.post("/project/action", json=_press(alices.id))
        missing = await http.post("/project/action", json=_press(str(uuid.uuid4())))
    assert foreign.status_code == missing.status_code == 404
    assert foreign.json() == missing.json()
    assert chainlit_routes.reached == []


async def test_a_button_press_before_the_conversation_began_reaches_nothing(
    chainlit_routes: _Chainlit, sessions: Callable[..., WebsocketSession]
) -> None:
    """Chainlit would create the session's conversation, named after the action, first."""
    fresh = sessions("bob", begun=False)
    async with _client(chainlit_routes, "bob") as http:
        answer = await http.post("/project/action", json=_press(fresh.id))
    assert answer.status_code == 404
    assert fresh.has_first_interaction is False
    assert chainlit_routes.reached == []


async def test_the_owners_press_in_a_begun_conversation_goes_through(
    chainlit_routes: _Chainlit, sessions: Callable[..., WebsocketSession]
) -> None:
    bobs = sessions("bob")
    async with _client(chainlit_routes, "bob") as http:
        answer = await http.post("/project/action", json=_press(bobs.id))
        unsigned = await _client(chainlit_routes, None).post(
            "/project/action", json=_press(bobs.id)
        )
    assert answer.status_code == 200
    assert unsigned.status_code == 401
    assert chainlit_routes.reached == ["/project/action"]


@pytest.mark.parametrize("method", ["POST", "GET"])
async def test_files_of_another_users_session_are_refused_like_a_missing_one(
    method: str, chainlit_routes: _Chainlit, sessions: Callable[..., WebsocketSession]
) -> None:
    alices, bobs = sessions("alice"), sessions("bob")
    path = "/project/file" if method == "POST" else "/project/file/some-file"
    upload = {"files": {"file": ("x.txt", b"x", "text/plain")}} if method == "POST" else {}
    async with _client(chainlit_routes, "bob") as http:
        answers = [
            await http.request(method, path, params={"session_id": session_id}, **upload)
            for session_id in (alices.id, str(uuid.uuid4()))
        ]
        own = await http.request(method, path, params={"session_id": bobs.id}, **upload)
    assert [a.status_code for a in answers] == [404, 404]
    assert answers[0].json() == answers[1].json()
    assert own.status_code == 200
    assert chainlit_routes.reached == [path]


@pytest.mark.parametrize(
    ("method", "path", "kwargs"),
    [
        ("GET", "/project/thread/%00", {}),
        ("GET", "/api/memory/search?q=a%00b", {}),
        ("PUT", "/project/thread", {"json": {"threadId": "t", "name": "a\x00b"}}),
        ("PUT", "/api/memory/items/k", {"json": {"content": "I like tea\x00"}}),
        ("POST", "/api/tokens", {"json": {"name": "x", "scopes": ["a\x00"]}}),
        ("POST", "/mcp", {"json": {"jsonrpc": "2.0", "params": {"message": "\x00"}}}),
        ("POST", "/login", {"data": {"username": "bob\x00", "password": "x"}}),
    ],
)
async def test_a_nul_character_anywhere_in_a_request_is_refused_before_any_route(
    method: str, path: str, kwargs: dict[str, Any], chainlit_routes: _Chainlit
) -> None:
    """Postgres text and jsonb hold no NUL: the route's write failed with a 500."""
    async with _client(chainlit_routes, "bob") as http:
        answer = await http.request(method, path, **kwargs)
    assert answer.status_code == 400
    assert chainlit_routes.reached == []


async def test_text_bodies_without_nul_reach_the_route_whole(chainlit_routes: _Chainlit) -> None:
    received: list[bytes] = []

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        received.append((await receive())["body"])
        await chainlit_routes(scope, receive, send)

    guarded = RequestGuard(route)  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=guarded)
    async with httpx.AsyncClient(transport=transport, base_url="http://cairn") as http:
        edit = await http.put("/api/memory/items/k", json={"content": "a literal \\u0000"})
        login = await http.post("/login", data={"username": "bob", "password": "100%"})
        junk = await http.put("/api/memory/items/k", content=b"{not json", headers=JSON)
    assert [edit.status_code, login.status_code, junk.status_code] == [200, 200, 200]
    assert received == [
        b'{"content":"a literal \\\\u0000"}',
        b"username=bob&password=100%25",
        b"{not json",
    ]


JSON = {"content-type": "application/json"}


DEEP = b"[" * 30_000 + b"]" * 30_000
"""About 60 KB of nesting: Python's JSON parser recursed out on it, and every route answered 500."""


@pytest.mark.parametrize(
    ("method", "path", "headers"),
    [
        ("PUT", "/project/thread", JSON),
        ("POST", "/project/action", JSON),
        ("PUT", "/api/memory/items/k", JSON),
        ("POST", "/api/memory/settings", JSON),
        ("POST", "/api/tokens", JSON),
        ("POST", "/mcp", JSON),
        ("POST", "/api/account/wipe", {}),  # no content type: FastAPI reads it as JSON too
        ("POST", "/support/threads/t/checkpoints/c/fork", {"Content-Type": "application/vnd+json"}),
    ],
)
async def test_deeply_nested_json_gets_a_fixed_400_before_any_route(
    method: str, path: str, headers: dict[str, str], chainlit_routes: _Chainlit
) -> None:
    async with _client(chainlit_routes, "bob") as http:
        answer = await http.request(method, path, content=DEEP, headers=headers)
    assert answer.status_code == 400
    assert answer.json() == {"detail": "The request was malformed."}
    assert chainlit_routes.reached == []


async def test_nesting_a_real_body_uses_reaches_the_route(chainlit_routes: _Chainlit) -> None:
    body = b'{"a": [[{"b": ["[[[[[[[[[[ in a string ]]]]]]]]]]"]}]]}'
    async with _client(chainlit_routes, "bob") as http:
        answer = await http.put("/api/memory/items/k", content=body, headers=JSON)
    assert answer.status_code == 200
    assert chainlit_routes.reached == ["/api/memory/items/k"]
