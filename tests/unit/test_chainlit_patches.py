"""The Chainlit patches: what they check, and a tripwire for a Chainlit upgrade."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import chainlit
import chainlit.auth.jwt
import chainlit.config
import chainlit.data.acl
import chainlit.data.utils
import chainlit.server
import chainlit.socket
import chainlit.utils
import pytest
from chainlit.context import init_ws_context
from chainlit.session import BaseSession, WebsocketSession
from socketio.exceptions import ConnectionRefusedError as SocketRefused

from ui.chainlit import adapter, data_layer, request_guard, surface
from ui.chainlit import config as chainlit_settings
from ui.chainlit.patches import (
    CHAINLIT_VERSION,
    acl,
    clock,
    edits,
    install,
    output,
    sessions,
    sockets,
    uploads,
)
from ui.chainlit.patches.output import SanitisingEmitter
from ui.chainlit.patches.sockets import (
    MALFORMED,
    SOCKET_EVENTS,
    check_ask_answer,
    is_session_id,
)
from ui.chainlit.request_guard import RULES

# Chainlit's emitter as it ships (chainlit.emitter.ChainlitEmitter is ours once installed).
_Emitter = SanitisingEmitter.__bases__[0]

PINNED_BY = {
    "ui/chainlit/patches/sockets.py": sockets.SOCKET_PINS,
    "ui/chainlit/patches/edits.py": edits.EDIT_PINS,
    "ui/chainlit/patches/uploads.py": uploads.UPLOAD_PINS,
    "ui/chainlit/patches/clock.py": clock.CLOCK_PINS,
    "ui/chainlit/patches/acl.py": acl.ACL_PINS,
    "ui/chainlit/patches/output.py": output.OUTPUT_PINS,
    "ui/chainlit/patches/sessions.py": sessions.SESSION_PINS,
    "ui/chainlit/request_guard.py": request_guard.ROUTE_PINS,
    "ui/chainlit/config.py": chainlit_settings.CONFIG_PINS,
    "ui/chainlit/surface.py (Reply)": surface.REPLY_PINS,
    "ui/chainlit/data_layer.py": data_layer.DATA_LAYER_PINS,
    "ui/chainlit/adapter.py": adapter.ADAPTER_PINS,
}
"""Each module that patches, copies or relies on Chainlit's internals, with its own pins."""

_ORIGINALS: dict[str, Any] = {
    "chainlit.emitter.ChainlitEmitter": _Emitter,
    "chainlit.element.TaskList.preprocess_content": output.CHAINLIT_TASK_CONTENT,
}
"""Names an installed patch replaces: their pins are of the Chainlit code as shipped."""


def resolve(name: str) -> Callable[..., Any]:
    """The function a qualified name pins (a property's getter; Chainlit's own where patched)."""
    import importlib

    for prefix, original in _ORIGINALS.items():
        if name == prefix or name.startswith(prefix + "."):
            found: Any = original
            for part in name[len(prefix) :].split(".")[1:]:
                found = inspect.getattr_static(found, part)
            return found.fget if isinstance(found, property) else found
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            found = inspect.getattr_static(found, part)
        return found.fget if isinstance(found, property) else found
    msg = f"cannot resolve {name}"
    raise LookupError(msg)


CHECKED_SOURCE: dict[str, tuple[Callable[..., Any], str, str]] = {
    name: (resolve(name), digest, module)
    for module, pins in PINNED_BY.items()
    for name, digest in pins.items()
}
"""The Chainlit code Cairn patches, copies or relies on, as of CHAINLIT_VERSION, and the module
to re-check when it changes."""


def source_digest(function: Callable[..., Any]) -> str:
    source = inspect.getsource(inspect.unwrap(function))
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def test_chainlit_is_the_version_the_patches_were_checked_against():
    assert chainlit.__version__ == CHAINLIT_VERSION, (
        "Chainlit was upgraded: re-check every module in PINNED_BY, then update "
        "CHAINLIT_VERSION (ui/chainlit/patches/__init__.py), the modules' pins and the pin in "
        "pyproject.toml (README: Installing and upgrading; tests/unit/test_lock.py checks they agree)"
    )


@pytest.mark.parametrize("name", sorted(CHECKED_SOURCE))
def test_the_patched_chainlit_code_is_unchanged(name):
    function, digest, patch = CHECKED_SOURCE[name]
    assert source_digest(function) == digest, (
        f"Chainlit changed {name}: re-check {patch}, then update its digest here"
    )


def test_a_changed_chainlit_function_fails_the_check():
    def get_file(request):  # the same name as Chainlit's file route, another body
        return None

    assert source_digest(get_file) != CHECKED_SOURCE["chainlit.server.get_file"][1]


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
    sockets.guard_socket_events(sio)
    auth = {"sessionId": session_id, "clientType": "webapp", "threadId": ""}
    with pytest.raises(SocketRefused):
        await sio.handlers["/"]["connect"]("sid", {}, auth)
    assert sio.calls == []


def test_files_go_to_a_private_folder_per_process(tmp_path, monkeypatch):
    monkeypatch.setattr(chainlit.config, "FILES_DIRECTORY", chainlit.config.FILES_DIRECTORY)
    first = uploads.relocate_files(tmp_path / "files")
    second = uploads.relocate_files(tmp_path / "files")
    assert first != second
    assert first.parent == second.parent == tmp_path / "files"
    assert second == chainlit.config.FILES_DIRECTORY
    session = BaseSession(
        id=str(uuid.uuid4()),
        client_type="webapp",
        thread_id=None,
        user=None,
        token=None,
        user_env=None,
    )
    assert session.files_dir.parent == second


_HOLDER = """
import sys, time
from pathlib import Path
from ui.chainlit.patches.uploads import claim_instance_folder
print(claim_instance_folder(Path(sys.argv[1])), flush=True)
time.sleep(600)
"""


def test_a_stale_folder_goes_and_a_live_siblings_stays(tmp_path: Path) -> None:
    """Folders are swept by lock, not by pid: a live process's survives, a killed one's goes."""
    import os
    import signal

    root = Path(__file__).resolve().parents[2]
    parent = tmp_path / "files"
    parent.mkdir()
    holders = [
        subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(parent)],
            cwd=tmp_path,  # importing chainlit writes .chainlit/ and .files/ here
            env={**os.environ, "PYTHONPATH": str(root)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        live, doomed = (Path(h.stdout.readline().strip()) for h in holders)  # type: ignore[union-attr]
        (live / "upload.txt").write_text("in use")
        (doomed / "left.txt").write_text("orphaned")
        legacy = parent / "instance-before-locks"
        legacy.mkdir()

        assert uploads.sweep_stale_instances(parent) == []
        holders[1].send_signal(signal.SIGKILL)
        holders[1].wait(10)

        assert uploads.sweep_stale_instances(parent) == [doomed]
        assert not doomed.exists()
        assert not doomed.with_name(doomed.name + ".lock").exists()
        assert (live / "upload.txt").read_text() == "in use"
        assert legacy.is_dir()
    finally:
        for holder in holders:
            holder.kill()
            holder.wait(10)


def test_relocating_removes_chainlits_empty_folder_and_swept_ones(tmp_path, monkeypatch):
    chainlit_default = tmp_path / ".files"
    chainlit_default.mkdir()
    monkeypatch.setattr(chainlit.config, "FILES_DIRECTORY", chainlit_default)
    monkeypatch.setattr(chainlit.server, "FILES_DIRECTORY", chainlit_default)
    parent = tmp_path / "files"
    parent.mkdir()
    (parent / "instance-gone").mkdir()
    (parent / "instance-gone.lock").touch()  # no process holds it

    folder = uploads.relocate_files(parent)

    assert not chainlit_default.exists()
    assert sorted(p.name for p in parent.iterdir()) == sorted([folder.name, folder.name + ".lock"])


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


def _session(emit: Any = None) -> WebsocketSession:
    """A live Chainlit socket session of Bob's (found by its socket id)."""
    from chainlit.user import User

    async def ignore(*_args: Any) -> None:
        return None

    return WebsocketSession(
        id=str(uuid.uuid4()),
        socket_id=f"sid-{uuid.uuid4()}",
        emit=emit or ignore,
        emit_call=emit or ignore,
        client_type="webapp",
        user_env={},
        user=User(identifier="bob"),
        token=None,
        chat_profile=None,
        thread_id=None,
    )


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
    {"message": _step(parentId=str(uuid.uuid4()))},
    {"message": _step(output="hi\x00there")},
    {"message": _step(metadata={"location\x00": "x"})},
    {"message": _step(metadata={"deep": [[{"x": "\x00"}]]})},
]


@pytest.mark.parametrize("payload", JUNK_MESSAGES)
async def test_a_malformed_client_message_never_reaches_chainlit(payload):
    sio = _FakeSio()
    sockets.guard_socket_events(sio)
    await sio.handlers["/"]["client_message"]("sid", payload)
    assert sio.calls == []
    assert sio.emitted == [("toast", {"message": MALFORMED, "type": "error"})]


@pytest.mark.parametrize(
    ("event", "payload", "told"),
    [
        ("client_message", {"message": _step(output="x" * 80_001)}, "80,001 characters"),
        ("client_message", {"message": _step(output="x" * 8_001)}, "the limit is 8,000"),
        ("client_message", {"message": _step(output="   ")}, "Your message is empty"),
        ("edit_message", {"message": {"id": str(uuid.uuid4()), "output": "y" * 9000}}, "9,000"),
    ],
)
async def test_an_oversize_or_empty_message_is_refused_before_chainlit_stores_it(
    event: str, payload: dict[str, Any], told: str
) -> None:
    """Chainlit writes a message as a step before on_message runs: refused there, the removal
    raced the write. Refused here, Chainlit never sees it, so nothing is stored."""
    sio = _FakeSio()
    sockets.guard_socket_events(sio, max_message_chars=8000)
    await sio.handlers["/"][event]("sid", payload)
    assert sio.calls == []
    [(kind, shown)] = sio.emitted
    assert kind == "toast"
    assert told in shown["message"]


async def test_a_message_at_the_limit_or_with_files_only_reaches_chainlit() -> None:
    sio = _FakeSio()
    sockets.guard_socket_events(sio, max_message_chars=8000)
    at_limit = {"message": _step(output="x" * 8000)}
    files_only = {"message": _step(output=""), "fileReferences": [{"id": "f"}]}
    await sio.handlers["/"]["client_message"]("sid", at_limit)
    await sio.handlers["/"]["client_message"]("sid", files_only)
    assert [name for name, _ in sio.calls] == ["client_message", "client_message"]


async def test_a_browser_message_reaches_chainlit():
    sio = _FakeSio()
    sockets.guard_socket_events(sio)
    payload = {"message": _step(), "fileReferences": [{"id": "f"}]}
    await sio.handlers["/"]["client_message"]("sid", payload)
    assert sio.calls == [("client_message", ("sid", payload))]


@pytest.mark.parametrize(
    ("metadata", "stored"),
    [
        (
            {"location": "http://localhost:8000/thread/x"},
            {"location": "http://localhost:8000/thread/x"},
        ),
        (
            {"location": "http://x/", "isAdmin": True, "blob": "y" * 50_000},
            {"location": "http://x/"},
        ),
        ({"location": "x" * 5000}, {}),
        ({"location": ["not", "text"]}, {}),
        (None, {}),
    ],
)
async def test_a_messages_metadata_keeps_only_the_page_address(metadata, stored):
    # Chainlit stores a message's metadata as the client sent it; the browser sends its address.
    sio = _FakeSio()
    sockets.guard_socket_events(sio)
    await sio.handlers["/"]["client_message"]("sid", {"message": _step(metadata=metadata)})
    [(_, (_, reached))] = sio.calls
    assert reached["message"]["metadata"] == stored


async def test_a_message_id_already_in_the_chat_is_refused_as_a_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sent again under an id already used, it would rewrite that message instead of adding one."""
    from chainlit.chat_context import chat_contexts
    from chainlit.session import ws_sessions_sid

    session = object.__new__(WebsocketSession)
    session.id = str(uuid.uuid4())
    monkeypatch.setitem(ws_sessions_sid, "sid", session)
    sent = _step()
    # What Chainlit's process_message put in the chat (only the id is read).
    monkeypatch.setitem(chat_contexts, session.id, [SimpleNamespace(id=sent["id"])])
    sio = _FakeSio()
    sockets.guard_socket_events(sio)

    await sio.handlers["/"]["client_message"]("sid", {"message": {**sent, "output": "rewritten"}})
    assert sio.calls == []
    assert sio.emitted == [("toast", {"message": sockets.REPLAYED, "type": "error"})]

    new = {"message": _step(output="a new message")}
    await sio.handlers["/"]["client_message"]("sid", new)
    assert sio.calls == [("client_message", ("sid", new))]


async def test_an_edit_is_refused_when_editing_is_turned_off(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(chainlit.config.config.features, "edit_message", False)
    sio = _FakeSio()
    sockets.guard_socket_events(sio)
    await sio.handlers["/"]["edit_message"]("sid", {"message": {"id": "x", "output": "y"}})
    assert sio.calls == []


@pytest.mark.parametrize("payload", [{"message": {"id": 5, "output": "y"}}, {"message": "x"}, {}])
async def test_a_malformed_edit_never_reaches_the_edit_handler(payload):
    sio = _FakeSio()
    sockets.guard_socket_events(sio)
    await sio.handlers["/"]["edit_message"]("sid", payload)
    assert sio.calls == []


async def test_stop_cancels_an_edits_run_as_it_does_a_messages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from chainlit.chat_context import chat_contexts

    emitted: list[str] = []

    async def emit(event: str, *_args: Any) -> None:
        emitted.append(event)

    session = _session(emit)
    sent = SimpleNamespace(id=str(uuid.uuid4()), type="user_message")
    monkeypatch.setitem(chat_contexts, session.id, [sent])
    started, cancelled = asyncio.Event(), []

    async def long_edit(message: Any, text: str, later: list[Any]) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(text)
            raise

    monkeypatch.setattr(edits, "_edit_handler", long_edit)
    sio = _FakeSio()
    edits.route_message_edits(sio)
    edit = asyncio.create_task(
        sio.handlers["/"]["edit_message"](
            session.socket_id, {"message": {"id": sent.id, "output": "new"}}
        )
    )
    try:
        await asyncio.wait_for(started.wait(), 5)
        assert session.current_task is edit
        session.current_task.cancel()  # what Chainlit's stop handler does
        await asyncio.wait_for(edit, 5)
    finally:
        await session.delete()
    assert cancelled == ["new"]
    assert emitted[-1] == "task_end"


def test_editing_is_on_and_goes_to_cairns_handler():
    assert chainlit.config.config.features.edit_message is True
    sio = _FakeSio()
    edits.route_message_edits(sio)
    edits.route_message_edits(sio)
    sockets.guard_socket_events(sio)
    handler = sio.handlers["/"]["edit_message"]
    assert getattr(inspect.unwrap(handler), "cairn_edits", False)
    assert inspect.unwrap(handler) is not chainlit.socket.edit_message


@pytest.mark.parametrize("event", ["message_favorite", "audio_chunk"])
async def test_events_of_features_turned_off_are_refused(event):
    sio = _FakeSio()
    sockets.guard_socket_events(sio)
    await sio.handlers["/"][event]("sid", {"message": {"id": "x", "output": "y"}})
    assert sio.calls == []


async def test_the_browsers_favorites_request_passes_quietly_with_favorites_turned_off():
    """The client asks on every connection; refusing it showed an error toast on every load.
    Chainlit's handler does nothing with favorites off, and arguments are still refused."""
    assert not chainlit.config.config.features.favorites
    sio = _FakeSio()
    sockets.guard_socket_events(sio)
    await sio.handlers["/"]["fetch_favorites"]("sid")
    assert sio.calls == [("fetch_favorites", ("sid",))]
    assert sio.emitted == []
    await sio.handlers["/"]["fetch_favorites"]("sid", {"user": "someone-else"})
    assert sio.calls == [("fetch_favorites", ("sid",))]
    assert sio.emitted == [("toast", {"message": MALFORMED, "type": "error"})]


async def test_a_handler_failure_shows_a_fixed_text():
    sio = _FakeSio()

    async def broken(sid: str) -> None:
        raise KeyError("id")

    sio.handlers["/"]["clear_session"] = broken
    sockets.guard_socket_events(sio)
    await sio.handlers["/"]["clear_session"]("sid")
    assert sio.emitted == [("toast", {"message": sockets.FAILED, "type": "error"})]


async def test_stop_reaches_chainlit_only_while_something_runs() -> None:
    # Chainlit's stop handler posts (and stores) "Task manually stopped." before it looks for a
    # task: with nothing running, the notice was all it did.
    session = _session()
    sio = _FakeSio()
    sockets.guard_socket_events(sio)
    stop = sio.handlers["/"]["stop"]
    try:
        await stop("no-such-socket")
        await stop(session.socket_id)  # no task yet
        session.current_task = asyncio.create_task(asyncio.sleep(0))
        await session.current_task
        await stop(session.socket_id)  # its task is done
        assert sio.calls == []

        session.current_task = asyncio.create_task(asyncio.sleep(30))
        await stop(session.socket_id)
        assert sio.calls == [("stop", (session.socket_id,))]
        assert sio.emitted == []
    finally:
        if session.current_task is not None:
            session.current_task.cancel()
        session.delete()


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
    with pytest.raises(sockets.Malformed):
        check_ask_answer(spec, answer)


@pytest.mark.parametrize(
    "event", ["edit_message", "window_message", "chat_settings_change", "chat_settings_edit"]
)
async def test_a_nul_character_in_any_frame_never_reaches_chainlit(event: str) -> None:
    """Postgres stores no NUL in text or jsonb: Chainlit's write failed half-way."""
    sio = _FakeSio()
    sockets.guard_socket_events(sio)
    await sio.handlers["/"][event]("sid", {"message": {"id": str(uuid.uuid4()), "output": "\x00"}})
    assert sio.calls == []
    assert sio.emitted == [("toast", {"message": MALFORMED, "type": "error"})]


@pytest.mark.parametrize(
    "auth",
    [
        {"userEnv": '{"KEY": "a\\u0000b"}'},
        {"chatProfile": "Assistant\x00"},
        {"threadId": str(uuid.uuid4()) + "\x00"},
    ],
)
def test_a_nul_character_in_the_connect_auth_is_refused(auth: dict[str, str]) -> None:
    with pytest.raises(sockets.Malformed):
        sockets.check_connect({"sessionId": str(uuid.uuid4()), "clientType": "webapp", **auth})


def test_a_nul_character_in_an_ask_answer_is_refused() -> None:
    with pytest.raises(sockets.Malformed):
        check_ask_answer("text", _step(output="my edit\x00"))
    with pytest.raises(sockets.Malformed):
        check_ask_answer("action", {"name": "approve", "payload": {"x": "\x00"}})


def test_good_ask_answers_pass():
    check_ask_answer("text", _step())
    check_ask_answer("action", {"name": "approve", "payload": {}})
    check_ask_answer("file", [{"id": "f"}])
    check_ask_answer("text", None)


def test_the_patched_names_exist(tmp_path: Path):
    assert isinstance(chainlit.config.FILES_DIRECTORY, Path)
    assert chainlit.server.sio.eio.cors_allowed_origins is not None


@pytest.fixture
def restored(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Every global install() touches, put back after the test."""
    import importlib

    config = chainlit.config.config
    for module, name in [
        (chainlit.config, "FILES_DIRECTORY"),
        (chainlit.server, "is_thread_author"),
        (chainlit.emitter, "ChainlitEmitter"),
        (chainlit.element.TaskList, "preprocess_content"),
        (importlib.import_module("chainlit.step"), "time"),
        (importlib.import_module("chainlit.message"), "time"),
        (config.project, "user_session_timeout"),
        (config.features, "unsafe_allow_html"),
    ]:
        monkeypatch.setattr(module, name, getattr(module, name))
    monkeypatch.setitem(chainlit.server.sio.handlers, "/", dict(chainlit.server.sio.handlers["/"]))
    origins = list(config.project.allow_origins)
    monkeypatch.setenv("CHAINLIT_AUTH_SECRET", "before")
    monkeypatch.setenv("CHAINLIT_URL", "before")
    upload = config.features.spontaneous_file_upload
    if upload is not None:
        monkeypatch.setattr(upload, "accept", upload.accept)
        monkeypatch.setattr(upload, "max_size_mb", upload.max_size_mb)
    monkeypatch.setattr(config.project, "allow_origins", origins)
    monkeypatch.setattr(chainlit.server.sio.eio, "cors_allowed_origins", [])
    return monkeypatch


def test_install_applies_every_patch(restored: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import importlib
    import os

    import chainlit.element
    import chainlit.emitter

    from graphs.core.settings import Settings

    settings = Settings(data_dir=tmp_path, session_hours=3, max_upload_mb=7)
    chainlit.config.config.features.unsafe_allow_html = True
    origins = ["http://cairn.test"]
    for _ in range(2):
        chainlit_settings.configure(
            settings, public_url="http://cairn.test", auth_secret="s" * 40, origins=origins
        )
        folder = install(files_parent=tmp_path / "files", origins=origins)

    config = chainlit.config.config
    assert os.environ["CHAINLIT_AUTH_SECRET"] == "s" * 40
    assert os.environ["CHAINLIT_URL"] == "http://cairn.test"
    assert config.project.allow_origins == origins
    assert chainlit.server.sio.eio.cors_allowed_origins == origins
    assert config.project.user_session_timeout == 3 * 3600
    assert config.features.unsafe_allow_html is False
    handlers = chainlit.server.sio.handlers["/"]
    assert all(getattr(h, "cairn_guarded", False) for h in handlers.values())
    # Installed twice, wrapped once.
    assert not getattr(inspect.unwrap(handlers["stop"]), "cairn_guarded", False)
    assert handlers["stop"].__wrapped__ is inspect.unwrap(handlers["stop"])
    assert getattr(inspect.unwrap(handlers["edit_message"]), "cairn_edits", False)
    assert folder.parent == tmp_path / "files"
    assert folder == chainlit.config.FILES_DIRECTORY
    for name in ("chainlit.step", "chainlit.message"):
        assert isinstance(importlib.import_module(name).time, clock.SpacedClock)
    assert chainlit.server.is_thread_author is acl.require_thread_author
    assert chainlit.emitter.ChainlitEmitter is SanitisingEmitter
    assert chainlit.element.TaskList.preprocess_content is not (output.CHAINLIT_TASK_CONTENT)


async def test_only_the_users_own_sockets_are_disconnected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from chainlit.session import ws_sessions_id
    from chainlit.user import User

    ended: list[str] = []

    async def disconnect(socket_id: str) -> None:
        ended.append(socket_id)

    monkeypatch.setattr(chainlit.server.sio, "disconnect", disconnect)
    for socket_id, who in [("s1", "cairn:alice"), ("s2", "cairn:bob"), ("s3", "cairn:alice")]:
        session = object.__new__(WebsocketSession)
        session.socket_id = socket_id
        session.user = User(identifier=who)
        monkeypatch.setitem(ws_sessions_id, str(uuid.uuid4()), session)
    assert await sessions.disconnect_user_sockets("cairn:alice") == 2
    assert sorted(ended) == ["s1", "s3"]


async def test_task_signals_show_the_run_busy_and_idle_again_even_when_it_fails() -> None:
    from chainlit.context import init_http_context

    signals: list[str] = []

    class Emitter:
        async def task_start(self) -> None:
            signals.append("busy")

        async def task_end(self) -> None:
            signals.append("idle")

    async def failing_run() -> None:
        async with sessions.task_signals():
            signals.append("run")
            raise RuntimeError

    init_http_context().emitter = Emitter()  # type: ignore[assignment]
    with pytest.raises(RuntimeError):
        await failing_run()
    assert signals == ["busy", "run", "idle"]


async def test_stop_cancels_a_buttons_run_and_only_the_run() -> None:
    # A button's callback runs inside Chainlit's HTTP request; `stoppable` runs its work as the
    # session's current task, the one Chainlit's stop handler cancels.

    session = _session()
    started, cancelled = asyncio.Event(), []

    async def long_run() -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "finished"

    async def button_request() -> str | None:
        init_ws_context(session)
        return await sessions.stoppable(long_run())

    request = asyncio.create_task(button_request())
    try:
        await asyncio.wait_for(started.wait(), 5)
        run = session.current_task
        assert run is not None
        assert run is not request
        run.cancel()  # what Chainlit's stop handler does
        assert await asyncio.wait_for(request, 5) is None  # the request answers normally
        assert cancelled == [True]

        # The request cancelled (its client gone) still takes its run with it.
        cancelled.clear()
        started.clear()
        request = asyncio.create_task(button_request())
        await asyncio.wait_for(started.wait(), 5)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        assert cancelled == [True]
        assert session.current_task is not None
        assert session.current_task.cancelled()

        # Left alone, the run's result is the request's.
        async def quick() -> str:
            return "done"

        init_ws_context(session)
        assert await sessions.stoppable(quick()) == "done"
    finally:
        request.cancel()
        session.delete()
