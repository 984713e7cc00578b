"""OAuth login: maps a provider's verified user to Cairn's stable user id, and the bundled local provider."""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from typing import TYPE_CHECKING, Any

from chainlit import oauth_providers
from chainlit.oauth_providers import GenericOAuthProvider
from chainlit.user import User

if TYPE_CHECKING:
    from graphs.core.settings import Settings

log = logging.getLogger(__name__)

LOCAL_PROVIDER_ID = "cairn"
LOCAL_CLIENT_ID = "cairn-web"

# Where each provider puts its stable subject; never an email, which users can change.
_SUBJECT_FIELDS = ("sub", "id", "oid", "user_id")


async def oauth_callback(
    provider_id: str,
    token: str,
    raw_user_data: dict[str, Any],
    default_user: User,
    id_token: str | None = None,
) -> User | None:
    """Chainlit's hook after a provider verified the login: build the session user."""
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
    return User(
        identifier=f"{provider_id}:{subject}",
        display_name=display[:100],
        metadata={
            "provider": provider_id,
            "email": raw_user_data.get("email"),
            # Chainlit's session token is these claims plus whole-second times: without this,
            # two sign-ins in one second would be one token, and signing out one would sign
            # out both (auth.sessions records a sign-out by token).
            "session": secrets.token_urlsafe(16),
        },
    )


class LocalOIDCProvider(GenericOAuthProvider):
    """Chainlit's generic OAuth client pointed at the app's bundled OpenID Connect provider."""

    id = LOCAL_PROVIDER_ID
    env = []  # noqa: RUF012 (the base class declares it as a plain attribute)

    def __init__(self, *, public_issuer: str, internal_issuer: str, client_secret: str) -> None:
        self.client_id = LOCAL_CLIENT_ID
        self.client_secret = client_secret
        self.authorize_url = f"{public_issuer}/authorize"
        # The token and userinfo calls come from this server, so they use its own address.
        self.token_url = f"{internal_issuer}/token"
        self.user_info_url = f"{internal_issuer}/userinfo"
        self.scopes = "openid profile email"
        self.user_identifier = "sub"
        self.authorize_params = {"scope": self.scopes, "response_type": "code"}

    def is_configured(self) -> bool:
        return True


def real_providers_configured() -> bool:
    return any(p.is_configured() for p in oauth_providers.providers if p.id != LOCAL_PROVIDER_ID)


def local_client_secret(auth_secret: str) -> str:
    """Stable across restarts and workers, without another secret to keep."""
    return hmac.new(auth_secret.encode(), b"cairn-local-oidc-client", hashlib.sha256).hexdigest()


def register_local_provider(
    settings: Settings, *, public_url: str, internal_url: str, auth_secret: str
) -> LocalOIDCProvider | None:
    """Enable the bundled provider unless a real one is configured; never in production."""
    if real_providers_configured():
        return None
    if settings.production:
        msg = "Production mode needs a real OAuth provider (OAUTH_* settings); the bundled login is for local use"
        raise ValueError(msg)
    provider = LocalOIDCProvider(
        public_issuer=f"{public_url}/local-oidc",
        internal_issuer=f"{internal_url}/local-oidc",
        client_secret=local_client_secret(auth_secret),
    )
    oauth_providers.providers[:] = [
        p for p in oauth_providers.providers if p.id != LOCAL_PROVIDER_ID
    ] + [provider]
    return provider
