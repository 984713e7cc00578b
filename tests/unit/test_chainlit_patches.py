"""The Chainlit patches: what they check, and a tripwire for a Chainlit upgrade."""

from __future__ import annotations

import hashlib
import inspect
import uuid
from pathlib import Path
from typing import Any

import chainlit
import chainlit.config
import chainlit.server
import chainlit.socket
import pytest
from chainlit.emitter import ChainlitEmitter
from chainlit.session import BaseSession, WebsocketSession
from socketio.exceptions import ConnectionRefusedError as SocketRefused

from ui import chainlit_patches
from ui.chainlit_patches import MALFORMED, SOCKET_EVENTS, check_ask_answer, is_session_id
from ui.request_guard import RULES

CHECKED_SOURCE = {
    "socket.connect": (chainlit.socket.connect, "00ce35b669efa6f8"),
    "socket.process_message": (chainlit.socket.process_message, "7002f6fd6cadca2f"),
    "session.files_dir": (BaseSession.files_dir.fget, "97c55ce5b37ab2b8"),
    "session.WebsocketSession.delete": (WebsocketSession.delete, "b6a06e7409d9fdba"),
    "server.lifespan": (chainlit.server.lifespan, "7622975e70facb8a"),
    "emitter.send_ask_user": (ChainlitEmitter.send_ask_user, "405cea5c280aed1d"),
    "emitter.process_message": (ChainlitEmitter.process_message, "ffb867621e1b52c8"),
    "server.call_action": (chainlit.server.call_action, "1db36f6a1d296df1"),
    "server.upload_file": (chainlit.server.upload_file, "0e1d81cae2398ee8"),
    "server.get_file": (chainlit.server.get_file, "087b45142fefe873"),
    "server.update_feedback": (chainlit.server.update_feedback, "1ca022629ec82755"),
    "server.delete_feedback": (chainlit.server.delete_feedback, "d918421add44e2f7"),
    "server.set_session_cookie": (chainlit.server.set_session_cookie, "0b26b9f18f536f6c"),
    "server.share_thread": (chainlit.server.share_thread, "5c89b2441303a185"),
    "server.delete_thread_element": (chainlit.server.delete_thread_element, "e6acea6dfecfa4d8"),
    "server.update_thread_element": (chainlit.server.update_thread_element, "9683b313b3741b17"),
}
"""The Chainlit code ui/chainlit_patches.py and ui/request_guard.py guard, as of 2.12.0."""


def test_chainlit_is_the_version_the_patches_were_checked_against():
    assert chainlit.__version__ == chainlit_patches.CHAINLIT_VERSION


@pytest.mark.parametrize("name", sorted(CHECKED_SOURCE))
def test_the_guarded_chainlit_code_is_unchanged(name):
    function, digest = CHECKED_SOURCE[name]
    source = inspect.getsource(inspect.unwrap(function))
    assert hashlib.sha256(source.encode()).hexdigest()[:16] == digest, (
        f"Chainlit changed {name}: re-check ui/chainlit_patches.py / ui/request_guard.py"
    )


def test_every_socket_event_chainlit_registers_has_a_check():
    registered = set(chainlit.server.sio.handlers["/"])
    assert registered == SOCKET_EVENTS


def test_every_chainlit_route_taking_a_session_id_or_body_has_a_rule():
    taking = set()
    for route in chainlit.server.router.routes:
        endpoint = getattr(route, "endpoint", None)
        if endpoint is None:
            continue
        params = inspect.signature(endpoint).parameters
        source = inspect.getsource(endpoint)
        if (
            "session_id" in params
            or "payload" in params
            or "update" in params
            or ("request.json()" in source)
        ):
            taking |= {(m, route.path) for m in route.methods}
    ruled = {(r.method, r.path.pattern) for r in RULES}
    for method, path in taking:
        pattern = "^" + path.replace("{thread_id}", "[^/]*").replace("{file_id}", "[^/]*") + "$"
        assert (method, pattern) in ruled, f"{method} {path} has no rule in ui/request_guard.py"


HOSTILE = [
    "/etc",
    "../x",
    "..%2f..%2fx",
    "a/../..",
    ".",
    "..",
    "",
    "x" * 5000,
    "ünïcödé",
    str(uuid.uuid4()).upper(),
    "{" + str(uuid.uuid4()) + "}",
    "urn:uuid:" + str(uuid.uuid4()),
    str(uuid.uuid4()).replace("-", ""),
    " " + str(uuid.uuid4()),
    str(uuid.uuid4()) + "\n",
    None,
    42,
    ["x"],
]


@pytest.mark.parametrize("value", HOSTILE)
def test_only_canonical_uuids_are_session_ids(value):
    assert not is_session_id(value)


def test_a_browser_session_id_is_one():
    assert is_session_id(str(uuid.uuid4()))


@pytest.mark.parametrize("session_id", HOSTILE)
async def test_connect_refuses_a_hostile_session_id_before_chainlit(session_id):
    sio = _FakeSio()
    chainlit_patches.guard_socket_events(sio)
    auth = {"sessionId": session_id, "clientType": "webapp", "threadId": ""}
    with pytest.raises(SocketRefused):
        await sio.handlers["/"]["connect"]("sid", {}, auth)
    assert sio.calls == []


def test_files_go_to_a_private_folder_per_process(tmp_path, monkeypatch):
    monkeypatch.setattr(chainlit.config, "FILES_DIRECTORY", chainlit.config.FILES_DIRECTORY)
    monkeypatch.setattr(chainlit.server, "FILES_DIRECTORY", chainlit.server.FILES_DIRECTORY)
    first = chainlit_patches.relocate_files(tmp_path / "files")
    second = chainlit_patches.relocate_files(tmp_path / "files")
    assert first != second
    assert first.parent == second.parent == tmp_path / "files"
    assert second == chainlit.server.FILES_DIRECTORY  # type: ignore[attr-defined]
    session = BaseSession(
        id=str(uuid.uuid4()),
        client_type="webapp",
        thread_id=None,
        user=None,
        token=None,
        user_env=None,
    )
    assert session.files_dir.parent == second


class _FakeSio:
    """Chainlit's registered handlers, each recording its call instead of running."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.emitted: list[tuple[str, Any]] = []
        self.handlers: dict[str, dict[str, Any]] = {"/": {}}
        for name in SOCKET_EVENTS:
            self.handlers["/"][name] = self._recorder(name)

    def _recorder(self, name: str) -> Any:
        async def handler(*args: Any) -> None:
            self.calls.append((name, args))

        return handler

    async def emit(self, event: str, data: Any, to: str) -> None:
        self.emitted.append((event, data))


def _step(**changes: Any) -> dict[str, Any]:
    step = {
        "id": str(uuid.uuid4()),
        "output": "hi",
        "createdAt": "2026-01-01T00:00:00Z",
        "type": "user_message",
        "name": "bob",
        "threadId": "",
        "metadata": {},
    }
    return {**step, **changes}


JUNK_MESSAGES = [
    "a string",
    None,
    [],
    {},
    {"message": "x"},
    {"message": {}},
    {"message": _step(id=None)},
    {"message": _step(id="not-a-uuid")},
    {"message": _step(id=str(uuid.uuid1()))},
    {"message": _step(output=None)},
    {"message": _step(type="assistant_message")},
    {"message": _step(output="x" * 1_000_001)},
    {"message": _step(), "fileReferences": "x"},
    {"message": _step(), "fileReferences": [{"id": 5}]},
]


@pytest.mark.parametrize("payload", JUNK_MESSAGES)
async def test_a_malformed_client_message_never_reaches_chainlit(payload):
    sio = _FakeSio()
    chainlit_patches.guard_socket_events(sio)
    await sio.handlers["/"]["client_message"]("sid", payload)
    assert sio.calls == []
    assert sio.emitted == [("toast", {"message": MALFORMED, "type": "error"})]


async def test_a_browser_message_reaches_chainlit():
    sio = _FakeSio()
    chainlit_patches.guard_socket_events(sio)
    payload = {"message": _step(), "fileReferences": [{"id": "f"}]}
    await sio.handlers["/"]["client_message"]("sid", payload)
    assert sio.calls == [("client_message", ("sid", payload))]


@pytest.mark.parametrize("event", ["edit_message", "message_favorite", "audio_chunk"])
async def test_events_of_features_turned_off_are_refused(event):
    sio = _FakeSio()
    chainlit_patches.guard_socket_events(sio)
    await sio.handlers["/"][event]("sid", {"message": {"id": "x", "output": "y"}})
    assert sio.calls == []


async def test_a_handler_failure_shows_a_fixed_text():
    sio = _FakeSio()

    async def broken(sid: str) -> None:
        raise KeyError("id")

    sio.handlers["/"]["stop"] = broken
    chainlit_patches.guard_socket_events(sio)
    await sio.handlers["/"]["stop"]("sid")
    assert sio.emitted == [("toast", {"message": chainlit_patches.FAILED, "type": "error"})]


@pytest.mark.parametrize(
    ("spec", "answer"),
    [
        ("text", "junk"),
        ("text", {"id": "x"}),
        ("action", {"payload": {}}),
        ("action", "approve"),
        ("file", {"id": "x"}),
        ("file", [{"id": None}]),
        ("element", "x"),
    ],
)
def test_a_malformed_ask_answer_is_refused(spec, answer):
    with pytest.raises(chainlit_patches.Malformed):
        check_ask_answer(spec, answer)


def test_good_ask_answers_pass():
    check_ask_answer("text", _step())
    check_ask_answer("action", {"name": "approve", "payload": {}})
    check_ask_answer("file", [{"id": "f"}])
    check_ask_answer("text", None)


def test_the_patched_names_exist(tmp_path: Path):
    assert isinstance(chainlit.config.FILES_DIRECTORY, Path)
    assert isinstance(chainlit.server.FILES_DIRECTORY, Path)  # type: ignore[attr-defined]
