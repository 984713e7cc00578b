"""In real Chromium: a conversation shared with a team opens for a teammate, read-only and
without memory notes, and is a missing page for a stranger, a made-up id and after revoking."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import psycopg
import pytest
from playwright.sync_api import expect

from auth.oauth import LOCAL_PROVIDER_ID
from auth.workspaces import MEMBER, Workspaces
from graphs.core.persistence import make_pool
from tests.e2e.conftest import login, wait_until_connected
from ui.memory_page import REQUEST_HEADER

pytestmark = pytest.mark.e2e

THREAD_URL = re.compile(r".*/thread/([0-9a-f-]{36})$")
HOSTILE = "<img src=x onerror=alert(1)>"
MADE_UP = "/share/AAAAAAAAAAAAAAAAAAAAAA"
T = TypeVar("T")


def in_postgres(database_url: str, work: Callable[[Workspaces], Awaitable[T]]) -> T:
    """Drive the Workspaces service on the server's database, in an event loop of its own (the
    sync Playwright API holds this thread's)."""

    async def run() -> T:
        pool = make_pool(database_url, max_size=2)
        await pool.open(wait=True)
        try:
            return await work(Workspaces(pool))
        finally:
            await pool.close()

    with ThreadPoolExecutor(1) as executor:
        return executor.submit(asyncio.run, run()).result()


def user_id(database_url: str, username: str) -> str:
    """The id the bundled login gives the user (auth/oauth.py: provider and subject)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT subject FROM local_accounts WHERE username = %s", (username,)
        ).fetchone()
    assert row is not None
    return f"{LOCAL_PROVIDER_ID}:{row[0]}"


def say(page: Any, text: str, reply: str) -> None:
    page.locator("#chat-input").fill(text)
    page.keyboard.press("Enter")
    expect(page.get_by_text(reply).last).to_be_visible()


def post(page: Any, server: Any, path: str, body: dict[str, Any]) -> Any:
    return page.request.post(
        server.url + path, data=body, headers={REQUEST_HEADER: "1", "Origin": server.url}
    )


def test_a_shared_conversation_opens_for_a_teammate_and_is_missing_for_anyone_else(
    app_server, browser
):
    url = app_server.database_url
    alice = login(browser, app_server, "alice")
    bob = login(browser, app_server, "bob")
    alice_id, bob_id = user_id(url, "alice"), user_id(url, "bob")

    async def make_team(workspaces: Workspaces) -> tuple[str, str]:
        team = await workspaces.create(alice_id, "Share team")
        await workspaces.switch(alice_id, team.workspace_id)
        code, _ = await workspaces.invite(team, MEMBER)
        return team.workspace_id, code

    team_id, invite = in_postgres(url, make_team)

    # alice chats in the team: a fact saved to her memory (a memory note), a hostile message.
    say(alice, "remember that I like figs", "Memory: Saved: User prefers figs")
    alice.wait_for_url(THREAD_URL)
    thread_id = THREAD_URL.match(alice.url).group(1)
    say(alice, f"hostile {HOSTILE} canary 6120", "canary 6120")
    expect(alice.get_by_text("Usage").last).to_be_visible()

    created = post(alice, app_server, f"/api/threads/{thread_id}/shares", {"audience": "workspace"})
    assert created.status == 200, created.text()
    share_url = app_server.url + created.json()["url"]
    listed = alice.request.get(app_server.url + "/api/shares").json()["shares"]
    assert [s["id"] for s in listed] == [created.json()["id"]]

    # bob, not yet a member: exactly what a made-up id gets.
    missing = bob.request.get(app_server.url + MADE_UP)
    assert missing.status == 404
    before = bob.request.get(share_url)
    assert (before.status, before.text()) == (404, missing.text())
    # bob cannot share or revoke alice's conversation either: the 404 of a missing one.
    assert post(bob, app_server, f"/api/threads/{thread_id}/shares", {}).status == 404
    share_id = created.json()["id"]
    assert post(bob, app_server, f"/api/shares/{share_id}/revoke", {}).status == 404

    in_postgres(url, lambda workspaces: workspaces.accept(bob_id, invite))

    dialogs: list[str] = []
    bob.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    bob.goto(share_url)
    messages = bob.locator("#messages")
    expect(messages).to_contain_text("remember that I like figs")
    expect(messages).to_contain_text(f"hostile {HOSTILE} canary 6120")
    expect(messages).not_to_contain_text("Memory: Saved")
    expect(bob.locator("#messages img")).to_have_count(0)
    expect(
        bob.get_by_text("Not included: memory notes, recall details, attachments.")
    ).to_be_visible()
    assert dialogs == []

    # alice revokes it from her memory page: bob's link is a missing page again.
    alice.goto(app_server.url + "/memory")
    shared = alice.locator("#shares li.shared")
    expect(shared).to_have_count(1)
    alice.once("dialog", lambda dialog: dialog.accept())
    shared.get_by_role("button", name="Revoke").click()
    expect(alice.get_by_text("Share revoked")).to_be_visible()
    expect(alice.locator("#shares li.shared")).to_have_count(0)
    after = bob.request.get(share_url)
    assert (after.status, after.text()) == (404, missing.text())

    audit = in_postgres(url, lambda workspaces: workspaces.audit_log(team_id))
    assert [e["action"] for e in audit if e["action"].startswith("share.")] == [
        "share.revoked",
        "share.created",
    ]
    alice.context.close()
    bob.context.close()


def test_the_chat_header_shares_a_team_conversation_and_not_a_personal_one(app_server, browser):
    url = app_server.database_url
    carol = login(browser, app_server, "carol")
    say(carol, "a personal note to self", "You said: a personal note to self")
    carol.wait_for_url(THREAD_URL)
    carol.wait_for_timeout(2500)  # the header asks the server once the conversation is open
    expect(carol.locator("#cairn-share-conversation")).to_have_count(0)

    carol_id, bob_id = user_id(url, "carol"), user_id(url, "bob")

    async def team_with_bob(workspaces: Workspaces) -> None:
        team = await workspaces.create(carol_id, "Header team")
        await workspaces.switch(carol_id, team.workspace_id)
        code, _ = await workspaces.invite(team, MEMBER)
        await workspaces.accept(bob_id, code, display_name="bob")

    in_postgres(url, team_with_bob)
    carol.goto(app_server.url)
    wait_until_connected(carol)
    say(carol, "a team plan worth reading", "You said: a team plan worth reading")
    carol.wait_for_url(THREAD_URL)
    share = carol.locator("#cairn-share-conversation")
    expect(share).to_be_visible(timeout=10_000)
    share.click()
    dialog = carol.locator("#cairn-share-dialog")
    dialog.get_by_label("bob").check()  # with a named member, not the whole team
    dialog.get_by_role("button", name="Share").click()
    link = carol.locator(".cairn-share-link")
    expect(link).to_contain_text("Shared. Link: ")
    shared = str(link.text_content()).split("Link: ")[1].strip()
    with psycopg.connect(url, autocommit=True) as conn:
        audience = conn.execute(
            "SELECT s.audience, array_agg(m.user_id) FROM cairn_thread_shares s "
            "JOIN cairn_thread_share_members m ON m.share_id = s.id "
            "WHERE s.id = %s GROUP BY s.audience",
            (shared.rsplit("/", 1)[1],),
        ).fetchone()
    assert audience == ("members", [bob_id])
    bob = login(browser, app_server, "bob")
    bob.goto(shared)
    expect(bob.get_by_text("a team plan worth reading").first).to_be_visible()
    alice = login(browser, app_server, "alice")  # not in the team
    alice.goto(shared)
    expect(alice.get_by_text("Shared conversation not found")).to_be_visible()
    for page in (alice, bob, carol):
        page.context.close()
