"""Chainlit's OAuth hooks: the verified login becomes Chainlit's session user, and the bundled
OpenID Connect provider (auth/local_oidc.py) is offered when no real provider is configured."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from chainlit import oauth_providers
from chainlit.oauth_providers import GenericOAuthProvider
from chainlit.user import User

from auth.oauth import (
    LOCAL_CLIENT_ID,
    LOCAL_IN_PRODUCTION,
    LOCAL_PROVIDER_ID,
    audit_sign_in,
    local_client_secret,
    verified_user,
)
from auth.workspaces import claimed_groups

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from graphs.core.settings import Settings
    from ui.runtime import AppRuntime

    OAuthHook = Callable[[str, str, dict[str, Any], User, str | None], Awaitable[User | None]]

log = logging.getLogger("cairn.security")


async def oauth_callback(
    provider_id: str,
    token: str,
    raw_user_data: dict[str, Any],
    default_user: User,
    id_token: str | None = None,
) -> User | None:
    """Chainlit's hook after a provider verified the login: build the session user."""
    user = verified_user(provider_id, raw_user_data)
    if user is None:
        return None
    return User(identifier=user.identifier, display_name=user.display_name, metadata=user.metadata)


def audited_oauth_callback(runtime: Callable[[], AppRuntime]) -> OAuthHook:
    """oauth_callback, then the team memberships the login's groups claim maps to
    (CAIRN_OIDC_GROUPS), then the sign-in written to the audit log of the user's active
    workspace (auth.oauth.audit_sign_in: a failure there never blocks the sign-in). When the
    memberships cannot be brought up to date the sign-in fails: a group the user has left must
    not keep its access."""

    async def signed_in(
        provider_id: str,
        token: str,
        raw_user_data: dict[str, Any],
        default_user: User,
        id_token: str | None = None,
    ) -> User | None:
        user = await oauth_callback(provider_id, token, raw_user_data, default_user, id_token)
        if user is None:
            return None
        try:
            started = runtime()
        except Exception:  # still starting: the sign-in goes ahead unaudited
            log.warning("sign-in of %s before the worker started: groups not read", user.identifier)
            await audit_sign_in(None, user.identifier, provider_id)
            return user
        workspaces = started.workspaces
        if workspaces is not None and workspaces.group_rules:
            claim = raw_user_data.get(started.settings.oidc_groups_claim)
            await workspaces.sync_groups(
                user.identifier, claimed_groups(claim), display_name=user.display_name
            )
        await audit_sign_in(workspaces, user.identifier, provider_id)
        return user

    return signed_in


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


def register_local_provider(
    settings: Settings, *, public_url: str, internal_url: str, auth_secret: str
) -> LocalOIDCProvider | None:
    """Enable the bundled provider unless a real one is configured; never in production."""
    if real_providers_configured():
        return None
    if settings.production:
        raise ValueError(LOCAL_IN_PRODUCTION)
    provider = LocalOIDCProvider(
        public_issuer=f"{public_url}/local-oidc",
        internal_issuer=f"{internal_url}/local-oidc",
        client_secret=local_client_secret(auth_secret),
    )
    oauth_providers.providers[:] = [
        p for p in oauth_providers.providers if p.id != LOCAL_PROVIDER_ID
    ] + [provider]
    return provider
