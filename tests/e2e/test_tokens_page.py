"""The access tokens page in real Chromium: make a token (shown once), use it at /mcp, revoke it."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg
import pytest
from playwright.sync_api import expect

from auth.tokens import hash_token
from tests.e2e.conftest import login
from tests.e2e.test_mcp import call

pytestmark = pytest.mark.e2e

ASKED = "hello from my editor"
TOOLS_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
ACCEPT = "application/json, text/event-stream"


def mcp_status(server, token: str) -> int:
    headers = {"Authorization": f"Bearer {token}", "Accept": ACCEPT}
    return httpx.post(f"{server.url}/mcp", json=TOOLS_LIST, headers=headers, timeout=30).status_code


def test_make_use_and_revoke_a_token(app_server, browser):
    page = login(browser, app_server, "alice")
    page.goto(f"{app_server.url}/memory")
    page.get_by_role("link", name="Access tokens").click()
    page.wait_for_url(f"{app_server.url}/tokens")
    expect(page.locator("#endpoint")).to_have_text(f"{app_server.url}/mcp")

    page.locator("#token-name").fill("my editor")
    page.get_by_label("Research").uncheck()
    page.get_by_role("button", name="Create token").click()
    shown = page.locator("#new-token-value")
    expect(shown).to_contain_text("cairn_pat_")
    token = shown.inner_text().strip()
    row = page.locator("li.token", has_text="my editor")
    expect(row).to_contain_text("active")
    expect(row).to_contain_text("agents: assistant, planner")

    # Only its hash is stored, and it is never shown again.
    with psycopg.connect(app_server.database_url, autocommit=True) as conn:
        stored = conn.execute(
            "SELECT token_hash, scopes FROM cairn_access_tokens WHERE name = 'my editor'"
        ).fetchall()
    assert stored == [(hash_token(token), ["assistant", "planner"])]
    page.reload()
    expect(page.locator("li.token", has_text="my editor")).to_be_visible()
    assert token not in page.content()

    assert mcp_status(app_server, token) == 200
    # A conversation held over MCP opens in the chat like any other.
    with ThreadPoolExecutor(1) as pool:  # the MCP client in its own event loop
        done = pool.submit(asyncio.run, call(app_server, token, "ask_assistant", message=ASKED))
        thread_id = done.result(timeout=120)["thread_id"]
    page.goto(f"{app_server.url}/thread/{thread_id}")
    expect(page.get_by_text(f"You said: {ASKED}").last).to_be_visible()
    page.goto(f"{app_server.url}/tokens")
    page.locator("li.token", has_text="my editor").get_by_role("button", name="Revoke").click()
    expect(page.locator("li.token", has_text="my editor")).to_contain_text("revoked")
    assert mcp_status(app_server, token) == 401
    page.context.close()
