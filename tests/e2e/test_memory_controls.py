"""In real Chromium: sensitive suggestions answered on the memory page, memory switched off,
a temporary chat, and another user (or another site) refused on every endpoint."""

from __future__ import annotations

import time

import httpx
import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import login
from tests.e2e.test_memory import THREAD_URL, send, stored_memories
from tests.e2e.test_memory_page import new_conversation, open_memory_page, rows

pytestmark = pytest.mark.e2e

PAGE_HEADERS = {"X-Cairn-Request": "1"}


def cookies_of(page) -> dict[str, str]:
    return {c["name"]: c["value"] for c in page.context.cookies()}


def save_settings(page, *, enabled: bool, opt_in: tuple[str, ...] = ()) -> None:
    checkbox = page.locator("#memory-enabled")
    if checkbox.is_checked() != enabled:
        checkbox.click()
    for category in opt_in:
        page.locator(f'#opt-in input[value="{category}"]').check()
    page.get_by_role("button", name="Save settings").click()
    expect(page.locator("#status")).to_contain_text("Settings saved")


def test_sensitive_suggestions_are_confirmed_or_rejected_on_the_page(app_server, browser):
    page = login(browser, app_server, "alice")
    open_memory_page(page, app_server)
    save_settings(page, enabled=True, opt_in=("health", "religion"))

    new_conversation(page, app_server)
    send(page, "Remember that I have asthma")
    expect(page.get_by_text("You asked me to remember something sensitive")).to_be_visible()
    new_conversation(page, app_server)
    send(page, "Remember that I pray every morning")
    expect(page.get_by_text("You asked me to remember something sensitive").last).to_be_visible()
    assert not any("asthma" in m for m in stored_memories(app_server.database_url))

    open_memory_page(page, app_server)
    asthma = page.locator("li.suggestion", has_text="asthma")
    prayer = page.locator("li.suggestion", has_text="pray every morning")
    expect(asthma).to_be_visible()
    expect(prayer).to_be_visible()
    asthma.get_by_role("button", name="Confirm").click()
    expect(page.locator("#status")).to_contain_text("Stored: User has asthma")
    prayer.get_by_role("button", name="Reject").click()
    expect(page.locator("#status")).to_contain_text("Not stored")
    expect(page.locator("li.suggestion")).to_have_count(0)

    memories = stored_memories(app_server.database_url)
    assert "User has asthma" in memories
    assert not any("pray" in m for m in memories)
    expect(page.locator("li.memory", has_text="User has asthma")).to_be_visible()
    # Answered here, the paused conversation no longer waits: reopening shows no buttons.
    link = page.locator("li.memory", has_text="User has asthma").get_by_role("link")
    link.click()
    page.wait_for_url(THREAD_URL)
    expect(page.get_by_text("Remember that I have asthma")).to_be_visible()
    expect(page.get_by_role("button", name="Remember it")).to_have_count(0)
    page.context.close()


def test_memory_off_and_temporary_chat_neither_recall_nor_write(app_server, browser):
    page = login(browser, app_server, "bob")
    send(page, "By the way, I live in Oslo.")
    deadline = time.monotonic() + 30
    while "User lives in Oslo" not in stored_memories(app_server.database_url):
        assert time.monotonic() < deadline, "the memory job did not run"
        time.sleep(0.25)

    # Memory off for the account: no recall, no writes, nothing queued.
    open_memory_page(page, app_server)
    save_settings(page, enabled=False)
    new_conversation(page, app_server)
    send(page, "What city do I live in? Also, I'm vegan.")
    reply = page.get_by_text("You said: What city do I live in?").last
    expect(reply).to_be_visible()
    expect(reply).not_to_contain_text("Oslo")
    time.sleep(3)  # longer than the 1 s quiet period: a job would have run by now
    assert "User is vegan" not in stored_memories(app_server.database_url)
    assert not rows(
        app_server.database_url,
        "SELECT 1 FROM procrastinate_jobs WHERE status = 'todo' AND args->>'user_id' LIKE %s",
        "%bob%",
    )

    # Memory back on, but this one conversation is temporary.
    open_memory_page(page, app_server)
    save_settings(page, enabled=True)
    new_conversation(page, app_server)
    page.locator("#chat-settings-open-modal").click()
    page.get_by_role("switch").click()
    page.get_by_role("button", name="Confirm").click()
    expect(page.get_by_text("Temporary chat: this conversation")).to_be_visible()
    send(page, "Where do I live? By the way, I'm pescatarian.")
    reply = page.get_by_text("You said: Where do I live?").last
    expect(reply).to_be_visible()
    expect(reply).not_to_contain_text("Oslo")
    page.wait_for_url(THREAD_URL)
    thread_id = THREAD_URL.match(page.url).group(1)  # type: ignore[union-attr]
    time.sleep(3)
    assert "User is pescatarian" not in stored_memories(app_server.database_url)
    assert rows(
        app_server.database_url,
        "SELECT temporary FROM cairn_threads WHERE thread_id = %s",
        thread_id,
    ) == [(True,)]
    page.context.close()


def test_another_user_and_another_site_are_refused_everywhere(app_server, browser):
    alice = login(browser, app_server, "alice")
    send(alice, "By the way, my manager is Quinta.")
    expect(alice.get_by_text("You said: By the way, my manager is Quinta.")).to_be_visible()
    alice.wait_for_url(THREAD_URL)
    thread_id = THREAD_URL.match(alice.url).group(1)  # type: ignore[union-attr]
    deadline = time.monotonic() + 30
    while "User's manager is Quinta" not in stored_memories(app_server.database_url):
        assert time.monotonic() < deadline, "the memory job did not run"
        time.sleep(0.25)
    alice_cookies = cookies_of(alice)
    mine = httpx.get(f"{app_server.url}/api/memory", cookies=alice_cookies).json()
    key = next(m["key"] for m in mine["memories"] if "Quinta" in m["content"])

    bob = login(browser, app_server, "bob")
    bob_cookies = cookies_of(bob)
    url = app_server.url

    def as_bob(method: str, path: str, **kwargs):
        return httpx.request(
            method,
            f"{url}{path}",
            cookies=bob_cookies,
            headers={**PAGE_HEADERS, "Origin": url},
            **kwargs,
        )

    listing = as_bob("GET", "/api/memory").json()
    assert "Quinta" not in str(listing)
    assert thread_id not in str(listing)
    assert "Quinta" not in as_bob("GET", "/api/memory/export").text
    assert as_bob("GET", "/api/memory/search", params={"q": "manager"}).json() == {"keys": []}
    missing_key = as_bob("DELETE", "/api/memory/items/no_such_key")
    for answer in (
        as_bob("PUT", f"/api/memory/items/{key}", json={"content": "User's manager is Bob"}),
        as_bob("DELETE", f"/api/memory/items/{key}"),
    ):
        assert answer.status_code == 404
        assert answer.json() == missing_key.json()
    for suggestion in (f"paused:{thread_id}:deadbeef", f"saved:{key}"):
        answer = as_bob(
            "POST", f"/api/memory/suggestions/{suggestion}", json={"decision": "confirm"}
        )
        assert answer.status_code == 404
    deleted = as_bob("POST", f"/api/conversations/{thread_id}/delete", json={"forget": True})
    unknown = as_bob("POST", "/api/conversations/no-such-thread/delete", json={"forget": True})
    assert deleted.status_code == unknown.status_code == 404
    assert deleted.json() == unknown.json()
    assert as_bob("GET", f"/project/thread/{thread_id}").status_code == 404
    # A client-sent user id widens nothing.
    spoofed = httpx.get(
        f"{url}/api/memory", params={"user_id": "cairn:alice"}, cookies=bob_cookies
    ).json()
    assert "Quinta" not in str(spoofed)

    # Alice's data is all still there.
    assert "User's manager is Quinta" in stored_memories(app_server.database_url)
    assert rows(
        app_server.database_url, "SELECT 1 FROM checkpoints WHERE thread_id = %s", thread_id
    )

    # CSRF: Alice's own cookie without the page's header, or from another origin, changes nothing.
    no_header = httpx.delete(f"{url}/api/memory/items/{key}", cookies=alice_cookies)
    other_site = httpx.delete(
        f"{url}/api/memory/items/{key}",
        cookies=alice_cookies,
        headers={**PAGE_HEADERS, "Origin": "https://evil.example"},
    )
    assert no_header.status_code == other_site.status_code == 403
    assert "User's manager is Quinta" in stored_memories(app_server.database_url)
    # Not signed in at all.
    assert httpx.get(f"{url}/api/memory").status_code == 401
    alice.context.close()
    bob.context.close()
