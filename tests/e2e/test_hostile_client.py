"""A signed-in user speaking Chainlit's socket.io and HTTP by hand, against the running app."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import socketio

from bench.login import sign_in
from tests.e2e.conftest import ROOT, USERS, AppServer

pytestmark = pytest.mark.e2e

MALFORMED = "That request was malformed and has been ignored."
RAW_ERRORS = ("Traceback", "KeyError", "TypeError", "string indices", "'id'", "NoneType")


class ChatSocket:
    """Chainlit's browser client, by hand: connect with an `auth` object, record every event."""

    def __init__(self, server: AppServer, cookie: str) -> None:
        self.server = server
        self.cookie = cookie
        self.client = socketio.AsyncClient(reconnection=False)
        self.events: list[tuple[str, Any]] = []
        self.client.on("*", self._record)
        self.session_id = ""

    async def _record(self, event: str, data: Any = None) -> None:
        self.events.append((event, data))

    async def connect(self, session_id: str | None = None, thread_id: str = "") -> None:
        self.session_id = session_id if session_id is not None else str(uuid.uuid4())
        await self.client.connect(
            self.server.url,
            socketio_path="/ws/socket.io",
            headers={
                "Cookie": self.cookie,
                "Origin": getattr(self.server, "origin", self.server.url),
            },
            transports=["websocket"],
            auth={
                "clientType": "webapp",
                "sessionId": self.session_id,
                "threadId": thread_id,
                "userEnv": "{}",
                "chatProfile": "",
            },
            wait_timeout=10,
        )

    async def start(self, thread_id: str = "") -> None:
        await self.connect(thread_id=thread_id)
        await self.client.emit("connection_successful")
        await self.wait_for(lambda e, d: e == "new_message" and "offline" in str(d))

    async def wait_for(self, match: Any, timeout: float = 20) -> tuple[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                for event in self.events:
                    if match(*event):
                        return event
                await asyncio.sleep(0.05)

    async def send(self, text: str) -> str:
        """A user message as the browser sends it; returns the assistant's reply text."""
        message_id = str(uuid.uuid4())
        step = {
            "threadId": "",
            "id": message_id,
            "name": "user",
            "type": "user_message",
            "output": text,
            "createdAt": datetime.now(UTC).isoformat(),
            "metadata": {},
        }
        sent = len(self.events)
        await self.client.emit("client_message", {"message": step, "fileReferences": None})
        _, reply = await self.wait_for(
            lambda e, d: (
                e in ("new_message", "update_message")
                and isinstance(d, dict)
                and f"You said: {text}" in str(d.get("output"))
            )
        )
        # The turn's last step (its usage) comes after the reply: the turn is over once it has.
        async with asyncio.timeout(20):
            while not any(
                isinstance(d, dict) and d.get("name") == "Usage" for _, d in self.events[sent:]
            ):
                await asyncio.sleep(0.05)
        return str(reply["output"])

    def thread_id(self) -> str:
        return next(d["thread_id"] for e, d in self.events if e == "first_interaction")

    async def close(self) -> None:
        await self.client.disconnect()


async def _cookie(server: AppServer, user: str) -> str:
    return await sign_in(server.url, user, USERS[user])


@pytest.fixture(scope="module")
async def cookies(app_server: AppServer) -> dict[str, str]:
    return {user: await _cookie(app_server, user) for user in USERS}


@pytest.fixture
async def bob(app_server: AppServer, cookies: dict[str, str]) -> AsyncIterator[ChatSocket]:
    socket = ChatSocket(app_server, cookies["bob"])
    await socket.start()
    yield socket
    await socket.close()


def _files_folder(server: AppServer) -> Path:
    # Beside it, the lock file that marks it in use (ui/chainlit/patches/uploads.py claim_instance_folder).
    [folder] = [p for p in (server.data_dir / "files").glob("instance-*") if p.is_dir()]
    return folder


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.suffix != ".log"}


def _http(server: AppServer, cookie: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=server.url, headers={"Cookie": cookie, "Origin": server.url}, timeout=30
    )


# --- Hole 1: a client-chosen session id never reaches the filesystem ---


def _hostile_session_ids(sentinel: Path) -> list[str]:
    return [
        str(sentinel),
        "../../sentinel",
        "../sentinel",
        "..%2f..%2fsentinel",
        "a/../..",
        ".",
        "..",
        "",
        "x" * 5000,
        "sentinel",
        "ünïcödé-séssion",
        str(uuid.uuid4()).upper(),
        "{" + str(uuid.uuid4()) + "}",
        str(uuid.uuid4()).replace("-", ""),
        " " + str(uuid.uuid4()),
    ]


async def test_a_hostile_session_id_touches_nothing_on_disk(app_server, cookies):
    sentinel = app_server.data_dir / "sentinel"
    sentinel.mkdir()
    (sentinel / "keep.txt").write_text("keep me")
    files = _files_folder(app_server)
    outside = files.parent.parent
    before = _tree(outside) - _tree(files)
    assert files.resolve().is_relative_to(app_server.data_dir.resolve())
    assert not files.resolve().is_relative_to(ROOT)

    for bad in _hostile_session_ids(sentinel):
        socket = ChatSocket(app_server, cookies["bob"])
        with pytest.raises(socketio.exceptions.ConnectionError):
            await socket.connect(session_id=bad)
        # Had it been accepted, these would rmtree `.files/<bad>`.
        if socket.client.connected:
            await socket.client.emit("clear_session")
            await socket.close()
        async with _http(app_server, cookies["bob"]) as http:
            upload = await http.post(
                "/project/file",
                params={"session_id": bad},
                files={"file": ("x.txt", b"hostile", "text/plain")},
            )
            fetched = await http.get("/project/file/x", params={"session_id": bad})
        assert upload.status_code == 400, (bad, upload.text)
        assert fetched.status_code == 400, (bad, fetched.text)

    assert (sentinel / "keep.txt").read_text() == "keep me"
    assert files.is_dir()
    assert _tree(outside) - _tree(files) == before

    # A good session still uploads, into its own folder under the instance's files folder.
    socket = ChatSocket(app_server, cookies["bob"])
    await socket.connect()
    async with _http(app_server, cookies["bob"]) as http:
        upload = await http.post(
            "/project/file",
            params={"session_id": socket.session_id},
            files={"file": ("notes.txt", b"hello", "text/plain")},
        )
    assert upload.status_code == 200, upload.text
    stored = list((files / socket.session_id).iterdir())
    assert [p.read_bytes() for p in stored] == [b"hello"]
    await socket.client.emit("clear_session")
    await asyncio.sleep(0.5)  # the event is handled before the disconnect that acts on it
    await socket.close()
    await _gone(files / socket.session_id)
    assert (sentinel / "keep.txt").read_text() == "keep me"
    assert files.is_dir()


async def _gone(path: Path) -> None:
    async with asyncio.timeout(10):
        while path.exists():
            await asyncio.sleep(0.1)


# --- Hole 7: a foreign conversation looks and behaves like a missing one ---


def _steps(database_url: str, thread_id: str) -> list[str]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            'SELECT coalesce(output, \'\') FROM "Step" WHERE "threadId" = %s', (thread_id,)
        ).fetchall()
    return sorted(row[0] for row in rows)


async def _open(server: AppServer, cookie: str, thread_id: str) -> tuple[list[str], ChatSocket]:
    socket = ChatSocket(server, cookie)
    await socket.start(thread_id=thread_id)
    await asyncio.sleep(0.5)
    return [event for event, _ in socket.events], socket


async def test_a_foreign_thread_behaves_like_a_missing_one(app_server, cookies):
    alice = ChatSocket(app_server, cookies["alice"])
    await alice.start()
    await alice.send("alice secret 5521")
    alice_thread = alice.thread_id()
    await alice.close()
    before = _steps(app_server.database_url, alice_thread)
    assert any("alice secret 5521" in step for step in before)
    missing_thread = str(uuid.uuid4())

    foreign_events, foreign = await _open(app_server, cookies["bob"], alice_thread)
    missing_events, missing = await _open(app_server, cookies["bob"], missing_thread)
    assert foreign_events == missing_events
    assert ("resume_thread_error", "Thread not found.") in foreign.events
    assert "alice secret" not in str(foreign.events)

    # The socket works, and a message starts bob's own conversation under a fresh id.
    await foreign.send("bob in a foreign url")
    await missing.send("bob in a missing url")
    new_foreign, new_missing = foreign.thread_id(), missing.thread_id()
    assert new_foreign not in (alice_thread, missing_thread)
    assert new_missing not in (alice_thread, missing_thread)
    await foreign.close()
    await missing.close()
    assert _steps(app_server.database_url, alice_thread) == before
    assert _steps(app_server.database_url, missing_thread) == []

    async with _http(app_server, cookies["bob"]) as http:
        for method, path, body in _thread_endpoints():
            answers = [
                await http.request(method, path.format(tid), json=body(tid) if body else None)
                for tid in (alice_thread, missing_thread)
            ]
            assert answers[0].status_code == answers[1].status_code == 404, (method, path)
            assert answers[0].json() == answers[1].json(), (method, path)
    assert _steps(app_server.database_url, alice_thread) == before


def _thread_endpoints() -> list[tuple[str, str, Any]]:
    return [
        ("GET", "/project/thread/{}", None),
        ("GET", "/project/thread/{}/element/" + str(uuid.uuid4()), None),
        ("GET", "/project/share/{}", None),
        ("PUT", "/project/thread", lambda t: {"threadId": t, "name": "pwned"}),
        ("PUT", "/project/thread/share", lambda t: {"threadId": t, "isShared": True}),
        ("DELETE", "/project/thread", lambda t: {"threadId": t}),
    ]


async def test_feedback_on_a_foreign_message_is_refused_like_a_missing_one(app_server, cookies):
    alice = ChatSocket(app_server, cookies["alice"])
    await alice.start()
    await alice.send("alice rates this")
    reply_id = next(d["id"] for e, d in alice.events if e == "new_message" and "You said" in str(d))
    await alice.close()
    async with _http(app_server, cookies["bob"]) as http:
        answers = [
            await http.put(
                "/feedback",
                json={"sessionId": str(uuid.uuid4()), "feedback": {"forId": step, "value": 0}},
            )
            for step in (reply_id, str(uuid.uuid4()))
        ]
        assert answers[0].status_code == answers[1].status_code == 404
        assert answers[0].json() == answers[1].json()
    async with _http(app_server, cookies["alice"]) as http:
        mine = await http.put(
            "/feedback",
            json={"sessionId": str(uuid.uuid4()), "feedback": {"forId": reply_id, "value": 1}},
        )
        assert mine.status_code == 200, mine.text
        feedback_id = mine.json()["feedbackId"]
    async with _http(app_server, cookies["bob"]) as http:
        steal = await http.put(
            "/feedback",
            json={
                "sessionId": str(uuid.uuid4()),
                "feedback": {"forId": str(uuid.uuid4()), "id": feedback_id, "value": 0},
            },
        )
        deleted = await http.request("DELETE", "/feedback", json={"feedbackId": feedback_id})
        assert steal.status_code == deleted.status_code == 404
    with psycopg.connect(app_server.database_url, autocommit=True) as conn:
        row = conn.execute('SELECT value FROM "Feedback" WHERE id = %s', (feedback_id,)).fetchone()
    assert row == (1.0,)


# --- Hole 8: malformed input gets a fixed answer and changes nothing ---

JUNK: list[Any] = [
    "a string",
    None,
    42,
    [],
    ["nested", {"junk": [None]}],
    {},
    {"message": "x"},
    {"message": {}},
    {"message": {"id": None, "output": 5}},
    {"message": {"id": "not-a-uuid", "output": "hi", "createdAt": "now", "type": "user_message"}},
    {
        "message": {
            "id": str(uuid.uuid4()),
            "output": "spoofed",
            "createdAt": "now",
            "type": "assistant_message",
        }
    },
    {"message": {"id": str(uuid.uuid4())}, "fileReferences": "x"},
    {"x" * 10: "y" * 200_000},
]

EVENTS = [
    "client_message",
    "edit_message",
    "message_favorite",
    "window_message",
    "audio_chunk",
    "chat_settings_change",
    "chat_settings_edit",
]


async def _threads(server: AppServer, cookie: str) -> list[str]:
    async with _http(server, cookie) as http:
        listed = await http.post(
            "/project/threads", json={"pagination": {"first": 100}, "filter": {}}
        )
    return sorted(t["id"] for t in listed.json()["data"])


async def test_malformed_socket_events_get_a_fixed_message_and_store_nothing(
    app_server, cookies, bob
):
    threads = await _threads(app_server, cookies["bob"])
    for event in EVENTS:
        for junk in JUNK:
            if event == "window_message" or (event.startswith("chat_settings") and junk == {}):
                continue  # any JSON value is a window message; no settings is a valid change
            bob.events.clear()
            await bob.client.emit(event, junk)
            await bob.wait_for(lambda e, d: e == "toast" and d["message"] == MALFORMED)
            assert not any(e in ("new_message", "first_interaction") for e, _ in bob.events)
    for event in ["connection_successful", "stop", "clear_session", "audio_start", "audio_end"]:
        bob.events.clear()
        await bob.client.emit(event, {"junk": True})
        await bob.wait_for(lambda e, d: e == "toast" and d["message"] == MALFORMED)
    bob.events.clear()
    await bob.client.emit("window_message", ["anything", {"at": "all"}])
    await asyncio.sleep(0.5)
    assert not any(e == "toast" for e, _ in bob.events)
    assert not any(raw in str(bob.events) for raw in RAW_ERRORS)
    assert await _threads(app_server, cookies["bob"]) == threads
    # The session is still usable.
    assert "You said: still here" in await bob.send("still here")


@pytest.mark.parametrize(
    "auth",
    [
        "a string",
        ["list"],
        {},
        {"sessionId": None, "clientType": "webapp"},
        {"sessionId": 5, "clientType": "webapp"},
        {"sessionId": str(uuid.uuid4())},
        {"sessionId": str(uuid.uuid4()), "clientType": "toaster"},
        {"sessionId": str(uuid.uuid4()), "clientType": "webapp", "userEnv": "{not json"},
        {"sessionId": str(uuid.uuid4()), "clientType": "webapp", "userEnv": "[1]"},
        {"sessionId": str(uuid.uuid4()), "clientType": "webapp", "threadId": {"a": 1}},
        {"sessionId": str(uuid.uuid4()), "clientType": "webapp", "chatProfile": ["x"]},
    ],
)
async def test_a_malformed_connect_is_refused_with_a_fixed_reason(app_server, cookies, auth):
    client = socketio.AsyncClient(reconnection=False)
    reasons: list[Any] = []
    client.on("connect_error", reasons.append)
    with pytest.raises(socketio.exceptions.ConnectionError):
        await client.connect(
            app_server.url,
            socketio_path="/ws/socket.io",
            headers={"Cookie": cookies["bob"], "Origin": app_server.url},
            transports=["websocket"],
            auth=auth,
            wait_timeout=10,
        )
    assert reasons == [{"message": "invalid connection request"}]


def _http_junk(session_id: str) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        ("POST", "/project/action", {"content": b"not json"}),
        ("POST", "/project/action", {"json": []}),
        ("POST", "/project/action", {"json": {"sessionId": str(uuid.uuid4()), "action": {}}}),
        (
            "POST",
            "/project/action",
            {"json": {"sessionId": str(uuid.uuid4()), "action": {"name": "retry", "payload": {}}}},
        ),
        (
            "POST",
            "/project/action",
            {"json": {"sessionId": session_id, "action": {"name": "retry", "bogus": 1}}},
        ),
        ("POST", "/project/action", {"json": {"sessionId": session_id, "action": "retry"}}),
        ("POST", "/project/action", {"json": {"sessionId": "../..", "action": {}}}),
        ("POST", "/project/file", {"files": {"file": ("x.txt", b"x", "text/plain")}}),
        ("POST", "/set-session-cookie", {"content": b"{"}),
        ("POST", "/set-session-cookie", {"json": ["x"]}),
        ("POST", "/set-session-cookie", {"json": {"session_id": "../../x"}}),
        ("POST", "/project/threads", {"json": {"pagination": {"first": -1}, "filter": {}}}),
        ("POST", "/project/threads", {"json": {"pagination": {"first": 10**9}, "filter": {}}}),
        ("POST", "/project/threads", {"json": {"pagination": {"first": "x"}, "filter": {}}}),
        ("POST", "/project/threads", {"json": "x"}),
        ("PUT", "/feedback", {"json": {"feedback": "x"}}),
        ("PUT", "/feedback", {"json": {"sessionId": "x", "feedback": {"forId": 1, "value": 7}}}),
        ("DELETE", "/feedback", {"json": {"feedbackId": None}}),
        ("PUT", "/project/element", {"json": {"sessionId": session_id, "element": {}}}),
        ("DELETE", "/project/element", {"json": {"sessionId": session_id, "element": "x"}}),
        ("PUT", "/project/thread", {"json": {"threadId": ["x"], "name": 5}}),
        ("DELETE", "/project/thread", {"content": b"\xff\xfe"}),
        ("POST", "/auth/jwt", {"content": b"junk"}),
        ("POST", "/auth/header", {"json": {"x": 1}}),
        ("POST", "/login", {"data": {"username": "x" * 10_000, "password": ""}}),
        ("GET", "/auth/oauth/cairn/callback?code=junk&state=junk", {}),
        ("GET", "/auth/oauth/nope/callback?code=junk", {}),
        ("GET", "/project/file/x?session_id=" + "y" * 5000, {}),
    ]


async def test_malformed_http_requests_get_a_4xx_and_store_nothing(app_server, cookies, bob):
    threads = await _threads(app_server, cookies["bob"])
    bob.events.clear()
    async with _http(app_server, cookies["bob"]) as http:
        for method, path, kwargs in _http_junk(bob.session_id):
            answer = await http.request(method, path, **kwargs)
            # A failed sign-in is sent back to the login page (a redirect), as any browser is.
            low = 300 if path.startswith("/auth/oauth/") else 400
            assert low <= answer.status_code < 500, (method, path, kwargs, answer.text)
            assert not any(raw in answer.text for raw in RAW_ERRORS), (path, answer.text)
    assert await _threads(app_server, cookies["bob"]) == threads
    assert not any(e in ("new_message", "first_interaction") for e, _ in bob.events)


# --- Edits: only one's own message in one's own conversation forks it ---


async def test_an_edit_of_a_message_not_in_the_users_chat_is_refused(app_server, cookies, bob):
    from langchain_core.messages import HumanMessage

    from tests.e2e.test_chat import checkpoint_messages

    alice = ChatSocket(app_server, cookies["alice"])
    await alice.start()
    await alice.send("alice's private message")
    alice_ids = [d["id"] for e, d in alice.events if e == "new_message" and isinstance(d, dict)]
    await bob.send("bob's own message")
    thread = bob.thread_id()
    reply_ids = [
        d["id"]
        for e, d in bob.events
        if e == "new_message" and isinstance(d, dict) and d.get("type") == "assistant_message"
    ]

    for foreign in [str(uuid.uuid4()), *alice_ids[-2:], *reply_ids[-1:]]:
        bob.events.clear()
        await bob.client.emit("edit_message", {"message": {"id": foreign, "output": "hijack"}})
        await bob.wait_for(
            lambda e, d: e == "new_message" and "Conversation not found" in str(d.get("output"))
        )
        assert not any("hijack" in str(d) for e, d in bob.events if e != "edit_message")

    def humans(thread_id: str) -> list[str]:
        messages = checkpoint_messages(app_server.database_url, thread_id)
        return [m.text for m in messages if isinstance(m, HumanMessage)]

    assert humans(thread) == ["bob's own message"]
    assert humans(alice.thread_id()) == ["alice's private message"]
    await alice.close()


# --- Sessions, message ids and NUL characters (a client that skips the browser's rules) ---

REPLAYED = "That message was already sent and has been ignored."


def _press(session_id: str, thread_id: str) -> dict[str, Any]:
    payload = {"thread_id": thread_id, "interrupt_id": "forged", "decision": "approve"}
    return {"sessionId": session_id, "action": {"name": "answer", "payload": payload}}


async def test_a_button_press_names_only_a_begun_session_of_ones_own(app_server, cookies, bob):
    threads = await _threads(app_server, cookies["bob"])
    fresh = ChatSocket(app_server, cookies["bob"])
    await fresh.connect()  # no message yet: no conversation
    alice = ChatSocket(app_server, cookies["alice"])
    await alice.start()
    await alice.send("alice's session")
    async with _http(app_server, cookies["bob"]) as http:
        on_fresh = await http.post("/project/action", json=_press(fresh.session_id, "x"))
        foreign = await http.post("/project/action", json=_press(alice.session_id, "x"))
        missing = await http.post("/project/action", json=_press(str(uuid.uuid4()), "x"))
        uploads = [
            await http.post(
                "/project/file",
                params={"session_id": session_id},
                files={"file": ("x.txt", b"x", "text/plain")},
            )
            for session_id in (alice.session_id, str(uuid.uuid4()))
        ]
    assert on_fresh.status_code == foreign.status_code == missing.status_code == 404
    assert foreign.json() == missing.json()
    assert [u.status_code for u in uploads] == [404, 404]
    assert uploads[0].json() == uploads[1].json()
    # Before: a conversation named "answer" appeared in bob's list, holding an error.
    assert await _threads(app_server, cookies["bob"]) == threads
    await fresh.close()
    await alice.close()


async def test_a_message_id_already_sent_is_refused_and_rewrites_nothing(app_server, cookies, bob):
    from langchain_core.messages import HumanMessage

    from tests.e2e.test_chat import checkpoint_messages

    step = {
        "threadId": "",
        "id": str(uuid.uuid4()),
        "name": "user",
        "type": "user_message",
        "output": "the original words",
        "createdAt": datetime.now(UTC).isoformat(),
        "metadata": {},
    }
    await bob.client.emit("client_message", {"message": step, "fileReferences": None})
    await bob.wait_for(
        lambda e, d: (
            e in ("new_message", "update_message")
            and isinstance(d, dict)
            and "You said: the original words" in str(d.get("output"))
        )
    )
    await asyncio.sleep(0.5)  # the reply is stored
    thread = bob.thread_id()
    before = _steps(app_server.database_url, thread)
    step = {**step, "output": "rewritten words"}
    bob.events.clear()
    await bob.client.emit("client_message", {"message": step, "fileReferences": None})
    await bob.wait_for(lambda e, d: e == "toast" and d["message"] == REPLAYED)
    parented = {**step, "id": str(uuid.uuid4()), "parentId": str(uuid.uuid4())}
    await bob.client.emit("client_message", {"message": parented, "fileReferences": None})
    nul = {**step, "id": str(uuid.uuid4()), "output": "null\x00byte"}
    await bob.client.emit("client_message", {"message": nul, "fileReferences": None})
    await bob.wait_for(
        lambda e, d: (
            len([1 for ev, da in bob.events if ev == "toast" and da["message"] == MALFORMED]) == 2
        )
    )
    await asyncio.sleep(0.5)
    assert not any(e == "new_message" for e, _ in bob.events)
    assert _steps(app_server.database_url, thread) == before
    humans = [
        m.text
        for m in checkpoint_messages(app_server.database_url, thread)
        if isinstance(m, HumanMessage)
    ]
    assert humans == ["the original words"]
    assert "You said: still here" in await bob.send("still here")


async def test_a_nul_character_in_an_http_request_is_a_4xx(app_server, cookies, bob):
    await bob.send("a conversation to rename")
    thread = bob.thread_id()
    threads = await _threads(app_server, cookies["bob"])
    async with _http(app_server, cookies["bob"]) as http:
        answers = [
            await http.put("/project/thread", json={"threadId": thread, "name": "a\x00b"}),
            await http.get("/project/thread/%00"),
            await http.post("/login", data={"username": "bob\x00", "password": "x"}),
            await http.put(
                "/api/memory/items/k",
                json={"content": "tea\x00"},
                headers={"x-cairn-request": "1"},
            ),
        ]
    assert [a.status_code for a in answers] == [400, 400, 400, 400], [a.text for a in answers]
    assert await _threads(app_server, cookies["bob"]) == threads


async def test_a_conversation_is_not_deleted_under_a_run_in_progress(app_server, cookies, bob):
    await bob.send("a conversation with a run going")
    thread = bob.thread_id()
    # A run of the thread on another worker holds its lock (graphs/core/runlock.py).
    with psycopg.connect(app_server.database_url, autocommit=True) as run:
        run.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (f"cairn-run:{thread}",))
        async with _http(app_server, cookies["bob"]) as http:
            busy = await http.request("DELETE", "/project/thread", json={"threadId": thread})
            page = await http.post(
                f"/api/conversations/{thread}/delete", json={}, headers={"x-cairn-request": "1"}
            )
        assert busy.status_code == page.status_code == 409, (busy.text, page.text)
        assert thread in await _threads(app_server, cookies["bob"])
        assert any("run going" in step for step in _steps(app_server.database_url, thread))
    async with _http(app_server, cookies["bob"]) as http:
        done = await http.request("DELETE", "/project/thread", json={"threadId": thread})
    assert done.status_code == 200, done.text
    assert thread not in await _threads(app_server, cookies["bob"])
