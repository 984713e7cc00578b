"""Unit tests for the local OpenID Connect provider and local accounts, without Postgres."""

import base64
import json
import re
import stat
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from joserfc import jwt
from joserfc.jwk import RSAKey

from auth.local_accounts import (
    AccountError,
    AccountRecord,
    LocalAccounts,
    hash_password,
    verify_password,
)
from auth.local_oidc import CSRF_COOKIE, CodeGrant, build_local_oidc_router
from auth.throttle import Count, Limit

ISSUER = "http://testserver/local-oidc"
CLIENT_ID = "cairn-app"
CLIENT_SECRET = "s3cret-for-tests"
REDIRECT_URI = "http://testserver/auth/oauth/local/callback"
PASSWORD = "correct horse battery"


class FakeClock:
    """A clock the tests move by hand."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class InMemoryAccountStore:
    """`AccountStore` backed by dicts."""

    def __init__(self) -> None:
        self.records: dict[str, AccountRecord] = {}

    async def insert(self, record: AccountRecord) -> bool:
        if record.username in self.records:
            return False
        self.records[record.username] = record
        return True

    async def by_username(self, username: str) -> AccountRecord | None:
        return self.records.get(username)

    async def by_subject(self, subject: str) -> AccountRecord | None:
        return next((r for r in self.records.values() if r.subject == subject), None)


@dataclass
class InMemoryCodeStore:
    """`CodeStore` with the same single-use and expiry rules as the Postgres one."""

    clock: FakeClock
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)

    async def save(self, code_hash: str, grant: CodeGrant, ttl_seconds: int) -> None:
        expires_at = self.clock() + ttl_seconds
        self.rows[code_hash] = {"grant": grant, "expires_at": expires_at, "used": False}

    async def redeem(self, code_hash: str) -> CodeGrant | None:
        row = self.rows.get(code_hash)
        if row is None or row["used"] or row["expires_at"] <= self.clock():
            return None
        row["used"] = True
        return row["grant"]


@dataclass
class InMemoryAttemptCounter:
    """`AttemptCounter` with the Postgres one's fixed windows, on the fake clock
    (tests/integration/test_sign_in_limits.py checks the Postgres one)."""

    clock: FakeClock
    rows: dict[tuple[str, float], int] = field(default_factory=dict)

    async def count(self, keys: list[tuple[Limit, str]]) -> list[Count]:
        counts = []
        for limit, value in keys:
            key, window = f"{limit.name}:{value}", limit.window_s
            start = self.clock() // window * window
            self.rows[key, start] = self.rows.get((key, start), 0) + 1
            previous = self.rows.get((key, start - window), 0)
            elapsed = self.clock() - start
            counts.append(Count(limit, key, start, self.rows[key, start], previous, elapsed))
        return counts

    async def uncount(self, counts: list[Count]) -> None:
        for c in counts:
            if (c.key, c.window_start) in self.rows:
                self.rows[c.key, c.window_start] = max(0, self.rows[c.key, c.window_start] - 1)

    async def reset(self, key: str) -> None:
        self.rows = {k: v for k, v in self.rows.items() if k[0] != key}


@dataclass
class Harness:
    client: TestClient
    accounts: LocalAccounts
    account_store: InMemoryAccountStore
    codes: InMemoryCodeStore
    clock: FakeClock


def make_harness(
    tmp_path: Path, *, allow_signup: bool = True, key_file: str = "local-oidc.pem"
) -> Harness:
    clock = FakeClock()
    account_store = InMemoryAccountStore()
    accounts = LocalAccounts(store=account_store)
    codes = InMemoryCodeStore(clock)
    router = build_local_oidc_router(
        accounts=accounts,
        pool=None,
        issuer=ISSUER,
        client_id=CLIENT_ID,
        client_secret=CLIENT_SECRET,
        signing_key_path=tmp_path / "keys" / key_file,
        allow_signup=allow_signup,
        code_store=codes,
        attempt_counter=InMemoryAttemptCounter(clock),
        clock=clock,
    )
    app = FastAPI()
    app.include_router(router)
    # Seeded straight into the store: asyncio.run here would unset pytest-asyncio's loop.
    account_store.records["alice"] = AccountRecord(
        "alice", str(uuid.uuid4()), hash_password(PASSWORD), None
    )
    return Harness(TestClient(app), accounts, account_store, codes, clock)


@pytest.fixture
def harness(tmp_path: Path) -> Harness:
    return make_harness(tmp_path)


def authorize_params(**overrides: str) -> dict[str, str]:
    params = {
        "client_id": CLIENT_ID,
        "redirect_uri": REDIRECT_URI,
        "response_type": "code",
        "state": "state-123",
        "nonce": "nonce-456",
        "scope": "openid profile email",
    }
    return params | overrides


def open_login(harness: Harness, **overrides: str) -> str:
    """GET the login page and return its CSRF token."""
    response = harness.client.get("/local-oidc/authorize", params=authorize_params(**overrides))
    assert response.status_code == 200
    match = re.search(r'name="csrf_token" value="([^"]+)"', response.text)
    assert match
    return match.group(1)


def submit_login(
    harness: Harness,
    csrf_token: str | None,
    *,
    username: str = "alice",
    password: str = PASSWORD,
    mode: str = "signin",
    **overrides: str,
) -> Any:
    form = authorize_params(**overrides) | {
        "username": username,
        "password": password,
        "mode": mode,
    }
    if csrf_token is not None:
        form["csrf_token"] = csrf_token
    return harness.client.post("/local-oidc/authorize", data=form, follow_redirects=False)


def sign_in(harness: Harness, **kwargs: str) -> dict[str, list[str]]:
    """Run the browser half of the flow; return the callback's query parameters."""
    response = submit_login(harness, open_login(harness), **kwargs)
    assert response.status_code == 302, response.text
    location = urlsplit(response.headers["location"])
    assert f"{location.scheme}://{location.netloc}{location.path}" == REDIRECT_URI
    return parse_qs(location.query)


def exchange(harness: Harness, code: str, **overrides: str) -> Any:
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": REDIRECT_URI,
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
    }
    return harness.client.post("/local-oidc/token", data=form | overrides)


def userinfo(harness: Harness, access_token: str) -> Any:
    headers = {"Authorization": f"Bearer {access_token}"}
    return harness.client.get("/local-oidc/userinfo", headers=headers)


def subject_of(harness: Harness, username: str) -> str:
    return harness.account_store.records[username].subject


def test_login_page_is_labelled_and_titled(harness: Harness) -> None:
    response = harness.client.get("/local-oidc/authorize", params=authorize_params())

    assert "<title>Sign in to Cairn</title>" in response.text
    assert '<label for="username">Username</label>' in response.text
    assert '<label for="password">Password</label>' in response.text
    assert '<input id="password" type="password" name="password"' in response.text
    assert 'name="mode" value="signin">Sign in</button>' in response.text
    assert 'name="mode" value="signup">Create account</button>' in response.text
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    cookie = response.headers["set-cookie"].lower()
    assert "httponly" in cookie
    assert "samesite=lax" in cookie


def test_full_code_flow_reaches_userinfo(harness: Harness) -> None:
    callback = sign_in(harness)
    assert callback["state"] == ["state-123"]

    tokens = exchange(harness, callback["code"][0]).json()
    info = userinfo(harness, tokens["access_token"])

    assert tokens["token_type"] == "Bearer"
    assert tokens["expires_in"] == 300
    assert info.status_code == 200
    assert info.json() == {
        "sub": subject_of(harness, "alice"),
        "preferred_username": "alice",
        "name": "alice",
        "email": "alice@local.invalid",
    }


def test_id_token_verifies_against_published_jwks(harness: Harness) -> None:
    tokens = exchange(harness, sign_in(harness)["code"][0]).json()
    jwks = harness.client.get("/local-oidc/jwks").json()
    discovery = harness.client.get("/local-oidc/.well-known/openid-configuration").json()

    key = RSAKey.import_key(jwks["keys"][0])
    claims = jwt.decode(tokens["id_token"], key, algorithms=["RS256"]).claims

    assert "d" not in jwks["keys"][0]
    assert discovery["issuer"] == ISSUER
    assert discovery["token_endpoint"] == f"{ISSUER}/token"
    assert claims["iss"] == ISSUER
    assert claims["aud"] == CLIENT_ID
    assert claims["sub"] == subject_of(harness, "alice")
    assert claims["nonce"] == "nonce-456"
    assert claims["exp"] > claims["iat"]


def test_client_secret_via_http_basic_is_accepted(harness: Harness) -> None:
    code = sign_in(harness)["code"][0]
    basic = base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode()).decode()
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT_URI}

    response = harness.client.post(
        "/local-oidc/token", data=form, headers={"Authorization": f"Basic {basic}"}
    )

    assert response.status_code == 200
    assert response.json()["access_token"]


def test_code_is_single_use(harness: Harness) -> None:
    code = sign_in(harness)["code"][0]

    first = exchange(harness, code)
    second = exchange(harness, code)

    assert first.status_code == 200
    assert second.status_code == 400
    assert second.json()["error"] == "invalid_grant"


def test_wrong_client_secret_is_refused(harness: Harness) -> None:
    code = sign_in(harness)["code"][0]

    response = exchange(harness, code, client_secret="guess")

    assert response.status_code == 401
    assert response.json()["error"] == "invalid_client"
    assert "access_token" not in response.json()


def test_unsupported_grant_type_is_refused(harness: Harness) -> None:
    response = exchange(harness, "whatever", grant_type="password")

    assert response.status_code == 400
    assert response.json()["error"] == "unsupported_grant_type"


def test_token_redirect_uri_must_match_and_burns_the_code(harness: Harness) -> None:
    code = sign_in(harness)["code"][0]

    mismatched = exchange(harness, code, redirect_uri="http://testserver/auth/oauth/x/callback")
    retried = exchange(harness, code)

    assert mismatched.status_code == 400
    assert mismatched.json()["error"] == "invalid_grant"
    assert retried.json()["error"] == "invalid_grant"


@pytest.mark.parametrize(
    "redirect_uri",
    [
        "https://evil.example/auth/oauth/local/callback",
        "http://testserver.evil.example/auth/oauth/local/callback",
        "http://testserver@evil.example/auth/oauth/local/callback",
        "http://testserver:8443/auth/oauth/local/callback",
        "http://testserver/somewhere/else",
        "http://testserver/auth/oauth/local/callback/../../../../logout/auth/oauth/a/callback",
        "//evil.example/auth/oauth/local/callback",
        "",
    ],
)
def test_foreign_redirect_uri_is_refused_without_redirecting(
    harness: Harness, redirect_uri: str
) -> None:
    shown = harness.client.get(
        "/local-oidc/authorize",
        params=authorize_params(redirect_uri=redirect_uri),
        follow_redirects=False,
    )
    csrf_token = open_login(harness)
    submitted = submit_login(harness, csrf_token, redirect_uri=redirect_uri)

    for response in (shown, submitted):
        assert response.status_code == 400
        assert "location" not in response.headers
        assert 'name="password"' not in response.text
    assert harness.codes.rows == {}


def test_wrong_client_id_at_authorize_is_refused(harness: Harness) -> None:
    response = harness.client.get(
        "/local-oidc/authorize", params=authorize_params(client_id="someone-else")
    )

    assert response.status_code == 400
    assert 'name="password"' not in response.text


@pytest.mark.parametrize("username", ["alice", "nobody"])
def test_bad_credentials_get_401_and_no_code(harness: Harness, username: str) -> None:
    response = submit_login(harness, open_login(harness), username=username, password="wrong-pw")

    assert response.status_code == 401
    assert "location" not in response.headers
    assert "Incorrect username or password." in response.text
    assert harness.codes.rows == {}


def test_missing_or_mismatched_csrf_token_is_refused(harness: Harness) -> None:
    csrf_token = open_login(harness)

    without_field = submit_login(harness, None)
    mismatched = submit_login(harness, csrf_token[::-1])
    harness.client.cookies.delete(CSRF_COOKIE, path="/local-oidc")
    without_cookie = submit_login(harness, csrf_token)

    for response in (without_field, mismatched, without_cookie):
        assert response.status_code == 400
        assert "location" not in response.headers
    assert harness.codes.rows == {}


def test_tampered_access_token_is_refused(harness: Harness) -> None:
    token = exchange(harness, sign_in(harness)["code"][0]).json()["access_token"]
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    # Point the token at another real account, so an unchecked signature would leak it.
    claims["sub"] = "victim-subject"
    harness.account_store.records["victim"] = AccountRecord(
        "victim", "victim-subject", hash_password(PASSWORD), None
    )
    forged_payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    flipped = signature[:-2] + ("AA" if signature[-2:] != "AA" else "BB")

    for forged in (f"{header}.{forged_payload}.{signature}", f"{header}.{payload}.{flipped}"):
        response = userinfo(harness, forged)
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")


def test_id_token_and_expired_access_token_cannot_read_userinfo(harness: Harness) -> None:
    tokens = exchange(harness, sign_in(harness)["code"][0]).json()

    with_id_token = userinfo(harness, tokens["id_token"])
    harness.clock.advance(301)
    expired = userinfo(harness, tokens["access_token"])
    missing = harness.client.get("/local-oidc/userinfo")

    assert with_id_token.status_code == 401
    assert expired.status_code == 401
    assert missing.status_code == 401
    assert "www-authenticate" in missing.headers


@pytest.mark.parametrize(("wait", "status"), [(59, 200), (61, 400)])
def test_code_expires_after_a_minute(harness: Harness, wait: int, status: int) -> None:
    code = sign_in(harness)["code"][0]

    harness.clock.advance(wait)
    response = exchange(harness, code)

    assert response.status_code == status


def test_state_is_html_escaped_and_round_trips(harness: Harness) -> None:
    state = '"><script>alert(1)</script>'

    page = harness.client.get("/local-oidc/authorize", params=authorize_params(state=state))
    callback = sign_in(harness, state=state)

    assert "<script>" not in page.text
    assert "&quot;&gt;&lt;script&gt;" in page.text
    assert callback["state"] == [state]


def test_repeated_failures_are_rate_limited(harness: Harness) -> None:
    csrf_token = open_login(harness)
    failures = [
        submit_login(harness, csrf_token, password="wrong-pw").status_code for _ in range(10)
    ]

    blocked = submit_login(harness, csrf_token)
    harness.clock.advance(301)
    after_window = submit_login(harness, csrf_token)

    assert failures == [401] * 10
    assert blocked.status_code == 429
    assert "retry-after" in blocked.headers
    assert after_window.status_code == 302


def test_signup_creates_account_with_stable_subject(harness: Harness) -> None:
    signed_up = sign_in(harness, username="Bob.Smith", password="another pass", mode="signup")
    first = exchange(harness, signed_up["code"][0]).json()["access_token"]
    signed_in = sign_in(harness, username="bob.smith", password="another pass")
    second = exchange(harness, signed_in["code"][0]).json()["access_token"]

    subjects = {userinfo(harness, token).json()["sub"] for token in (first, second)}

    assert subjects == {subject_of(harness, "bob.smith")}
    assert subject_of(harness, "bob.smith") != "bob.smith"


def test_signup_refuses_taken_or_invalid_names(harness: Harness) -> None:
    csrf_token = open_login(harness)

    taken = submit_login(harness, csrf_token, password="different pw", mode="signup")
    invalid = submit_login(harness, csrf_token, username="x", mode="signup")

    assert taken.status_code == 400
    assert invalid.status_code == 400
    assert set(harness.account_store.records) == {"alice"}


def test_signup_is_refused_when_disabled(tmp_path: Path) -> None:
    harness = make_harness(tmp_path, allow_signup=False)
    page = harness.client.get("/local-oidc/authorize", params=authorize_params())

    response = submit_login(harness, open_login(harness), username="carol", mode="signup")

    assert "Create account" not in page.text
    assert response.status_code == 400
    assert "carol" not in harness.account_store.records


@pytest.mark.parametrize("file_name", ["local-oidc.pem", "local_oidc_key.json"])
def test_signing_key_is_private_and_reused(tmp_path: Path, file_name: str) -> None:
    kids = {
        make_harness(tmp_path, key_file=file_name)
        .client.get("/local-oidc/jwks")
        .json()["keys"][0]["kid"]
        for _ in range(2)
    }
    key_path = tmp_path / "keys" / file_name

    assert len(kids) == 1
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert [p.name for p in key_path.parent.iterdir()] == [file_name]


def test_readable_signing_key_is_refused(tmp_path: Path) -> None:
    make_harness(tmp_path)
    key_path = tmp_path / "keys" / "local-oidc.pem"
    key_path.chmod(0o644)

    with pytest.raises(PermissionError):
        make_harness(tmp_path)


async def test_password_hashes_are_salted_and_verify() -> None:
    store = InMemoryAccountStore()
    accounts = LocalAccounts(store=store)

    account = await accounts.create("dave", PASSWORD, display_name="Dave")
    stored = store.records["dave"].password_hash

    assert PASSWORD not in stored
    assert stored.startswith("scrypt$")
    assert hash_password(PASSWORD) != hash_password(PASSWORD)
    assert verify_password(PASSWORD, stored)
    assert not verify_password("wrong-password", stored)
    assert await accounts.verify("DAVE", PASSWORD) == account
    assert await accounts.verify("dave", "wrong-password") is None
    assert await accounts.get_by_subject(account.subject) == account


async def test_seed_is_idempotent_and_rejects_malformed_entries() -> None:
    store = InMemoryAccountStore()
    accounts = LocalAccounts(store=store)

    await accounts.seed(["erin:first-password"])
    subject = store.records["erin"].subject
    await accounts.seed(["erin:changed-password", "frank:frank-password"])

    assert store.records["erin"].subject == subject
    assert await accounts.verify("erin", "first-password") is not None
    assert set(store.records) == {"erin", "frank"}
    with pytest.raises(AccountError) as error:
        await accounts.seed(["grace:fine-password", "no-colon-secret-value"])
    assert "secret" not in str(error.value)
    assert "grace" not in store.records
