"""The signed-in user of a Chainlit socket event, and Chainlit's session cookie, for auth/."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from chainlit.auth.cookie import clear_auth_cookie, get_token_from_cookies
from chainlit.context import context

from auth.identity import NotAuthenticated

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response


def session_user_id() -> str:
    """user_id of the current Chainlit websocket/HTTP context: its verified user's identifier
    (set from the login's verified claims, auth/oauth.py)."""
    identifier = getattr(context.session.user, "identifier", None)
    if not identifier:
        msg = "no authenticated user in this session"
        raise NotAuthenticated(msg)
    return str(identifier)


def session_token(cookies: Mapping[str, str]) -> str | None:
    """The session token in a request's cookies (Chainlit splits a long one over several)."""
    return get_token_from_cookies(dict(cookies))


def clear_session_cookie(request: Request, response: Response) -> None:
    clear_auth_cookie(request, response)
