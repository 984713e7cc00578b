"""In real Chromium: a fact told in one conversation is used in the next; a forgotten one is gone."""

from __future__ import annotations

import json
import re
import time

import psycopg
import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import login, wait_until_connected

pytestmark = pytest.mark.e2e

THREAD_URL = re.compile(r".*/thread/([0-9a-f-]{36})$")


def send(page, text: str) -> None:
    page.locator("#chat-input").fill(text)
    page.keyboard.press("Enter")


def stored_memories(database_url: str) -> list[str]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT value->>'content' FROM store WHERE prefix LIKE 'memories.%%' "
            "AND (prefix LIKE '%%.profile' OR prefix LIKE '%%.facts')"
        ).fetchall()
    return [r[0] for r in rows]


def wait_for(predicate, *, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.25)
    pytest.fail("condition not met in time")


def new_conversation(page, server) -> None:
    page.goto(server.url)
    page.locator("#chat-input").wait_for()
    wait_until_connected(page)


def test_fact_is_used_in_a_new_conversation_and_gone_after_forget(app_server, browser):
    page = login(browser, app_server, "alice")
    send(page, "By the way, I'm vegetarian and my manager is Priya.")
    expect(page.get_by_text("You said: By the way, I'm vegetarian")).to_be_visible()

    # The debounced job runs once the conversation has been idle for a second.
    wait_for(lambda: "User is vegetarian" in stored_memories(app_server.database_url))

    new_conversation(page, app_server)
    send(page, "What should I cook tonight?")
    reply = page.get_by_text("What I remember about you").last
    expect(reply).to_contain_text("User is vegetarian")
    expect(reply).to_contain_text("User's manager is Priya")

    send(page, "Please forget that I am vegetarian")
    expect(page.get_by_text("Memory: Forgotten: User is vegetarian")).to_be_visible()
    assert "User is vegetarian" not in stored_memories(app_server.database_url)

    new_conversation(page, app_server)
    send(page, "Any dinner ideas?")
    reply = page.get_by_text("You said: Any dinner ideas?").last
    expect(reply).to_be_visible()
    expect(reply).not_to_contain_text("vegetarian")
    expect(reply).to_contain_text("User's manager is Priya")
    page.context.close()


def test_what_code_did_with_memory_is_noted_and_kept_with_the_conversation(app_server, browser):
    page = login(browser, app_server, "bob")
    send(page, "remember that I like jazz")
    expect(page.get_by_text("Memory: Saved: User prefers jazz")).to_be_visible()
    send(page, "remember that my password is hunter2")
    refused = page.get_by_text("Memory: Not saved: it looks like a password")
    expect(refused).to_be_visible()
    expect(refused).not_to_contain_text("hunter2")
    assert not any("hunter2" in m for m in stored_memories(app_server.database_url))
    page.wait_for_url(THREAD_URL)

    page.reload()

    expect(page.get_by_text("Memory: Saved: User prefers jazz")).to_be_visible()
    expect(page.get_by_text("Memory: Not saved: it looks like a password")).to_be_visible()
    page.context.close()


def test_memories_never_cross_users(app_server, browser):
    alice = login(browser, app_server, "alice")
    send(alice, "My manager is Zephyrine.")
    expect(alice.get_by_text("You said: My manager is Zephyrine.")).to_be_visible()
    wait_for(lambda: "User's manager is Zephyrine" in stored_memories(app_server.database_url))

    bob = login(browser, app_server, "bob")
    send(bob, "Who is my manager?")
    expect(bob.get_by_text("You said: Who is my manager?")).to_be_visible()
    bob.wait_for_timeout(500)
    expect(bob.get_by_text("Zephyrine")).to_have_count(0)
    alice.context.close()
    bob.context.close()


def _opt_in(database_url: str, username: str, category: str) -> None:
    """What the settings page will do: allow one sensitive category for this account."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO store (prefix, key, value) "
            "SELECT 'memories.cairn:' || subject || '.settings', 'prefs', %s::jsonb "
            "FROM local_accounts WHERE username = %s "
            "ON CONFLICT (prefix, key) DO UPDATE SET value = EXCLUDED.value",
            (json.dumps({"enabled": True, "opted_in": [category]}), username),
        )


def test_sensitive_fact_waits_for_confirmation_buttons(app_server, browser):
    _opt_in(app_server.database_url, "bob", "health")
    page = login(browser, app_server, "bob")

    send(page, "remember that I have asthma")
    expect(page.get_by_text("Should I store it?")).to_be_visible()
    assert not any("asthma" in m for m in stored_memories(app_server.database_url))
    page.get_by_role("button", name="Remember it").click()
    expect(page.get_by_text("Memory: Saved: User has asthma")).to_be_visible()
    assert any("asthma" in m for m in stored_memories(app_server.database_url))

    send(page, "remember that I take insulin medication")
    page.get_by_role("button", name="Don't store it").click()
    expect(page.get_by_text("Memory: Not saved: you chose not to store that.")).to_be_visible()
    assert not any("insulin" in m for m in stored_memories(app_server.database_url))
    page.context.close()


def test_pending_confirmation_survives_a_server_restart(app_server, browser):
    _opt_in(app_server.database_url, "alice", "health")
    page = login(browser, app_server, "alice")
    send(page, "remember that I have a migraine condition")
    expect(page.get_by_text("Should I store it?")).to_be_visible()
    page.wait_for_url(THREAD_URL)
    thread_url = page.url
    page.context.close()

    app_server.restart()

    page = login(browser, app_server, "alice")
    page.goto(thread_url)
    page.get_by_role("button", name="Remember it").last.click()
    expect(page.get_by_text("Memory: Saved: User has a migraine condition")).to_be_visible()
    assert any("migraine" in m for m in stored_memories(app_server.database_url))
    page.context.close()
