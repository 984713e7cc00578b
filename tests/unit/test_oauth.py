"""OAuth: the provider's stable subject is the identity, and the bundled provider is for local use only."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from chainlit import oauth_providers
from chainlit.user import User

from auth.oauth import LOCAL_PROVIDER_ID, local_client_secret
from graphs.core.settings import Settings
from ui.chainlit.oauth import LocalOIDCProvider, oauth_callback, register_local_provider

PUBLIC = "https://cairn.example.com"
INTERNAL = "http://127.0.0.1:8000"
AUTH_SECRET = "a" * 48


@pytest.fixture(autouse=True)
def isolated_providers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No real provider configured from the shell; Chainlit's provider list restored afterwards."""
    for provider in oauth_providers.providers:
        for name in provider.env:
            monkeypatch.delenv(name, raising=False)
    for name in list(os.environ):
        if name.startswith("CAIRN_"):
            monkeypatch.delenv(name)
    saved = list(oauth_providers.providers)
    yield
    oauth_providers.providers[:] = saved


def local_settings() -> Settings:
    return Settings(_env_file=None)  # type: ignore[call-arg]


def register(**overrides: Any) -> LocalOIDCProvider | None:
    kwargs: dict[str, Any] = {
        "public_url": PUBLIC,
        "internal_url": INTERNAL,
        "auth_secret": AUTH_SECRET,
    }
    return register_local_provider(
        overrides.pop("settings", local_settings()), **{**kwargs, **overrides}
    )


def local_providers() -> list[Any]:
    return [p for p in oauth_providers.providers if p.id == LOCAL_PROVIDER_ID]


async def test_identity_is_provider_and_subject() -> None:
    user = await oauth_callback(
        "cairn",
        "token",
        {"sub": "3f2a", "name": "Alice", "email": "alice@example.com"},
        User(identifier="alice@example.com"),
    )

    assert user is not None
    assert user.identifier == "cairn:3f2a"
    assert user.display_name == "Alice"


async def test_github_numeric_id_is_the_subject() -> None:
    user = await oauth_callback(
        "github",
        "token",
        {"id": 583231, "login": "octocat", "email": "octocat@github.com"},
        User(identifier="octocat"),
    )

    assert user is not None
    assert user.identifier == "github:583231"
    assert user.display_name == "octocat"


async def test_sub_is_preferred_over_id() -> None:
    user = await oauth_callback(
        "keycloak", "token", {"id": "row-7", "sub": "subject-1"}, User(identifier="x")
    )

    assert user is not None
    assert user.identifier == "keycloak:subject-1"


async def test_no_subject_means_no_login_even_with_an_email() -> None:
    user = await oauth_callback(
        "google",
        "token",
        {"email": "alice@example.com", "name": "Alice", "email_verified": True},
        User(identifier="alice@example.com"),
    )

    assert user is None


async def test_email_is_never_the_identity() -> None:
    # Same person, new email address: still the same Cairn user.
    before = await oauth_callback(
        "google", "t", {"sub": "1177", "email": "old@example.com"}, User(identifier="old")
    )
    after = await oauth_callback(
        "google", "t", {"sub": "1177", "email": "new@example.com"}, User(identifier="new")
    )

    assert before is not None
    assert after is not None
    assert before.identifier == after.identifier == "google:1177"
    assert "example.com" not in before.identifier


async def test_same_subject_at_different_providers_are_different_users() -> None:
    github = await oauth_callback("github", "t", {"id": 42}, User(identifier="a"))
    gitlab = await oauth_callback("gitlab", "t", {"id": 42}, User(identifier="b"))

    assert github is not None
    assert gitlab is not None
    assert github.identifier != gitlab.identifier


def test_local_provider_is_registered_when_no_real_one_is_configured() -> None:
    provider = register()

    assert provider is not None
    assert local_providers() == [provider]
    assert LOCAL_PROVIDER_ID in oauth_providers.get_configured_oauth_providers()


def test_browser_goes_to_the_public_url_and_the_server_calls_itself_internally() -> None:
    provider = register()

    assert provider is not None
    assert provider.authorize_url == f"{PUBLIC}/local-oidc/authorize"
    assert provider.token_url == f"{INTERNAL}/local-oidc/token"
    assert provider.user_info_url == f"{INTERNAL}/local-oidc/userinfo"
    assert provider.client_secret == local_client_secret(AUTH_SECRET)


def test_a_configured_real_provider_disables_the_local_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OAUTH_GITHUB_CLIENT_ID", "gh-client")
    monkeypatch.setenv("OAUTH_GITHUB_CLIENT_SECRET", "gh-secret")

    assert register() is None
    assert local_providers() == []


def test_production_refuses_the_local_provider() -> None:
    production = Settings(  # type: ignore[call-arg]
        _env_file=None,
        production=True,
        auth_secret="p" * 40,
        database_url="postgresql://cairn@db.internal/cairn",
        public_url=PUBLIC,
    )

    with pytest.raises(ValueError, match="OAUTH"):
        register(settings=production)
    assert local_providers() == []


def test_production_with_a_real_provider_starts_without_the_local_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OAUTH_GITHUB_CLIENT_ID", "gh-client")
    monkeypatch.setenv("OAUTH_GITHUB_CLIENT_SECRET", "gh-secret")
    production = Settings(  # type: ignore[call-arg]
        _env_file=None,
        production=True,
        auth_secret="p" * 40,
        database_url="postgresql://cairn@db.internal/cairn",
        public_url=PUBLIC,
    )

    assert register(settings=production) is None


def test_registering_twice_leaves_one_provider() -> None:
    first = register()
    second = register(auth_secret="b" * 48)

    assert first is not None
    assert second is not None
    assert local_providers() == [second]
    assert second.client_secret == local_client_secret("b" * 48)


def test_local_client_secret_is_stable_and_tied_to_the_auth_secret() -> None:
    assert local_client_secret(AUTH_SECRET) == local_client_secret(AUTH_SECRET)
    assert local_client_secret(AUTH_SECRET) != local_client_secret("b" * 48)
    assert AUTH_SECRET not in local_client_secret(AUTH_SECRET)


async def test_two_sign_ins_in_one_second_are_two_sessions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Chainlit's session token is the user's claims and whole-second times: without a session
    id of their own, signing out one of them would sign out the other (auth.sessions)."""
    from chainlit.auth.jwt import create_jwt

    first, second = [
        await oauth_callback("cairn", "token", {"sub": "3f2a"}, User(identifier="x"))
        for _ in range(2)
    ]
    assert first is not None
    assert second is not None
    assert first.identifier == second.identifier
    monkeypatch.setenv("CHAINLIT_AUTH_SECRET", "a-test-secret-of-more-than-32-characters")
    assert create_jwt(first) != create_jwt(second)
