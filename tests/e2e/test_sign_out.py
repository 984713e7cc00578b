"""Sign-out and the sign-in lockout against two real app processes on one database: a replayed
session cookie after sign-out (or sign out everywhere, or its expiry) is refused by both workers
on HTTP routes, the socket.io handshake and token creation; a rotated X-Forwarded-For does not
reset the lockout."""

from __future__ import annotations

import asyncio
import html
import re
import secrets
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import jwt
import pytest
import socketio

from bench.login import sign_in
from tests.conftest import create_database
from tests.e2e.conftest import USERS, AppServer
from tests.e2e.test_hostile_client import ChatSocket

pytestmark = pytest.mark.e2e

PAGE = {"X-Cairn-Request": "1"}
SECRET = secrets.token_urlsafe(48)


@pytest.fixture(scope="module")
def workers(pg_server_url: str) -> Iterator[tuple[AppServer, AppServer]]:
    """Two workers on one database sharing the auth secret (as behind a load balancer)."""
    url = create_database(pg_server_url)
    with (
        tempfile.TemporaryDirectory(prefix="cairn-so1-") as one,
        tempfile.TemporaryDirectory(prefix="cairn-so2-") as two,
    ):
        servers = tuple(
            AppServer(
                database_url=url, data_dir=Path(folder), extra_env={"CAIRN_AUTH_SECRET": SECRET}
            )
            for folder in (one, two)
        )
        try:
            for server in servers:  # one after the other: the first creates the schema
                server.start()
            yield servers  # type: ignore[misc]
        finally:
            for server in servers:
                server.stop()


async def statuses(server: AppServer, cookie: str) -> dict[str, int]:
    """What an HTTP client replaying `cookie` gets: a page's API, and a new access token."""
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Cookie": cookie}, timeout=30
    ) as http:
        memory = await http.get("/api/memory")
        token = await http.post(
            "/api/tokens",
            json={"name": "replayed", "scopes": ["assistant"]},
            headers={**PAGE, "Origin": server.url},
        )
    return {"memory": memory.status_code, "token": token.status_code}


async def connects(server: AppServer, cookie: str) -> bool:
    socket = ChatSocket(server, cookie)
    try:
        await socket.connect()
    except socketio.exceptions.ConnectionError:
        return False
    await socket.close()
    return True


async def until_disconnected(socket: ChatSocket, timeout: float = 10) -> None:
    async with asyncio.timeout(timeout):
        while socket.client.connected:
            await asyncio.sleep(0.1)


async def test_a_replayed_cookie_after_sign_out_is_refused_by_every_worker(
    workers: tuple[AppServer, AppServer],
) -> None:
    first, second = workers
    cookie = await sign_in(first.url, "alice", USERS["alice"])
    other_browser = await sign_in(second.url, "alice", USERS["alice"])
    assert await statuses(second, cookie) == {"memory": 200, "token": 200}
    tab = ChatSocket(second, cookie)  # a chat open on the other worker
    await tab.start()

    async with httpx.AsyncClient(
        base_url=first.url, headers={"Cookie": cookie, "Origin": first.url}
    ) as http:
        signed_out = await http.post("/logout")
    assert signed_out.status_code == 200, signed_out.text

    await until_disconnected(tab)  # the other worker ended the session's live chat
    for server in workers:
        assert await statuses(server, cookie) == {"memory": 401, "token": 401}
        assert not await connects(server, cookie)
        # The same person's other session goes on.
        assert await statuses(server, other_browser) == {"memory": 200, "token": 200}
        assert await connects(server, other_browser)


async def test_sign_out_everywhere_ends_every_session_and_token(
    workers: tuple[AppServer, AppServer],
) -> None:
    first, second = workers
    here = await sign_in(first.url, "bob", USERS["bob"])
    elsewhere = await sign_in(second.url, "bob", USERS["bob"])
    async with httpx.AsyncClient(
        base_url=first.url, headers={"Cookie": here, "Origin": first.url}
    ) as http:
        made = await http.post(
            "/api/tokens",
            json={"name": "cli", "scopes": ["assistant"]},
            headers={**PAGE, "Origin": first.url},
        )
        assert made.status_code == 200
        # The page's header is required (a cross-site form cannot sign anyone out everywhere).
        forged = await http.post("/api/account/sign-out-everywhere")
        assert forged.status_code == 403
        done = await http.post(
            "/api/account/sign-out-everywhere", headers={**PAGE, "Origin": first.url}
        )
    assert done.status_code == 200, done.text
    assert done.json()["tokens_revoked"] >= 1

    for server in workers:
        for cookie in (here, elsewhere):
            assert await statuses(server, cookie) == {"memory": 401, "token": 401}
            assert not await connects(server, cookie)
        mcp = await _mcp_status(server, made.json()["token"])
        assert mcp == 401
    # Signing in again (a second after the cut-off: sessions carry whole seconds) works.
    await asyncio.sleep(1.1)
    fresh = await sign_in(second.url, "bob", USERS["bob"])
    assert await statuses(first, fresh) == {"memory": 200, "token": 200}
    async with httpx.AsyncClient(
        base_url=first.url, headers={"Cookie": fresh, "Origin": first.url}
    ) as http:
        listed = (await http.get("/api/tokens")).json()["tokens"]
    assert {t["name"]: t["revoked"] for t in listed}["cli"] is True


async def _mcp_status(server: AppServer, token: str) -> int:
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    headers = {"Accept": "application/json, text/event-stream", "Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        return (await http.post("/mcp", json=initialize, headers=headers)).status_code


async def test_an_expired_session_is_refused_everywhere(
    workers: tuple[AppServer, AppServer],
) -> None:
    first, _ = workers
    cookie = await sign_in(first.url, "alice", USERS["alice"])
    claims = jwt.decode(cookie.split("=", 1)[1], SECRET, algorithms=["HS256"])
    claims["iat"], claims["exp"] = int(time.time()) - 7200, int(time.time()) - 60
    expired = f"access_token={jwt.encode(claims, SECRET, algorithm='HS256')}"
    for server in workers:
        assert await statuses(server, expired) == {"memory": 401, "token": 401}
        assert not await connects(server, expired)


async def failed_sign_in(server: AppServer, username: str, forwarded: str) -> int:
    """A wrong password on the bundled sign-in page, naming a made-up client address."""
    headers = {"X-Forwarded-For": forwarded}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as http:
        start = await http.get("/auth/oauth/cairn")
        page = await http.get(start.headers["location"])
        hidden = re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', page.text)
        fields = {name: html.unescape(value) for name, value in hidden}
        form = fields | {"username": username, "password": "wrong-guess", "mode": "signin"}
        answer = await http.post(str(page.url).split("?")[0], data=form)
    return answer.status_code


async def test_rotating_x_forwarded_for_does_not_reset_the_lockout(
    workers: tuple[AppServer, AppServer],
) -> None:
    # The worker is not told it is behind a proxy, so the header names nobody: every guess
    # comes from the one connecting address.
    found = [
        await failed_sign_in(workers[0], "mallory-target", f"203.0.113.{n}") for n in range(11)
    ]
    assert found == [401] * 10 + [429]


def test_the_memory_page_signs_out_everywhere(
    workers: tuple[AppServer, AppServer], browser
) -> None:
    from playwright.sync_api import expect

    from tests.e2e.conftest import login

    first, second = workers
    page = login(browser, first, "bob")
    cookie = "; ".join(
        f"{c['name']}={c['value']}"
        for c in page.context.cookies()
        if c["name"].startswith("access_token")
    )
    page.goto(f"{first.url}/memory")
    page.get_by_role("button", name="Sign out everywhere").click()
    expect(page.get_by_text("You have been signed out everywhere.")).to_be_visible()
    replayed = httpx.get(f"{second.url}/api/memory", headers={"Cookie": cookie})
    assert replayed.status_code == 401
    page.goto(f"{first.url}/memory")
    expect(page).to_have_url(re.compile(r"/login"))
    page.context.close()
