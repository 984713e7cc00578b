"""The only source of user_id: the verified login held by the server-side session."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Annotated, Any

from chainlit.auth import get_current_user
from fastapi import Depends, HTTPException

if TYPE_CHECKING:
    from chainlit.user import User

log = logging.getLogger("cairn.security")

# Fields a client might send to try to choose an identity; never trusted, always logged.
SUSPICIOUS_FIELDS = ("user_id", "userId", "user", "owner", "owner_id", "namespace")


class NotAuthenticated(PermissionError):
    """No verified login is attached to this request or socket session."""


def user_id_of(user: User | None) -> str:
    """The stable user id of a verified Chainlit user (its identifier, set by our OAuth callback)."""
    identifier = getattr(user, "identifier", None)
    if not identifier:
        msg = "no authenticated user in this session"
        raise NotAuthenticated(msg)
    return str(identifier)


def session_user_id() -> str:
    """user_id for the current Chainlit websocket/HTTP context."""
    from chainlit.context import context

    return user_id_of(context.session.user)


def flag_client_identity(payload: Any, *, where: str, user_id: str) -> None:
    """Log (and otherwise ignore) identity fields a client put into a payload."""
    if not isinstance(payload, dict):
        return
    sent = [key for key in SUSPICIOUS_FIELDS if key in payload]
    if sent:
        log.warning(
            "suspicious: client sent identity fields %s in %s; ignored (session user %s)",
            sent,
            where,
            user_id,
        )


async def _current_user_id(user: Annotated[Any, Depends(get_current_user)]) -> str:
    try:
        return user_id_of(user)
    except NotAuthenticated:
        raise HTTPException(status_code=401, detail="Not signed in") from None


CurrentUserId = Annotated[str, Depends(_current_user_id)]
"""For FastAPI routes: the signed-in user's id, from the verified session cookie."""
