"""Settings: unsafe production values are refused, lists parse from the environment, secrets persist."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from graphs.core.settings import CHAINLIT_CI_PLACEHOLDER_KEY, Settings

# A production configuration that passes; each test below spoils one value of it.
SAFE_PRODUCTION: dict[str, Any] = {
    "production": True,
    "auth_secret": "s" * 32,
    "database_url": "postgresql://cairn@db.internal/cairn",
    "public_url": "https://cairn.example.com",
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No setting leaks in from the shell or from other tests (runtime.prepare sets some)."""
    for name in list(os.environ):
        if name.startswith("CAIRN_"):
            monkeypatch.delenv(name)
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "CHAINLIT_AUTH_SECRET"):
        monkeypatch.delenv(name, raising=False)


def make(**values: Any) -> Settings:
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


def test_safe_production_settings_are_accepted() -> None:
    settings = make(**SAFE_PRODUCTION)

    assert settings.production


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ({"auth_secret": None}, "CAIRN_AUTH_SECRET"),
        ({"auth_secret": "s" * 31}, "CAIRN_AUTH_SECRET"),
        ({"allow_origins": ["https://cairn.example.com", "*"]}, "CAIRN_ALLOW_ORIGINS"),
        ({"database_url": None}, "CAIRN_DATABASE_URL"),
        ({"local_users": ["alice:wonderland"]}, "CAIRN_LOCAL_USERS"),
        ({"public_url": "http://cairn.example.com"}, "CAIRN_PUBLIC_URL"),
        ({"public_url": None}, "CAIRN_PUBLIC_URL"),
        ({"metrics_token": "guessable"}, "CAIRN_METRICS_TOKEN"),
    ],
    ids=[
        "missing-secret",
        "short-secret",
        "wildcard-origin",
        "no-database",
        "seeded-users",
        "http-public-url",
        "no-public-url",
        "short-metrics-token",
    ],
)
def test_production_refuses_each_unsafe_value_by_name(override: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError, match=named) as caught:
        make(**{**SAFE_PRODUCTION, **override})

    # Only the spoiled value is blamed, so the operator knows what to fix.
    others = {"CAIRN_AUTH_SECRET", "CAIRN_ALLOW_ORIGINS", "CAIRN_DATABASE_URL"} - {named}
    assert not any(other in str(caught.value) for other in others)


def test_production_names_every_problem_at_once() -> None:
    with pytest.raises(ValidationError) as caught:
        make(production=True, allow_origins=["*"], local_users=["bob:builder"])

    for named in (
        "CAIRN_AUTH_SECRET",
        "CAIRN_ALLOW_ORIGINS",
        "CAIRN_DATABASE_URL",
        "CAIRN_LOCAL_USERS",
        "CAIRN_PUBLIC_URL",
    ):
        assert named in str(caught.value)


def test_the_refusal_does_not_echo_secret_values() -> None:
    # The refusal ends up in start-up logs; a rejected secret is still someone's secret.
    with pytest.raises(ValidationError) as caught:
        make(
            production=True,
            public_url="https://cairn.example.com",
            database_url="postgresql://cairn:hunter2-db-password@db.internal/cairn",
            auth_secret="too-short-but-real",
        )

    assert "CAIRN_AUTH_SECRET" in str(caught.value)
    assert "too-short-but-real" not in str(caught.value)
    assert "hunter2-db-password" not in str(caught.value)


def test_wildcard_origin_from_the_environment_is_refused_in_production(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CAIRN_PRODUCTION", "true")
    monkeypatch.setenv("CAIRN_AUTH_SECRET", "e" * 40)
    monkeypatch.setenv("CAIRN_DATABASE_URL", "postgresql://cairn@db.internal/cairn")
    monkeypatch.setenv("CAIRN_PUBLIC_URL", "https://cairn.example.com")
    monkeypatch.setenv("CAIRN_ALLOW_ORIGINS", "https://cairn.example.com, *")

    with pytest.raises(ValidationError, match="CAIRN_ALLOW_ORIGINS"):
        make()


def test_local_mode_tolerates_what_production_refuses() -> None:
    settings = make(allow_origins=["*"], local_users=["alice:wonderland"])

    assert settings.allow_origins == ["*"]


def test_comma_separated_lists_are_split_and_trimmed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_ALLOW_ORIGINS", " https://a.example.com ,https://b.example.com,, ")
    monkeypatch.setenv("CAIRN_LOCAL_USERS", "alice:wonderland,bob:builder")
    monkeypatch.setenv("CAIRN_UPLOAD_MIME_TYPES", "text/plain, application/json")
    monkeypatch.setenv("CAIRN_SUPPORT_USERS", " cairn:1234 , github:99,")

    settings = make()

    assert settings.allow_origins == ["https://a.example.com", "https://b.example.com"]
    assert settings.local_users == ["alice:wonderland", "bob:builder"]
    assert settings.upload_mime_types == ["text/plain", "application/json"]
    assert settings.support_users == ["cairn:1234", "github:99"]


def test_unset_lists_have_safe_defaults() -> None:
    settings = make()

    assert settings.allow_origins == []
    assert settings.local_users == []
    assert settings.support_users == []  # nobody has the support role unless configured
    assert "text/plain" in settings.upload_mime_types


def test_auth_secret_is_generated_once_and_kept_private(tmp_path: Path) -> None:
    settings = make(data_dir=tmp_path / "data")

    secret = settings.ensure_auth_secret()

    path = tmp_path / "data" / "auth_secret"
    assert len(secret) >= 32
    assert path.read_text().strip() == secret
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert settings.ensure_auth_secret() == secret
    # A restart (a new Settings object) keeps the sessions signed with the same secret.
    assert make(data_dir=tmp_path / "data").ensure_auth_secret() == secret


def test_generated_secrets_differ_between_installations(tmp_path: Path) -> None:
    first = make(data_dir=tmp_path / "one").ensure_auth_secret()
    second = make(data_dir=tmp_path / "two").ensure_auth_secret()

    assert first != second


def test_configured_auth_secret_wins_and_writes_nothing(tmp_path: Path) -> None:
    settings = make(data_dir=tmp_path, auth_secret="configured-secret-" + "x" * 20)

    assert settings.ensure_auth_secret() == "configured-secret-" + "x" * 20
    assert not (tmp_path / "auth_secret").exists()


def test_chainlit_auth_secret_is_accepted_as_an_alias(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHAINLIT_AUTH_SECRET", "c" * 40)

    assert make().ensure_auth_secret() == "c" * 40


def test_base_url_defaults_to_localhost_on_the_listening_port() -> None:
    settings = make()

    assert settings.base_url(8123) == "http://localhost:8123"
    assert settings.origins(8123) == ["http://localhost:8123"]


def test_public_url_sets_base_url_and_origins_without_trailing_slash() -> None:
    settings = make(public_url="https://cairn.example.com/")

    assert settings.base_url(8000) == "https://cairn.example.com"
    assert settings.origins(8000) == ["https://cairn.example.com"]


def test_allowed_origins_replace_the_default() -> None:
    settings = make(
        public_url="https://cairn.example.com", allow_origins=["https://other.example.com"]
    )

    assert settings.origins(8000) == ["https://other.example.com"]


def test_no_model_key_means_offline() -> None:
    assert make().offline


def test_openai_api_key_alias_turns_the_real_model_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-123")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:11434/v1")

    settings = make()

    assert not settings.offline
    assert settings.openai_api_key is not None
    assert settings.openai_api_key.get_secret_value() == "sk-test-123"
    assert settings.openai_base_url == "http://127.0.0.1:11434/v1"


def test_cairn_prefixed_key_also_works(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_OPENAI_API_KEY", "sk-cairn")

    assert not make().offline


def test_an_empty_model_key_means_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    # `OPENAI_API_KEY=` (e.g. `${OPENAI_API_KEY:-}` in a compose file) is no key at all;
    # treating it as a key sends every turn to the API with an empty key, which fails.
    monkeypatch.setenv("OPENAI_API_KEY", "")

    assert make().offline


def test_chainlits_ci_placeholder_key_means_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", CHAINLIT_CI_PLACEHOLDER_KEY)

    assert make().offline


_RACE = """
import sys, time
from pathlib import Path
from graphs.core.settings import Settings
start = float(sys.argv[2])
while time.time() < start:
    pass
print(Settings(_env_file=None, data_dir=Path(sys.argv[1])).ensure_auth_secret())
"""


def test_workers_starting_at_once_share_one_complete_secret(tmp_path: Path) -> None:
    """Several first starts in one data folder: each reads the same whole secret, never ''."""
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env.pop("CHAINLIT_AUTH_SECRET", None)
    for attempt in range(3):
        data_dir = tmp_path / f"data-{attempt}"
        start = time.time() + 1.5  # every interpreter is up and spinning by then
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _RACE, str(data_dir), str(start)],
                cwd=root,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(6)
        ]
        outputs = [proc.communicate(timeout=60) for proc in procs]

        assert [proc.returncode for proc in procs] == [0] * 6, [err for _, err in outputs]
        secrets_read = {out.strip() for out, _ in outputs}
        assert len(secrets_read) == 1
        assert len(secrets_read.pop()) >= 32
        # Nothing half-made is left beside it.
        assert [p.name for p in data_dir.iterdir()] == ["auth_secret"]


def test_an_empty_secret_file_is_refused_not_used(tmp_path: Path) -> None:
    (tmp_path / "auth_secret").write_text("")

    with pytest.raises(RuntimeError, match="no usable secret"):
        make(data_dir=tmp_path).ensure_auth_secret()


def test_several_workers_require_a_configured_secret(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="CAIRN_WORKERS=2 requires CAIRN_AUTH_SECRET"):
        make(workers=2, data_dir=tmp_path)
    with pytest.raises(ValidationError, match="CAIRN_AUTH_SECRET"):
        make(workers=3, auth_secret="short")

    assert make(workers=2, auth_secret="w" * 32).workers == 2
    assert make(workers=1).auth_secret is None


def test_workers_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_WORKERS", "2")
    with pytest.raises(ValidationError, match="requires CAIRN_AUTH_SECRET"):
        make()

    monkeypatch.setenv("CAIRN_AUTH_SECRET", "e" * 40)
    assert make().workers == 2


def test_trusted_proxies_are_addresses_or_networks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_FORWARDED_ALLOW_IPS", "127.0.0.1, 10.0.0.0/8,::1")
    assert make().forwarded_allow_ips == ["127.0.0.1", "10.0.0.0/8", "::1"]
    assert make(forwarded_allow_ips=[]).forwarded_allow_ips == []
    for wrong in ("*", "nginx", "10.0.0.0/99"):
        with pytest.raises(ValidationError, match="CAIRN_FORWARDED_ALLOW_IPS"):
            make(forwarded_allow_ips=wrong)


def test_x_forwarded_for_is_trusted_from_nobody_by_default() -> None:
    assert make().forwarded_allow_ips == []
