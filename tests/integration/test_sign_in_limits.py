"""Sign-in and sign-up limits on a real Postgres, two workers (two pools, two apps): guesses
count by account and by address across workers, and X-Forwarded-For names the client only
when the request comes from a trusted proxy."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from auth.local_accounts import LocalAccounts
from auth.local_oidc import build_local_oidc_router
from auth.throttle import SIGN_IN_ACCOUNT, PgAttemptCounter
from graphs.core.migrations import migrate
from graphs.core.persistence import Pool, make_pool
from ui.proxies import trust_proxies

pytestmark = pytest.mark.integration

ISSUER = "http://cairn/local-oidc"
CLIENT = {"client_id": "cairn-app", "client_secret": "s3cret-for-tests"}
AUTHORIZE = {
    "client_id": "cairn-app",
    "redirect_uri": "http://cairn/auth/oauth/cairn/callback",
    "response_type": "code",
    "state": "s",
    "nonce": "n",
    "scope": "openid",
}
PASSWORD = "the-right-password"
PROXY = "10.0.0.7"


@pytest.fixture(scope="module")
async def pools(database_url: str) -> AsyncIterator[list[Pool]]:
    found = [make_pool(database_url, max_size=4), make_pool(database_url, max_size=4)]
    for pool in found:
        await pool.open(wait=True)
    await migrate(found[0])
    accounts = LocalAccounts(found[0])
    await accounts.seed([f"{name}:{PASSWORD}" for name in ("alice", "bob", "carol", "dave")])
    yield found
    for pool in found:
        await pool.close()


@pytest.fixture(scope="module")
def apps(pools: list[Pool], tmp_path_factory: pytest.TempPathFactory) -> list[object]:
    """Two workers with the bundled sign-in, trusting X-Forwarded-For from PROXY only."""
    key = Path(tmp_path_factory.mktemp("oidc")) / "key.json"
    found = []
    for pool in pools:
        app = FastAPI()
        app.include_router(
            build_local_oidc_router(
                accounts=LocalAccounts(pool),
                pool=pool,
                issuer=ISSUER,
                signing_key_path=key,
                allow_signup=True,
                **CLIENT,
            )
        )
        trust_proxies(app, trusted=[PROXY])
        found.append(app)
    return found


async def attempt(
    app: object,
    username: str,
    *,
    peer: str,
    password: str = "a-wrong-guess",
    mode: str = "signin",
    forwarded: str | None = None,
) -> int:
    """One sign-in (or sign-up) from `peer` as a browser sends it; the answer's status."""
    transport = httpx.ASGITransport(app=app, client=(peer, 40_000))  # type: ignore[arg-type]
    headers = {"X-Forwarded-For": forwarded} if forwarded else {}
    async with httpx.AsyncClient(
        transport=transport, base_url="http://cairn", headers=headers
    ) as http:
        page = await http.get("/local-oidc/authorize", params=AUTHORIZE)
        match = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
        assert match, page.text
        form = AUTHORIZE | {
            "csrf_token": match[1],
            "username": username,
            "password": password,
            "mode": mode,
        }
        answer = await http.post("/local-oidc/authorize", data=form)
    return answer.status_code


async def test_guessing_one_account_from_many_addresses_is_stopped(apps: list[object]) -> None:
    statuses = [
        await attempt(apps[n % 2], "alice", peer=f"198.51.100.{n}")
        for n in range(SIGN_IN_ACCOUNT.attempts)
    ]
    assert statuses == [401] * SIGN_IN_ACCOUNT.attempts

    # A new address, either worker: the account is locked for now (even the right password:
    # the password is not even checked).
    assert await attempt(apps[0], "alice", peer="203.0.113.9") == 429
    assert await attempt(apps[1], "ALICE ", peer="203.0.113.10", password=PASSWORD) == 429
    # Other accounts are not.
    assert await attempt(apps[1], "bob", peer="198.51.100.1", password=PASSWORD) == 302


async def test_two_workers_share_the_count_of_one_address(apps: list[object]) -> None:
    peer = "192.0.2.50"
    statuses = [await attempt(apps[n % 2], "bob", peer=peer) for n in range(10)]
    assert statuses == [401] * 10
    assert await attempt(apps[0], "bob", peer=peer) == 429
    assert await attempt(apps[1], "bob", peer=peer) == 429
    # Another address may still sign in to bob (below the account's own limit).
    assert await attempt(apps[1], "bob", peer="192.0.2.51", password=PASSWORD) == 302


async def test_x_forwarded_for_counts_only_from_the_trusted_proxy(apps: list[object]) -> None:
    # A client naming a fresh address in every request: ignored, it is one address.
    rotated = [
        await attempt(apps[n % 2], "carol", peer="192.0.2.80", forwarded=f"203.0.113.{n}")
        for n in range(11)
    ]
    assert rotated == [401] * 10 + [429]

    # Through the trusted proxy the forwarded address is the client: a different client
    # behind the same proxy is not locked out by the first one's guesses.
    proxied = [
        await attempt(apps[n % 2], "dave", peer=PROXY, forwarded="192.0.2.90") for n in range(11)
    ]
    assert proxied == [401] * 10 + [429]
    assert (
        await attempt(apps[0], "dave", peer=PROXY, forwarded="192.0.2.91", password=PASSWORD) == 302
    )
    # What the client itself put in front of the proxy's entry does not count.
    assert await attempt(apps[1], "dave", peer=PROXY, forwarded="192.0.2.1, 192.0.2.90") == 429


async def test_sign_up_is_limited_per_address(apps: list[object]) -> None:
    peer = "2001:db8:5::1"
    # Taken names and new accounts alike count (each answer tells whether a name exists).
    statuses = [
        await attempt(apps[n % 2], f"new-{n}" if n % 2 else "alice", peer=peer, mode="signup")
        for n in range(20)
    ]
    assert statuses == [400, 302] * 10
    # The same /64 of IPv6 is the same subscriber.
    assert await attempt(apps[0], "new-x", peer="2001:db8:5::ffff", mode="signup") == 429
    assert await attempt(apps[1], "new-y", peer="2001:db8:6::1", mode="signup") == 302


async def test_attempts_at_once_on_two_workers_each_get_their_own_count(
    pools: list[Pool],
) -> None:
    counters = [PgAttemptCounter(pool) for pool in pools]
    key = [(SIGN_IN_ACCOUNT, "racing")]
    counts: Sequence[list] = await asyncio.gather(*(counters[n % 2].count(key) for n in range(40)))
    assert sorted(c[0].attempts for c in counts) == list(range(1, 41))
    assert sum(c[0].over for c in counts) == 40 - SIGN_IN_ACCOUNT.attempts
