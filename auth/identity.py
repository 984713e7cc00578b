"""The only source of user_id: the verified login held by the server-side session."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request

log = logging.getLogger("cairn.security")

# Fields a client might send to try to choose an identity; never trusted, always logged.
SUSPICIOUS_FIELDS = ("user_id", "userId", "user", "owner", "owner_id", "namespace")


class NotAuthenticated(PermissionError):
    """No verified login is attached to this request or socket session."""


def user_id_of(claims: dict[str, Any] | None) -> str:
    """The stable user id in a verified session's claims (its identifier, which the login
    callback set from the provider's verified subject: auth/oauth.py)."""
    identifier = claims.get("identifier") if claims else None
    if not identifier:
        msg = "no authenticated user in this session"
        raise NotAuthenticated(msg)
    return str(identifier)


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


async def _session_claims(request: Request) -> dict[str, Any]:
    """The verified claims of the request's session (auth.sessions.SessionTokens, which the
    app keeps on `app.state.session_tokens`); 401 when there is none or it does not verify."""
    tokens = getattr(request.app.state, "session_tokens", None)
    claims = tokens.claims(request.headers) if tokens is not None else None
    if not claims or not claims.get("identifier"):
        raise HTTPException(status_code=401, detail="Not signed in")
    return claims


SessionClaims = Annotated[dict[str, Any], Depends(_session_claims)]
"""For FastAPI routes: the verified claims of the signed-in session (identifier, display name)."""


async def _current_user_id(claims: SessionClaims) -> str:
    return user_id_of(claims)


CurrentUserId = Annotated[str, Depends(_current_user_id)]
"""For FastAPI routes: the signed-in user's id, from the verified session cookie."""
