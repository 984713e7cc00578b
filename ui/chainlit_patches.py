"""Every place Cairn patches Chainlit 2.12.0 or copies its internals, with the reason for each.

Chainlit trusts the client with session ids, thread ids, socket event shapes and ask answers;
it blocks the event loop in every Step; it renders model text as given; it keeps its settings,
uploads folder, thread ACL and sockets in module globals. Each patch below names the Chainlit
code it relies on and why it exists; tests/unit/test_chainlit_patches.py pins a hash of that
Chainlit source and fails, naming the patch to re-check, when an upgrade changes it.

The patches, in the order `install` applies them:

- event loop: `chainlit run` makes asyncio re-entrant with nest_asyncio, which swaps in
  pure-Python tasks and futures; Cairn never re-enters the loop, so it serves on uvloop with
  C tasks instead (`serve_on_fast_loop`).
- settings: `chainlit_config` and the `CHAINLIT_AUTH_SECRET` / `CHAINLIT_URL` variables from
  Cairn's Settings (`configure_chainlit`).
- sockets: every socket handler checks its frame first (`guard_socket_events`).
- edits: editing a message forks the LangGraph thread instead of re-sending it on top of the
  old history (`route_message_edits`).
- uploads: a private uploads folder per process (`relocate_files`).
- clock: Chainlit's 1 ms sleep per Step/Message only when needed (`SpacedClock`).
- thread ACL: one answer for unknown and foreign threads (`require_thread_author`).
- output: the sanitising emitter and task list (`SanitisingEmitter`, `guard_output`).

And helpers for code that must reach Chainlit's internals: `exit_if_startup_fails` (Chainlit
swallows a failed start-up), `mount_before_catch_all` (routes before Chainlit's catch-all),
`task_signals` (the busy/idle signals action callbacks lack), `stoppable` (a button's run as
the task Stop cancels), `disconnect_user_sockets`
and `enter_live_session` (Chainlit's socket registry and context) and `write_assistant_message`
(Chainlit's Step table). ui/surface.py's `Reply` subclasses Chainlit's Message (streaming, send,
update, remove), pinned by the same test. ui/data_layer.py is Chainlit's data layer on Cairn's pool (the
documented extension point); the Chainlit SQL it copies is pinned by the same test.
"""

from __future__ import annotations

import _asyncio
import asyncio
import asyncio.events
import asyncio.futures
import asyncio.runners
import asyncio.tasks
import contextlib
import fcntl
import functools
import importlib
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import chainlit.config
import chainlit.element
import chainlit.emitter
import chainlit.server
from chainlit.auth import get_current_user, get_token_from_cookies
from chainlit.chat_context import chat_context, chat_contexts
from chainlit.config import config as chainlit_config
from chainlit.context import context as chainlit_context
from chainlit.context import init_ws_context
from chainlit.data import get_data_layer
from chainlit.emitter import ChainlitEmitter
from chainlit.message import ErrorMessage
from chainlit.session import WebsocketSession, ws_sessions_id
from fastapi import HTTPException
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError
from socketio.exceptions import ConnectionRefusedError as SocketRefused
from starlette.requests import cookie_parser

from auth.ownership import NOT_FOUND
from auth.sessions import session_key
from graphs.core.errors import is_database_outage
from graphs.core.fence import fenced
from ui.output_guard import policy_for, sanitise_step, sanitise_text
from ui.render import StreamSanitiser

if TYPE_CHECKING:
    from fastapi import APIRouter, FastAPI

    from graphs.core.persistence import Pool
    from graphs.core.settings import Settings

log = logging.getLogger("cairn.security")
T = TypeVar("T")

CHAINLIT_VERSION = "2.12.0"
"""The Chainlit release every patch and copy in this module was checked against."""

SOCKET_EVENTS = frozenset(
    {
        "connect",
        "connection_successful",
        "clear_session",
        "disconnect",
        "stop",
        "edit_message",
        "message_favorite",
        "fetch_favorites",
        "client_message",
        "window_message",
        "audio_start",
        "audio_chunk",
        "audio_end",
        "chat_settings_change",
        "chat_settings_edit",
    }
)
"""Every event chainlit/socket.py registers; each one gets a check below."""

MALFORMED = "That request was malformed and has been ignored."
REPLAYED = "That message was already sent and has been ignored."
FAILED = "Something went wrong on the server. Please try again."
REFUSED_CONNECTION = "invalid connection request"

_MAX_TEXT = 1_000_000
"""A hard ceiling on any text field; the app's own, lower limits give the user-facing message."""


class Malformed(ValueError):
    """A client frame that does not have the shape Chainlit expects; it is never passed on."""


def is_session_id(value: object) -> bool:
    """A canonical lowercase UUID, as Chainlit's frontend generates: never a path, '.', or ''.

    Chainlit builds `.files/<session id>` from it, writes uploads there and `rmtree`s it when
    the session ends (chainlit/session.py `BaseSession.files_dir`, `WebsocketSession.delete`).
    """
    if not isinstance(value, str) or len(value) != 36:
        return False
    try:
        return str(uuid.UUID(value)) == value
    except ValueError:
        return False


def relocate_files(parent: Path) -> Path:
    """One private uploads folder per process, outside the source tree.

    Chainlit keeps uploads in `chainlit.config.FILES_DIRECTORY` (`<cwd>/.files`, shared by
    every process started there) and its lifespan `rmtree`s that whole folder at shutdown
    (chainlit/server.py `lifespan`): one instance stopping deleted its siblings' uploads.
    `BaseSession.files_dir` reads the name from chainlit.config at each call, the lifespan
    from chainlit.server's import, so both are set. The empty `<cwd>/.files` Chainlit made
    on import goes (no process uses it any more), and so do the folders of processes that
    ended without Chainlit's clean-up (`sweep_stale_instances`).
    """
    parent.mkdir(parents=True, exist_ok=True)
    folder = claim_instance_folder(parent)
    sweep_stale_instances(parent)
    chainlit_default = Path(chainlit.config.FILES_DIRECTORY)
    if chainlit_default.name == ".files":
        with contextlib.suppress(OSError):  # not empty (an older Cairn's uploads) or gone: kept
            chainlit_default.rmdir()
    chainlit.config.FILES_DIRECTORY = folder
    chainlit.server.FILES_DIRECTORY = folder  # type: ignore[attr-defined]
    return folder


_INSTANCE_LOCKS: list[int] = []
"""The open lock files of this process's folders: held until the process ends, however it ends."""


def claim_instance_folder(parent: Path) -> Path:
    """A new `instance-*` folder with its `instance-*.lock` beside it, locked by this process.

    The lock (flock) is the liveness check: the kernel drops it when the process ends, even
    by kill -9, and unlike a pid it cannot be mistaken for a later process. The lock file is
    locked under a temporary name and then renamed, so no sweep ever sees it unlocked.
    """
    fd, temp = tempfile.mkstemp(prefix=".claiming-", dir=parent)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    folder = Path(tempfile.mkdtemp(prefix="instance-", dir=parent))
    os.rename(temp, folder.with_name(folder.name + ".lock"))
    _INSTANCE_LOCKS.append(fd)
    return folder


def sweep_stale_instances(parent: Path) -> list[Path]:
    """Remove the folders (and lock files) of processes that are gone; returns those removed.

    A folder counts as stale only when its lock file can be locked, i.e. no live process
    holds it. A folder without a lock file (made by a Cairn before these locks) is left.
    """
    removed = []
    for lock_path in sorted(parent.glob("instance-*.lock")) + sorted(parent.glob(".claiming-*")):
        try:
            if lock_path.suffix != ".lock" and time.time() - lock_path.stat().st_mtime < 60:
                continue  # being claimed right now: locked a moment after it is made
            fd = os.open(lock_path, os.O_RDWR)
        except FileNotFoundError:  # another sweep got there first
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # its process is alive
            os.close(fd)
            continue
        try:
            if lock_path.suffix == ".lock":
                folder = lock_path.with_suffix("")
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
            with contextlib.suppress(FileNotFoundError):
                lock_path.unlink()
        finally:
            os.close(fd)
    return removed


# --- The shapes Chainlit's handlers index into (chainlit/socket.py, chainlit/emitter.py) ---


_MAX_URL = 4096
"""Longest page address kept with a message (the browser sends `window.location.href`)."""


class _Frame(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ConnectAuth(_Frame):
    """socket.py `connect`: `auth["sessionId"]`, `auth["clientType"]`, `json.loads(userEnv)`."""

    sessionId: StrictStr
    clientType: Literal["webapp", "copilot", "teams", "slack", "discord"]
    threadId: StrictStr | None = Field(default=None, max_length=100)
    userEnv: StrictStr | None = Field(default=None, max_length=100_000)
    chatProfile: StrictStr | None = Field(default=None, max_length=500)


class MessageStep(_Frame):
    """emitter.py `process_message` / message.py `Message.from_dict`: a user's message step."""

    id: StrictStr
    output: StrictStr = Field(max_length=_MAX_TEXT)
    createdAt: StrictStr = Field(max_length=64)
    type: Literal["user_message"]
    name: StrictStr | None = Field(default=None, max_length=500)
    parentId: StrictStr | None = Field(default=None, max_length=100)
    command: StrictStr | None = Field(default=None, max_length=500)
    language: StrictStr | None = Field(default=None, max_length=100)
    metadata: dict[str, Any] | None = None
    modes: dict[str, Any] | None = None


class FileRef(_Frame):
    id: StrictStr = Field(max_length=100)


class ClientMessage(_Frame):
    message: MessageStep
    fileReferences: list[FileRef] | None = Field(default=None, max_length=50)


class EditedStep(_Frame):
    id: StrictStr = Field(max_length=100)
    output: StrictStr = Field(max_length=_MAX_TEXT)


class EditMessage(_Frame):
    message: EditedStep


class FavoriteStep(_Frame):
    id: StrictStr = Field(max_length=100)
    metadata: dict[str, Any] | None = None


class FavoriteMessage(_Frame):
    message: FavoriteStep


class AudioChunk(BaseModel):
    """socket.py `audio_chunk`: `InputAudioChunk(**payload)`, so no other keys."""

    model_config = ConfigDict(extra="forbid")

    isStart: StrictBool
    mimeType: StrictStr = Field(max_length=100)
    elapsedTime: float
    data: bytes


class AskAction(_Frame):
    """emitter.py `send_ask_user`, an action answer: `action_res["name"]`."""

    name: StrictStr = Field(max_length=200)
    payload: dict[str, Any] = Field(default_factory=dict)


def _model(model: type[BaseModel], value: object) -> None:
    try:
        model.model_validate(value)
    except ValidationError as exc:
        raise Malformed(str(exc.errors(include_input=False, include_url=False))) from None


def has_nul(value: object, depth: int = 0) -> bool:
    """A NUL character anywhere in a client value (keys included), which Postgres cannot store
    in text or jsonb: the write failed half-way (a message in the graph but not in the stored
    conversation, a first message leaving the conversation without its row)."""
    if isinstance(value, str):
        return "\x00" in value
    if depth > 64:
        return True  # nothing Chainlit sends nests this deep
    if isinstance(value, dict):
        return any(has_nul(k, depth + 1) or has_nul(v, depth + 1) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(has_nul(v, depth + 1) for v in value)
    return False


def _text_only(value: object) -> None:
    if has_nul(value):
        msg = "a NUL character in the frame"
        raise Malformed(msg)


def _step_id(value: str) -> None:
    # emitter.py `process_message` asserts a version-4 UUID.
    if not is_session_id(value) or uuid.UUID(value).version != 4:
        msg = "message id is not a version-4 UUID"
        raise Malformed(msg)


def _enabled(feature: str) -> None:
    if not getattr(chainlit_config.features, feature, False):
        msg = f"{feature} is turned off"
        raise Malformed(msg)


def _none(sid: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    if args:
        msg = "this event takes no arguments"
        raise Malformed(msg)
    return ()


def _one(args: tuple[Any, ...]) -> Any:
    if len(args) != 1:
        msg = "this event takes one argument"
        raise Malformed(msg)
    return args[0]


def _client_message(sid: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    payload = _one(args)
    _model(ClientMessage, payload)
    _step_id(payload["message"]["id"])
    if payload["message"].get("parentId") is not None:
        # The browser never sends one; stored as is, it would hang the message under a step
        # of any conversation (and Step's cascade would delete it with that one).
        msg = "a new message has no parent step"
        raise Malformed(msg)
    # Chainlit stores the client's metadata with the message as is. The browser sends only the
    # page's address; anything else a hand-written client puts there is dropped.
    metadata = payload["message"].get("metadata") or {}
    location = metadata.get("location")
    payload["message"]["metadata"] = (
        {"location": location} if isinstance(location, str) and len(location) <= _MAX_URL else {}
    )
    return (payload,)


async def _new_message(sid: str, args: tuple[Any, ...]) -> bool:
    """A message id the client has not used before, in this chat or in any stored one.

    Chainlit stores a message under the client's id: an id already sent rewrote that stored
    message (or, another conversation's, left this one out of the history), and the graph's
    `add_messages` replaced the earlier message in place instead of adding a turn.
    """
    message_id = args[0]["message"]["id"]
    session = WebsocketSession.get(sid)
    if session is not None and any(m.id == message_id for m in chat_contexts.get(session.id, [])):
        return False
    step_exists = getattr(get_data_layer(), "step_exists", None)
    try:
        return step_exists is None or not await step_exists(message_id)
    except Exception as exc:
        if not is_database_outage(exc):
            raise
        return True  # the message is kept and answered with a Retry (ui/chat.handle_message)


_FRESH: dict[str, Callable[[str, tuple[Any, ...]], Awaitable[bool]]] = {
    "client_message": _new_message,
}
"""Checks that need the session or the database, run after the frame's shape is checked."""


def _nothing_to_stop(sid: str) -> bool:
    """Chainlit's `stop` (socket.py) posts "Task manually stopped." into the conversation, and
    the data layer stores it, before looking for a task to cancel: a Stop frame sent while
    nothing runs (by hand, or a double click) left that notice in the user's history."""
    session = WebsocketSession.get(sid)
    task = session.current_task if session is not None else None
    return task is None or task.done()


_IDLE: dict[str, Callable[[str], bool]] = {"stop": _nothing_to_stop}
"""Events dropped without a word when they have nothing to act on."""


def _edit_message(sid: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    # The config hides the button only; the server's handler stays registered.
    _enabled("edit_message")
    payload = _one(args)
    _model(EditMessage, payload)
    _step_id(payload["message"]["id"])
    if payload["message"].get("type", "user_message") != "user_message":
        msg = "only a user's own message can be edited"
        raise Malformed(msg)
    return (payload,)


def _message_favorite(sid: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    _enabled("favorites")
    payload = _one(args)
    _model(FavoriteMessage, payload)
    return (payload,)


def _fetch_favorites(sid: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    # The browser asks on every connection, whatever the config; Chainlit's handler then does
    # nothing. Refusing it would show every user an error toast on every page load.
    return _none(sid, args)


def _audio(sid: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    audio = chainlit_config.features.audio
    if audio is None or not audio.enabled:
        msg = "audio is turned off"
        raise Malformed(msg)
    return args


def _audio_chunk(sid: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    _audio(sid, args)
    payload = _one(args)
    _model(AudioChunk, payload)
    return (payload,)


def _audio_signal(sid: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return _none(sid, _audio(sid, args))


def _window_message(sid: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return (_one(args),)


def _chat_settings(sid: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Only the widgets the app sent, each with a plain value: the dict is persisted as is."""
    values = _one(args)
    session = WebsocketSession.get(sid)
    known = session.chat_settings if session is not None else {}
    if not isinstance(values, dict) or not values.keys() <= known.keys():
        msg = "settings are not a dict of this chat's settings"
        raise Malformed(msg)
    for value in values.values():
        if not isinstance(value, str | int | float | bool | None) or (
            isinstance(value, str) and len(value) > 10_000
        ):
            msg = "a setting's value is not a plain value"
            raise Malformed(msg)
    return (values,)


def _disconnect(sid: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    # python-socketio passes the reason; Chainlit's handler takes none.
    return ()


_CHECKS: dict[str, Callable[[str, tuple[Any, ...]], tuple[Any, ...]]] = {
    "connection_successful": _none,
    "clear_session": _none,
    "disconnect": _disconnect,
    "stop": _none,
    "edit_message": _edit_message,
    "message_favorite": _message_favorite,
    "fetch_favorites": _fetch_favorites,
    "client_message": _client_message,
    "window_message": _window_message,
    "audio_start": _audio_signal,
    "audio_chunk": _audio_chunk,
    "audio_end": _audio_signal,
    "chat_settings_change": _chat_settings,
    "chat_settings_edit": _chat_settings,
}


def check_ask_answer(spec_type: object, answer: object) -> None:
    """emitter.py `send_ask_user` indexes the client's answer by the ask's type."""
    if answer is None:
        return
    _text_only(answer)
    if spec_type == "text":
        _model(MessageStep, answer)
        _step_id(answer["id"])  # type: ignore[index]
    elif spec_type == "action":
        _model(AskAction, answer)
    elif spec_type == "file":
        if not isinstance(answer, list) or len(answer) > 50:
            msg = "file answer is not a list of file references"
            raise Malformed(msg)
        for ref in answer:
            _model(FileRef, ref)
    elif not isinstance(answer, dict):
        msg = "answer is not an object"
        raise Malformed(msg)


def check_connect(auth: object) -> ConnectAuth:
    _text_only(auth)
    try:
        checked = ConnectAuth.model_validate(auth)
    except ValidationError as exc:
        raise Malformed(str(exc.errors(include_input=False, include_url=False))) from None
    if not is_session_id(checked.sessionId):
        msg = "session id is not a canonical UUID"
        raise Malformed(msg)
    if checked.userEnv:
        try:
            env = json.loads(checked.userEnv)
        except ValueError:
            env = None
        if (
            not isinstance(env, dict)
            or not all(isinstance(v, str) for v in env.values())
            or has_nul(env)
        ):
            msg = "userEnv is not a JSON object of strings"
            raise Malformed(msg)
    return checked


# --- Wrapping the registered handlers ---

Handler = Callable[..., Awaitable[Any]]
Emit = Callable[[str, Any, str], Awaitable[None]]


def guard_socket_events(sio: Any) -> None:
    """Wrap each of Chainlit's socket handlers once: checked arguments, fixed error texts.

    Before: a malformed frame reached Chainlit's handlers, which answered with the raw
    exception text (`'id'`, `string indices must be integers`) or a dead socket.
    """
    handlers: dict[str, Handler] = sio.handlers["/"]
    missing = SOCKET_EVENTS - handlers.keys()
    if missing:
        msg = f"Chainlit no longer registers {sorted(missing)}: review ui/chainlit_patches.py"
        raise RuntimeError(msg)

    async def tell(sid: str, text: str) -> None:
        await sio.emit("toast", {"message": text, "type": "error"}, to=sid)

    for name, handler in list(handlers.items()):
        if getattr(handler, "cairn_guarded", False):
            continue
        if name == "connect":
            handlers[name] = _guard_connect(handler)
        else:
            handlers[name] = _guard_event(name, handler, _CHECKS.get(name, _none), tell)


def _guard_event(
    name: str,
    handler: Handler,
    check: Callable[[str, tuple[Any, ...]], tuple[Any, ...]],
    tell: Callable[[str, str], Awaitable[None]],
) -> Handler:
    @functools.wraps(handler)
    async def guarded(sid: str, *args: Any) -> Any:
        try:
            _text_only(args)
            checked = check(sid, args)
        except Malformed as exc:
            log.warning("refused malformed %s event from socket %s: %s", name, sid, exc)
            await tell(sid, MALFORMED)
            return None
        if (idle := _IDLE.get(name)) is not None and idle(sid):
            return None
        try:
            if (fresh := _FRESH.get(name)) is not None and not await fresh(sid, checked):
                log.warning("refused replayed %s from socket %s", name, sid)
                await tell(sid, REPLAYED)
                return None
            return await handler(sid, *checked)
        except Exception:
            log.exception("socket event %s from %s failed", name, sid)
            await tell(sid, FAILED)
            return None

    guarded.cairn_guarded = True  # type: ignore[attr-defined]
    return guarded


def _guard_connect(handler: Handler) -> Handler:
    @functools.wraps(handler)
    async def connect(sid: str, environ: dict[str, Any], auth: object = None) -> Any:
        try:
            checked = check_connect(auth)
        except Malformed as exc:
            log.warning("refused socket connect: %s", exc)
            raise SocketRefused(REFUSED_CONNECTION) from None
        fields = dict(auth)  # type: ignore[call-overload]
        fields["threadId"] = await _thread_to_resume(environ, checked.threadId)
        try:
            accepted = await handler(sid, environ, fields)
        except ConnectionRefusedError:
            raise
        except Exception:
            log.exception("socket connect failed")
            raise SocketRefused(REFUSED_CONNECTION) from None
        if (session := WebsocketSession.get(sid)) is not None:
            session.emit_call = _checked_answers(session.emit_call, sid)
        return accepted

    connect.cairn_guarded = True  # type: ignore[attr-defined]
    return connect


async def _thread_to_resume(environ: dict[str, Any], thread_id: str | None) -> str | None:
    """The client's thread id if the signed-in user wrote it, else a fresh id no one has.

    Chainlit refuses the socket for someone else's thread ("authorization failed", then
    "Could not reach the server") but opens a missing one under the client's id: the two
    told apart which ids exist. Both now take Chainlit's missing-thread path ("Thread not
    found.", a fresh chat) under a new server-chosen id, so a conversation never starts in
    a thread id the client picked, least of all another user's.
    """
    if not thread_id:
        return None
    user = await _socket_user(environ)
    data_layer = get_data_layer()
    if user is not None and data_layer is not None and is_session_id(thread_id):
        author = await data_layer.get_thread_author(thread_id)
        if author and author == user.identifier:
            return thread_id
        if author:
            log.warning("refused: %s opened thread %s of another user", user.identifier, thread_id)
    return str(uuid.uuid4())


async def _socket_user(environ: dict[str, Any]) -> Any:
    token = get_token_from_cookies(cookie_parser(environ.get("HTTP_COOKIE", "")))
    if not token:
        return None
    try:
        return await get_current_user(token=token)
    except Exception:
        return None


def _checked_answers(emit_call: Handler, sid: str) -> Handler:
    """An ask's answer goes through the same checks; a malformed one counts as no answer."""
    if getattr(emit_call, "cairn_guarded", False):
        return emit_call

    @functools.wraps(emit_call)
    async def checked(event: str, data: Any, *rest: Any) -> Any:
        answer = await emit_call(event, data, *rest)
        spec = data.get("spec") if isinstance(data, dict) else None
        spec_type = spec.get("type") if isinstance(spec, dict) else None
        try:
            if event == "ask":
                check_ask_answer(spec_type, answer)
        except Malformed as exc:
            log.warning("refused malformed answer to an ask from socket %s: %s", sid, exc)
            return None
        return answer

    checked.cairn_guarded = True  # type: ignore[attr-defined]
    return checked


# --- install: every patch, once per process, before Chainlit serves ---


def install(*, settings: Settings, public_url: str, auth_secret: str) -> Path:
    """Apply every patch in this module; returns this process's uploads folder.

    Safe to run again in one process: no patch wraps or replaces twice.
    """
    serve_on_fast_loop()
    configure_chainlit(settings, public_url=public_url, auth_secret=auth_secret)
    route_message_edits(chainlit.server.sio)
    guard_socket_events(chainlit.server.sio)
    folder = relocate_files(settings.data_dir / "files")
    space_out_steps()
    # Chainlit's thread routes call the name imported into chainlit.server.
    chainlit.server.is_thread_author = require_thread_author  # type: ignore[assignment]
    guard_output()
    return folder


# --- event loop: C tasks on uvloop instead of nest_asyncio's pure-Python ones ---


def serve_on_fast_loop() -> str:
    """Undo nest_asyncio before Chainlit starts its loop; returns the loop Cairn will serve on.

    chainlit/cli/__init__.py calls `nest_asyncio.apply()` on import so that `cl.run_sync` can
    re-enter a running loop. To allow that, nest_asyncio replaces asyncio's C `Task` and
    `Future` with the pure-Python ones, `asyncio.run` and the loop's `_run_once` with its own:
    every await of every request then runs Python code that is C otherwise. Cairn never calls
    `run_sync` or re-enters the loop (its graphs and tests run on plain asyncio), so once
    app.py is loaded (chainlit/cli `run_chainlit`: `load_module`, then `asyncio.run(start())`)
    this restores asyncio's own functions and sets uvloop's policy, so Chainlit's
    `asyncio.run` starts a uvloop loop. Measured in bench/README.md ("Sessions per worker").

    Does nothing outside `chainlit run` (nest_asyncio not applied) or inside a running loop.
    Without uvloop (it captures `asyncio.Task` when imported, so it must not have been
    imported before this), the standard loop still gets the C tasks.
    """
    if not getattr(asyncio, "_nest_patched", False):
        return "unchanged"
    with contextlib.suppress(RuntimeError):
        asyncio.get_running_loop()
        return "unchanged"  # too late: the loop is already running
    asyncio.Task = asyncio.tasks.Task = asyncio.tasks._CTask = _asyncio.Task  # type: ignore[misc,attr-defined]
    asyncio.Future = asyncio.futures.Future = asyncio.futures._CFuture = _asyncio.Future  # type: ignore[misc,attr-defined]
    asyncio.events.get_event_loop = asyncio.get_event_loop = _asyncio.get_event_loop
    asyncio.events._get_event_loop = _asyncio._get_event_loop  # type: ignore[attr-defined]
    asyncio.run = asyncio.runners.run
    del asyncio._nest_patched  # type: ignore[attr-defined]
    if "uvloop" in sys.modules:
        log.warning("uvloop was imported under nest_asyncio; serving on the standard loop")
        return "asyncio"
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    logging.getLogger("cairn.runtime").info("serving on uvloop %s", uvloop.__version__)
    return "uvloop"


# --- settings: Cairn's Settings, where Chainlit reads them ---


def serving_port() -> int:
    """The port `chainlit run` serves on (its --port option lands in Chainlit's config)."""
    return int(chainlit_config.run.port)


def configure_chainlit(settings: Settings, *, public_url: str, auth_secret: str) -> None:
    """Cairn's Settings are the one source; Chainlit's config.toml cannot loosen them.

    Chainlit reads the session-signing secret (auth/jwt.py `get_jwt_secret`) and the public
    address of OAuth redirects (server.py `get_user_facing_url`) from the environment at each
    use, and the rest from `chainlit.config.config`, whose lists its middleware already holds.
    """
    os.environ["CHAINLIT_AUTH_SECRET"] = auth_secret
    os.environ["CHAINLIT_URL"] = public_url
    project = chainlit_config.project
    # Mutated in place: Chainlit's CORS middleware holds this very list.
    project.allow_origins[:] = settings.origins(serving_port())
    project.user_session_timeout = settings.session_hours * 3600
    upload = chainlit_config.features.spontaneous_file_upload
    if upload is not None:
        upload.accept = list(settings.upload_mime_types)
        upload.max_size_mb = settings.max_upload_mb
        upload.max_files = settings.max_upload_files


def mount_before_catch_all(app: FastAPI, router: APIRouter) -> None:
    """Chainlit ends its routes with a catch-all GET (server.py `serve`, the UI's HTML);
    routes added later must go in front of it or they are never reached."""
    before = len(app.router.routes)
    app.include_router(router)
    added = app.router.routes[before:]
    del app.router.routes[before:]
    app.router.routes[0:0] = added


STARTUP_FAILED = 3
"""The exit status of a worker whose start-up failed (a supervisor restarts it)."""


def exit_if_startup_fails(
    start: Callable[[], Awaitable[None]], *, exit_process: Callable[[int], object] = os._exit
) -> Callable[[], Awaitable[None]]:
    """The start-up hook, ending the process when it fails instead of serving half-started.

    Chainlit runs `on_app_startup` through utils.py `wrap_user_function`, which logs an
    exception and returns: uvicorn then serves a worker with no database (a worker that lost
    a start-up race answered every sign-in with a 500). Exiting closes the port, so the load
    balancer's passive check skips the worker and a supervisor can start it again. os._exit,
    as Chainlit's own lifespan ends: its AnyIO threads would keep a normal exit waiting.
    """

    @functools.wraps(start)
    async def startup() -> None:
        try:
            await start()
        except Exception:
            logging.getLogger("cairn").critical(
                "Cairn could not start and exits (status %d)", STARTUP_FAILED, exc_info=True
            )
            for handler in logging.getLogger().handlers:
                handler.flush()
            exit_process(STARTUP_FAILED)

    return startup


# --- clock: Chainlit's sleep in every Step and Message, only when needed ---


class SpacedClock:
    """Stands in for the `time` module inside chainlit.step and chainlit.message.

    Chainlit sleeps 1 ms in every `Step()` and `Message()` (step.py `Step.__init__`,
    message.py `Message.__init__`) so that consecutive ones get distinct millisecond
    timestamps (conversations are ordered by them when reopened). That is a blocking sleep on
    the event loop: every step of every user stalls all sessions for a millisecond. This keeps
    the guarantee (at least `seconds` between two constructions) and only waits when the
    previous construction was less than that long ago, which a turn's steps, tens of
    milliseconds apart, never are.
    """

    def __init__(
        self,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wait: Callable[[float], None] = time.sleep,
    ) -> None:
        self._monotonic = monotonic
        self._wait = wait
        self._last = float("-inf")
        self._lock = threading.Lock()

    def sleep(self, seconds: float) -> None:
        with self._lock:
            now = self._monotonic()
            remaining = self._last + seconds - now
            if remaining > 0:
                self._wait(remaining)
                now += remaining
            self._last = now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def space_out_steps() -> None:
    """One SpacedClock for both modules, so a Step and a Message are spaced too."""
    clock = SpacedClock()
    for name in ("chainlit.step", "chainlit.message"):
        # importlib: `chainlit.step` as an attribute is the @step decorator, not the module.
        module = importlib.import_module(name)
        assert module.time is time or isinstance(module.time, SpacedClock), name
        module.time = clock  # type: ignore[attr-defined]


# --- thread ACL: unknown and foreign threads look alike ---


async def require_thread_author(username: str, thread_id: str) -> bool:
    """Replaces chainlit.data.acl.is_thread_author on every Chainlit thread route.

    Chainlit answers 404 for an unknown thread and 401 for someone else's, which tells an
    attacker which ids exist; here both are the same 404, and the foreign one is logged.
    """
    data_layer = get_data_layer()
    author = await data_layer.get_thread_author(thread_id) if data_layer else ""
    if not author or author != username:
        if author:
            log.warning("refused: %s asked for thread %s of another user", username, thread_id)
        raise HTTPException(status_code=404, detail=NOT_FOUND)
    return True


# --- output: model text reaches the browser only sanitised (policy in ui/output_guard.py) ---

CHAINLIT_TASK_CONTENT = chainlit.element.TaskList.preprocess_content
"""Chainlit's own, which the sanitised one runs after cleaning the titles."""


def guard_output() -> None:
    """Chainlit's emitter and task list, replaced by sanitising ones.

    Chainlit builds `chainlit.emitter.ChainlitEmitter(session)` for every event, looking the
    name up in that module each time (context.py `ChainlitContext.__init__`); a task list's
    titles leave in `TaskList.preprocess_content`. Raw HTML in Markdown stays off for good,
    whatever config.toml says.
    """
    chainlit_config.features.unsafe_allow_html = False
    chainlit.emitter.ChainlitEmitter = SanitisingEmitter  # type: ignore[misc]
    chainlit.element.TaskList.preprocess_content = _sanitised_task_content  # type: ignore[method-assign]


async def _sanitised_task_content(self: chainlit.element.TaskList) -> None:
    for task in self.tasks:
        task.title = sanitise_text(task.title)
    await CHAINLIT_TASK_CONTENT(self)


class SanitisingEmitter(ChainlitEmitter):
    """Chainlit's emitter with model text sanitised on the way out, streamed tokens included."""

    @property
    def _streams(self) -> dict[str, StreamSanitiser]:
        # Chainlit makes an emitter per event; a stream belongs to the session.
        streams = getattr(self.session, "cairn_streams", None)
        if streams is None:
            streams = {}
            self.session.cairn_streams = streams  # type: ignore[attr-defined]
        return streams

    def send_step(self, step_dict):  # type: ignore[no-untyped-def]
        self._streams.pop(str(step_dict.get("id")), None)
        return super().send_step(sanitise_step(step_dict))

    def update_step(self, step_dict):  # type: ignore[no-untyped-def]
        self._streams.pop(str(step_dict.get("id")), None)
        return super().update_step(sanitise_step(step_dict))

    def stream_start(self, step_dict):  # type: ignore[no-untyped-def]
        stream = StreamSanitiser(policy_for(step_dict))
        self._streams[str(step_dict.get("id"))] = stream
        stream.feed(str(step_dict.get("output") or ""))
        return super().stream_start({**step_dict, "output": stream.shown})

    async def send_token(self, id: str, token: str, is_sequence=False, is_input=False):  # type: ignore[no-untyped-def]
        stream = self._streams.get(id)
        if stream is None:
            # A stream this emitter never saw start: nothing of it is shown until its final send.
            return None
        out = stream.feed(token, replace=is_sequence)
        if out is None:
            return None
        text, replace = out
        return await super().send_token(id, text, is_sequence=replace, is_input=is_input)

    def send_ask_user(self, step_dict, spec, raise_on_timeout=False):  # type: ignore[no-untyped-def]
        return super().send_ask_user(sanitise_step(step_dict), spec, raise_on_timeout)


# --- edits: an edited message forks the thread ---

EditHandler = Callable[[Any, str, list[Any]], Awaitable[None]]
"""Cairn's edit handler: (the edited message, its new text, the messages after it)."""
_edit_handler: EditHandler | None = None


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


# --- helpers for code that must reach Chainlit's internals ---


@asynccontextmanager
async def task_signals() -> AsyncIterator[None]:
    """Show the run as busy, and idle again afterwards.

    Chainlit sends `task_start`/`task_end` around `on_message` only (socket.py
    `process_message`); action callbacks run without them, and an AskUserMessage ends the task
    early (emitter.py `send_ask_user`): without this the input and the next buttons stay
    disabled.
    """
    await chainlit_context.emitter.task_start()
    try:
        yield
    finally:
        await chainlit_context.emitter.task_end()


async def stoppable(work: Awaitable[T]) -> T | None:
    """Run `work` as the live session's current task: the one Chainlit's Stop cancels
    (socket.py `stop`). None if Stop cancelled it.

    A button's callback runs inside Chainlit's HTTP request (server.py `call_action`), a task
    Stop knows nothing of: Stop pressed under an approved plan or a retried turn posted its
    notice and the run went on. Run apart from the request, a Stop ends only the run; the
    request itself cancelled (its client gone) cancels the run too, as before.
    """
    task = asyncio.ensure_future(work)
    session = chainlit_context.session
    if isinstance(session, WebsocketSession):
        session.current_task = task
    try:
        return await task
    except asyncio.CancelledError:
        request = asyncio.current_task()
        if request is not None and request.cancelling():
            raise
        return None


async def disconnect_user_sockets(user_id: str) -> int:
    """End this worker's live chat connections of the user; returns how many.

    Chainlit keeps its sessions in session.py `ws_sessions_id` only (no public look-up by
    user); other workers refuse the ended session at its next event.
    """
    sessions = [s for s in list(ws_sessions_id.values()) if isinstance(s, WebsocketSession)]
    ended = 0
    for session in sessions:
        if getattr(session.user, "identifier", None) == user_id:
            await chainlit.server.sio.disconnect(session.socket_id)
            ended += 1
    return ended


async def disconnect_session_sockets(key: bytes) -> int:
    """End this worker's live chat connections of one signed-out session (by
    auth.sessions.session_key of its token); returns how many. As disconnect_user_sockets."""
    sessions = [s for s in list(ws_sessions_id.values()) if isinstance(s, WebsocketSession)]
    ended = 0
    for session in sessions:
        if session.token and session_key(session.token) == key:
            await chainlit.server.sio.disconnect(session.socket_id)
            ended += 1
    return ended


def enter_live_session(*, thread_id: str, user_id: str) -> bool:
    """Make the user's open chat of that conversation on this worker, if any, the current
    Chainlit context (so a resumed run streams into it); returns whether there was one.

    Chainlit looks sessions up by socket id only (session.py `ws_sessions_id`) and sets the
    context from a socket event (context.py `init_ws_context`); a run resumed by the server
    has no event.
    """
    session = next(
        (
            s
            for s in list(ws_sessions_id.values())
            if isinstance(s, WebsocketSession)
            and s.thread_id == thread_id
            and getattr(s.user, "identifier", None) == user_id
        ),
        None,
    )
    if session is None:
        return False
    init_ws_context(session)
    return True


_ASSISTANT_STEP = (
    'INSERT INTO "Step" (id, "threadId", name, type, output, metadata, "startTime", '
    '"endTime", "showInput", "isError") '
    "SELECT %s, id, 'Cairn', 'assistant_message', %s, '{}', now(), now(), 'json', false "
    'FROM "Thread" WHERE id = %s'
)
"""A reply step as ChainlitDataLayer.create_step stores one, for an existing thread only."""


async def write_assistant_message(pool: Pool, thread_id: str, text: str) -> None:
    """An assistant message in a conversation, written outside any chat session.

    Chainlit's data layer records steps only inside a live chat session (data/utils.py
    `queue_until_user_message`), so a reply produced elsewhere (the memory page answering a
    paused confirmation) goes into its Step table directly and shows when the conversation
    is reopened.
    """
    if not text:
        return
    async with fenced(pool) as conn:  # refused once the user's data was wiped
        await conn.execute(_ASSISTANT_STEP, (str(uuid.uuid4()), text, thread_id))
