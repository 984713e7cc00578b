"""OAuth login: a provider's verified user mapped to Cairn's stable user id, and the bundled
local provider's client credentials. The chat framework's login hooks call these
(ui/chainlit/oauth.py)."""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from auth.workspaces import Workspaces

log = logging.getLogger(__name__)

LOCAL_PROVIDER_ID = "cairn"
LOCAL_CLIENT_ID = "cairn-web"

# Where each provider puts its stable subject; never an email, which users can change.
_SUBJECT_FIELDS = ("sub", "id", "oid", "user_id")


@dataclass(frozen=True)
class VerifiedUser:
    """Who a provider's verified login says the user is."""

    identifier: str
    """`<provider>:<subject>`: the user_id everything in Cairn is keyed by."""
    display_name: str
    metadata: dict[str, Any] = field(default_factory=dict)


def verified_user(provider_id: str, raw_user_data: dict[str, Any]) -> VerifiedUser | None:
    """The session user for a login the provider verified; None when it named no subject."""
    subject = next((str(raw_user_data[f]) for f in _SUBJECT_FIELDS if raw_user_data.get(f)), None)
    if subject is None:
        log.warning("login refused: provider %s returned no subject", provider_id)
        return None
    display = next(
        (
            str(raw_user_data[f])
            for f in ("name", "preferred_username", "login", "email")
            if raw_user_data.get(f)
        ),
        subject,
    )
    return VerifiedUser(
        identifier=f"{provider_id}:{subject}",
        display_name=display[:100],
        metadata={
            "provider": provider_id,
            "email": raw_user_data.get("email"),
            # The session token is these claims plus whole-second times: without this, two
            # sign-ins in one second would be one token, and signing out one would sign out
            # both (auth.sessions records a sign-out by token).
            "session": secrets.token_urlsafe(16),
        },
    )


async def audit_sign_in(workspaces: Workspaces | None, user_id: str, provider_id: str) -> None:
    """A `sign_in` entry in the audit log of the workspace the user has active (their personal
    one, made now, for a first sign-in): the active workspace read, then one INSERT. Never in
    the way of the sign-in itself: a failure is logged, not raised."""
    if workspaces is None:
        log.warning("sign-in of %s not audited: workspaces not started", user_id)
        return
    try:
        active = await workspaces.active(user_id)
        await workspaces.record(
            active.workspace_id,
            user_id,
            "sign_in",
            subject_id=user_id,
            detail={"provider": provider_id},
        )
    except Exception:
        log.exception("sign-in of %s not audited", user_id)


def local_client_secret(auth_secret: str) -> str:
    """Stable across restarts and workers, without another secret to keep."""
    return hmac.new(auth_secret.encode(), b"cairn-local-oidc-client", hashlib.sha256).hexdigest()


LOCAL_IN_PRODUCTION = (
    "Production mode needs a real OAuth provider (OAUTH_* settings); the bundled login is for "
    "local use"
)
