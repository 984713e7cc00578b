"""Chainlit's HTTP routes behind a check of what the client sent: shape, session id, owner.

Chainlit 2.12.0 indexes client bodies without checking them (`Action(**payload.action)`,
`WebsocketSession.get_by_id(...)` then `.get_config()`), so malformed ones ended in HTTP 500;
its feedback routes write to any message by id. Each rule here answers a fixed 4xx instead,
logs it, and lets nothing through to Chainlit.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from chainlit.auth.cookie import get_token_from_cookies
from chainlit.auth.jwt import get_jwt_secret
from chainlit.config import config as chainlit_config
from chainlit.data import get_data_layer
from chainlit.session import WebsocketSession
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse

from auth.sessions import token_claims
from ui.chainlit.patches.sockets import has_nul, is_session_id
from ui.input import MAX_JSON_DEPTH, json_too_deep

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("cairn.security")

MAX_JSON_BYTES = 256 * 1024
MAX_TEXT_BODY_BYTES = 1024 * 1024
"""Any other route's JSON or form body (read to look for NUL characters)."""
MALFORMED = "The request was malformed."
NOT_FOUND = "Not found"
SESSION_NOT_FOUND = "Session not found"
MESSAGE_NOT_FOUND = "Message not found"

ROUTE_PINS = {
    "chainlit.server.call_action": "1db36f6a1d296df1",
    "chainlit.server.upload_file": "0e1d81cae2398ee8",
    "chainlit.server.get_file": "087b45142fefe873",
    "chainlit.server.update_feedback": "1ca022629ec82755",
    "chainlit.server.delete_feedback": "d918421add44e2f7",
    "chainlit.server.set_session_cookie": "0b26b9f18f536f6c",
    "chainlit.server.share_thread": "5c89b2441303a185",
    "chainlit.server.delete_thread_element": "e6acea6dfecfa4d8",
    "chainlit.server.update_thread_element": "9683b313b3741b17",
}
"""The Chainlit code this module relies on (qualified name: digest of its source as checked),
tripped by tests/unit/test_chainlit_patches.py when an upgrade changes it."""


class Refused(Exception):
    def __init__(self, status: int, detail: str, why: str) -> None:
        super().__init__(why)
        self.status = status
        self.detail = detail


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ActionBody(_Body):
    """chainlit.action.Action's fields: `Action(**action)` fails on any other key."""

    name: StrictStr = Field(min_length=1, max_length=200)
    payload: dict[str, Any]
    label: StrictStr = Field(default="", max_length=1000)
    tooltip: StrictStr = Field(default="", max_length=1000)
    icon: StrictStr | None = Field(default=None, max_length=200)
    forId: StrictStr | None = Field(default=None, max_length=100)
    id: StrictStr = Field(default="", max_length=100)


class CallAction(_Body):
    sessionId: StrictStr
    action: ActionBody


class FeedbackBody(_Body):
    forId: StrictStr = Field(max_length=100)
    value: Literal[0, 1]
    threadId: StrictStr | None = Field(default=None, max_length=100)
    id: StrictStr | None = Field(default=None, max_length=100)
    comment: StrictStr | None = Field(default=None, max_length=10_000)


class UpdateFeedback(_Body):
    sessionId: StrictStr = Field(max_length=100)
    feedback: FeedbackBody


class DeleteFeedback(_Body):
    feedbackId: StrictStr = Field(max_length=100)


class SessionCookie(_Body):
    session_id: StrictStr


class PaginationBody(_Body):
    first: StrictInt = Field(ge=1, le=100)
    cursor: StrictStr | None = Field(default=None, max_length=100)


class ThreadFilterBody(_Body):
    feedback: Literal[0, 1] | None = None
    userId: StrictStr | None = Field(default=None, max_length=100)
    """Ignored: Chainlit sets it from the session."""
    search: StrictStr | None = Field(default=None, max_length=500)


class ListThreads(_Body):
    pagination: PaginationBody
    filter: ThreadFilterBody


class ThreadRef(_Body):
    threadId: StrictStr = Field(max_length=100)


class RenameThread(ThreadRef):
    name: StrictStr = Field(min_length=1, max_length=500)


class ShareThread(ThreadRef):
    isShared: StrictBool


@dataclass(frozen=True)
class Rule:
    method: str
    path: re.Pattern[str]
    body: type[BaseModel] | None = None
    check: Any = None
    """An async (request, body) check run after the shape check; raises Refused."""
    closed: Any = None
    """A callable: when it returns True the route is answered 404 (a feature the app has off)."""
    session_query: bool = False


def _own_session(request: Request, session_id: object) -> WebsocketSession:
    """The signed-in user's own live chat session. Someone else's answers like a missing one:
    Chainlit told them apart (404 against 401), and ran a button press's first step, creating
    the session's conversation, before its owner check."""
    if not is_session_id(session_id):
        raise Refused(400, MALFORMED, "session id is not a canonical UUID")
    user = _signed_in(request)
    session = WebsocketSession.get_by_id(str(session_id))
    if session is None:
        raise Refused(404, SESSION_NOT_FOUND, "no such session")
    if getattr(session.user, "identifier", None) != user:
        raise Refused(404, SESSION_NOT_FOUND, f"{user} named a session of another user")
    return session


async def _live_session(request: Request, body: Any) -> None:
    """A button press: on the user's own session, in a conversation that has begun.

    Every button Cairn shows is under a message of a begun conversation. Chainlit starts one
    for a press in a fresh session (named after the action) before the handler refuses it,
    which left an empty conversation in the user's list for a forged press.
    """
    session = _own_session(request, body["sessionId"])
    if not session.has_first_interaction:
        raise Refused(404, NOT_FOUND, "a button press before the conversation began")


async def _session_in_query(request: Request) -> None:
    """Uploads and file reads name the session in the query: the user's own only."""
    _own_session(request, request.query_params.get("session_id"))


async def _session_cookie(request: Request, body: Any) -> None:
    if not is_session_id(body["session_id"]):
        raise Refused(400, MALFORMED, "session id is not a canonical UUID")


async def _own_message(request: Request, body: Any) -> None:
    """Feedback only on the user's own conversations; Chainlit writes it on any step id."""
    feedback = body["feedback"]
    user = _signed_in(request)
    data_layer = get_data_layer()
    step_author = getattr(data_layer, "step_author", None)
    if step_author is None or await step_author(feedback["forId"]) != user:
        raise Refused(404, MESSAGE_NOT_FOUND, "feedback on a message not of this user")
    if feedback.get("id") is not None:
        step = await data_layer.feedback_step(feedback["id"])  # type: ignore[union-attr]
        if step not in (None, feedback["forId"]):
            raise Refused(404, MESSAGE_NOT_FOUND, "feedback id of another message")


async def _own_feedback(request: Request, body: Any) -> None:
    user = _signed_in(request)
    data_layer = get_data_layer()
    feedback_step = getattr(data_layer, "feedback_step", None)
    step = await feedback_step(body["feedbackId"]) if feedback_step is not None else None
    if step is None or await data_layer.step_author(step) != user:  # type: ignore[union-attr]
        raise Refused(404, MESSAGE_NOT_FOUND, "deleting feedback not of this user")


def _signed_in(request: Request) -> str:
    if (user := _identifier(request)) is None:
        raise Refused(401, "Unauthorized", "not signed in")
    return user


def _identifier(request: Request) -> str | None:
    token = get_token_from_cookies(request.cookies)
    auth = request.headers.get("authorization", "")
    if not token and auth.lower().startswith("bearer "):
        token = auth[7:]
    claims = token_claims(token, get_jwt_secret() or "")
    identifier = claims.get("identifier") if claims else None
    return str(identifier) if identifier else None


def _sharing_off() -> bool:
    return not chainlit_config.features.allow_thread_sharing


def _always() -> bool:
    return True


def _path(pattern: str) -> re.Pattern[str]:
    return re.compile(f"^{pattern}$")


RULES = (
    Rule("POST", _path("/project/action"), CallAction, _live_session),
    Rule("PUT", _path("/feedback"), UpdateFeedback, _own_message),
    Rule("DELETE", _path("/feedback"), DeleteFeedback, _own_feedback),
    Rule("POST", _path("/set-session-cookie"), SessionCookie, _session_cookie),
    Rule("POST", _path("/project/threads"), ListThreads),
    Rule("PUT", _path("/project/thread"), RenameThread),
    Rule("DELETE", _path("/project/thread"), ThreadRef),
    Rule("PUT", _path("/project/thread/share"), ShareThread, closed=_sharing_off),
    Rule("GET", _path("/project/share/[^/]*"), closed=_sharing_off),
    # Custom elements, which the app does not use; Chainlit deletes one by id in any thread.
    Rule("PUT", _path("/project/element"), closed=_always),
    Rule("DELETE", _path("/project/element"), closed=_always),
    # Chainlit's MCP client routes are never reached: Cairn's MCP server (ui/mcp_server.py)
    # is mounted in front of them at the same path and checks its own bearer tokens.
    Rule("POST", _path("/mcp")),
    Rule("DELETE", _path("/mcp")),
    Rule("POST", _path("/project/file"), session_query=True),
    Rule("GET", _path("/project/file/[^/]*"), session_query=True),
)
"""Every Chainlit route that takes a body, a session id or an id it writes by."""


def _rule(scope: Scope) -> Rule | None:
    path = scope.get("path", "")
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    for rule in RULES:
        if rule.method == scope.get("method") and rule.path.match(path):
            return rule
    return None


class RequestGuard:
    """ASGI middleware: the rules above, before any of Chainlit's routes."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rule = _rule(scope)
        text = _text_body(scope)
        if rule is None and text is None and not _nul_in_url(scope):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        try:
            if _nul_in_url(scope):
                raise Refused(400, MALFORMED, "a NUL character in the address")
            if rule is not None:
                receive = await self._check(rule, request, receive)
            if text is not None and (rule is None or rule.body is None):
                receive = await _text_without_nul(text, receive)
        except Refused as exc:
            log.warning("refused %s %s (%s): %s", scope["method"], scope["path"], exc.status, exc)
            await JSONResponse({"detail": exc.detail}, status_code=exc.status)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _check(self, rule: Rule, request: Request, receive: Receive) -> Receive:
        if rule.closed is not None and rule.closed():
            raise Refused(404, NOT_FOUND, "feature turned off")
        if rule.session_query:
            await _session_in_query(request)
        if rule.body is None:
            return receive
        raw = await _read_body(receive)
        _not_too_deep(raw)
        try:
            body = json.loads(raw)
            rule.body.model_validate(body)
        except (ValueError, ValidationError) as exc:
            why = exc.errors(include_input=False) if isinstance(exc, ValidationError) else exc
            raise Refused(400, MALFORMED, str(why)) from None
        if has_nul(body):
            raise Refused(400, MALFORMED, "a NUL character in the body")
        if rule.check is not None:
            await rule.check(request, body)
        return _replay(raw, receive)


def _nul_in_url(scope: Scope) -> bool:
    """A NUL in the path (decoded by the server) or the query (as sent): an id or a search
    with one failed in Postgres (a 500) on whichever route took it."""
    query = scope.get("query_string", b"")
    return "\x00" in scope.get("path", "") or b"%00" in query or b"\x00" in query


def _text_body(scope: Scope) -> Literal["json", "form"] | None:
    """JSON and form bodies carry text the routes store; uploads (multipart) are the files'."""
    if scope.get("method") in ("GET", "HEAD", "OPTIONS"):
        return None
    content_type = Request(scope).headers.get("content-type", "").split(";")[0].strip().lower()
    if not content_type or content_type == "application/json" or content_type.endswith("+json"):
        return "json"  # FastAPI reads a body with no content type as JSON too
    if content_type == "application/x-www-form-urlencoded":
        return "form"
    return None


async def _text_without_nul(kind: Literal["json", "form"], receive: Receive) -> Receive:
    """Any route's JSON or form body, refused when a value holds a NUL (Postgres text and jsonb
    cannot: a memory edit, a token name, a sign-in failed with a 500). Unparsable JSON goes on
    for the route to answer as it does."""
    raw = await _read_body(receive, limit=MAX_TEXT_BODY_BYTES)
    if kind == "json":
        _not_too_deep(raw)
    if kind == "form":
        found = b"%00" in raw or b"\x00" in raw
    else:
        try:
            found = has_nul(json.loads(raw))
        except ValueError:
            found = False
    if found:
        raise Refused(400, MALFORMED, "a NUL character in the body")
    return _replay(raw, receive)


def _not_too_deep(raw: bytes) -> None:
    """Deeply nested JSON is refused before anything parses it (the parser, and every walk of
    the result, recurse per level: tens of thousands of levels ended in a 500)."""
    if json_too_deep(raw):
        raise Refused(400, MALFORMED, f"JSON nested deeper than {MAX_JSON_DEPTH} levels")


async def _read_body(receive: Receive, *, limit: int = MAX_JSON_BYTES) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise Refused(400, MALFORMED, "client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise Refused(413, "The request is too large.", f"body over {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(raw: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await receive()

    return replay
