"""In real Chromium: a second user can neither see nor open the first user's conversation."""

from __future__ import annotations

import re
import uuid

import httpx
import psycopg
import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import login, wait_until_connected

pytestmark = pytest.mark.e2e

THREAD_URL = re.compile(r".*/thread/([0-9a-f-]{36})$")


def _cookies(page) -> dict[str, str]:
    return {c["name"]: c["value"] for c in page.context.cookies()}


def test_second_user_cannot_see_or_open_first_users_conversation(app_server, browser):
    alice = login(browser, app_server, "alice")
    alice.locator("#chat-input").fill("alice private canary 7731")
    alice.keyboard.press("Enter")
    expect(alice.get_by_text("You said: alice private canary 7731")).to_be_visible()
    alice.wait_for_url(THREAD_URL)
    thread_id = THREAD_URL.match(alice.url).group(1)

    bob = login(browser, app_server, "bob")
    # Not in the sidebar.
    bob.wait_for_timeout(1000)
    expect(bob.get_by_text("alice private canary 7731")).to_have_count(0)

    # Not by its URL.
    bob.goto(f"{app_server.url}/thread/{thread_id}")
    bob.wait_for_timeout(2000)
    expect(bob.get_by_text("alice private canary 7731")).to_have_count(0)

    # Not through Chainlit's thread API: a foreign thread looks exactly like a missing one.
    with httpx.Client(
        base_url=app_server.url, cookies=_cookies(bob), headers=_origin(app_server)
    ) as api:
        foreign = api.get(f"/project/thread/{thread_id}")
        missing = api.get("/project/thread/00000000-0000-4000-8000-000000000000")
        assert foreign.status_code == missing.status_code == 404
        assert foreign.json() == missing.json()
        listed = api.post("/project/threads", json={"pagination": {"first": 50}, "filter": {}})
        assert listed.status_code == 200
        assert thread_id not in listed.text
        deleted = api.request("DELETE", "/project/thread", json={"threadId": thread_id})
        assert deleted.status_code == 404
        renamed = api.put("/project/thread", json={"threadId": thread_id, "name": "pwned"})
        assert renamed.status_code == 404

    # Alice still has it, untouched.
    with httpx.Client(
        base_url=app_server.url, cookies=_cookies(alice), headers=_origin(app_server)
    ) as api:
        mine = api.get(f"/project/thread/{thread_id}")
        assert mine.status_code == 200
        assert "alice private canary 7731" in mine.text
        assert mine.json()["name"] != "pwned"
    alice.context.close()
    bob.context.close()


def _thread_steps(database_url: str, thread_id: str) -> list[str]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            'SELECT coalesce(output, \'\') FROM "Step" WHERE "threadId" = %s', (thread_id,)
        ).fetchall()
    return sorted(row[0] for row in rows)


def _opened(page, url: str) -> str:
    """What the page shows once the chat has started at url (toasts gone)."""
    page.goto(url)
    wait_until_connected(page)
    page.wait_for_timeout(6000)
    return page.locator("body").inner_text()


def test_another_users_thread_url_looks_like_a_missing_one(app_server, browser):
    alice = login(browser, app_server, "alice")
    alice.locator("#chat-input").fill("alice diary 4410")
    alice.keyboard.press("Enter")
    expect(alice.get_by_text("You said: alice diary 4410")).to_be_visible()
    alice.wait_for_url(THREAD_URL)
    thread_id = THREAD_URL.match(alice.url).group(1)
    expect(alice.get_by_text("Usage")).to_be_visible()  # the turn's last step
    alice.context.close()
    before = _thread_steps(app_server.database_url, thread_id)

    bob = login(browser, app_server, "bob")
    missing = _opened(bob, f"{app_server.url}/thread/{uuid.uuid4()}")
    foreign = _opened(bob, f"{app_server.url}/thread/{thread_id}")
    assert foreign == missing
    expect(bob.get_by_text("Could not reach the server")).to_have_count(0)
    expect(bob.get_by_text("alice diary 4410")).to_have_count(0)

    # The composer works and the message starts bob's own conversation.
    bob.locator("#chat-input").fill("bob writes here")
    bob.keyboard.press("Enter")
    expect(bob.get_by_text("You said: bob writes here")).to_be_visible()
    bob.wait_for_url(THREAD_URL)
    assert THREAD_URL.match(bob.url).group(1) != thread_id
    assert _thread_steps(app_server.database_url, thread_id) == before
    bob.context.close()


def _origin(server) -> dict[str, str]:
    """As a browser sends it: the app refuses state changes from other origins."""
    return {"Origin": server.url}
