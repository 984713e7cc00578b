"""Sockets: every Chainlit socket handler checks its frame first, and a thread id the client
names is resumed only when the signed-in user wrote it.

Chainlit trusts the client with session ids, thread ids, socket event shapes and ask answers;
a malformed frame reached its handlers, which answered with the raw exception text.
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal

from chainlit.auth import get_current_user, get_token_from_cookies
from chainlit.chat_context import chat_contexts
from chainlit.config import config as chainlit_config
from chainlit.data import get_data_layer
from chainlit.session import WebsocketSession
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError
from socketio.exceptions import ConnectionRefusedError as SocketRefused
from starlette.requests import cookie_parser

from graphs.core.errors import is_database_outage
from ui.input import InputRejected, check_text

if TYPE_CHECKING:
    from collections.abc import Sequence

log = logging.getLogger("cairn.security")

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

SOCKET_PINS = {
    "chainlit.socket.connect": "00ce35b669efa6f8",
    "chainlit.socket.process_message": "7002f6fd6cadca2f",
    "chainlit.emitter.ChainlitEmitter.process_message": "ffb867621e1b52c8",
    "chainlit.emitter.ChainlitEmitter.send_ask_user": "405cea5c280aed1d",
}
"""The Chainlit code this module relies on (qualified name: digest of its source as checked),
tripped by tests/unit/test_chainlit_patches.py when an upgrade changes it."""


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


def guard_socket_events(sio: Any, *, max_message_chars: int | None = None) -> None:
    """Wrap each of Chainlit's socket handlers once: checked arguments, fixed error texts.

    Before: a malformed frame reached Chainlit's handlers, which answered with the raw
    exception text (`'id'`, `string indices must be integers`) or a dead socket.
    """
    handlers: dict[str, Handler] = sio.handlers["/"]
    missing = SOCKET_EVENTS - handlers.keys()
    if missing:
        msg = (
            f"Chainlit no longer registers {sorted(missing)}: review ui/chainlit/patches/sockets.py"
        )
        raise RuntimeError(msg)

    async def tell(sid: str, text: str) -> None:
        await sio.emit("toast", {"message": text, "type": "error"}, to=sid)

    checks = dict(_CHECKS)
    if max_message_chars is not None:
        checks["client_message"] = _with_text_check(_client_message, max_message_chars)
        checks["edit_message"] = _with_text_check(_edit_message, max_message_chars)
    for name, handler in list(handlers.items()):
        if getattr(handler, "cairn_guarded", False):
            continue
        if name == "connect":
            handlers[name] = _guard_connect(handler)
        else:
            handlers[name] = _guard_event(name, handler, checks.get(name, _none), tell)


def _with_text_check(
    check: Callable[[str, tuple[Any, ...]], tuple[Any, ...]], max_chars: int
) -> Callable[[str, tuple[Any, ...]], tuple[Any, ...]]:
    """An empty or oversize message is refused here, before Chainlit stores it.

    Chainlit writes a client's message as a step before `on_message` runs; refused there, it
    was removed again, but the removal raced the write and about one try in three left the
    text stored and served back with the conversation.
    """

    def checked(sid: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
        (payload,) = check(sid, args)
        attached = bool(payload.get("fileReferences"))
        check_text(str(payload["message"]["output"]), max_chars=max_chars, attached=attached)
        return (payload,)

    return checked


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
        except InputRejected as exc:
            log.info("refused %s from socket %s: %s", name, sid, exc)
            await tell(sid, str(exc))
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


# --- Origins: socket.io checks them (Chainlit turns the check off) ---


def check_socket_origins(sio: Any, origins: Sequence[str]) -> None:
    """socket.io refuses a handshake from a page of any other origin.

    Chainlit builds its server with `cors_allowed_origins=[]` (server.py `sio`), which turns
    engine.io's Origin check off: a page on another site (or another port of the same host,
    which the browser sends the session cookie from) could open the chat socket as the user.
    A handshake with no Origin at all is refused in front of Chainlit (ui/origin_guard.py).
    """
    sio.eio.cors_allowed_origins = list(origins)
