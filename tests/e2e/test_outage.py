"""In real Chromium against the real app: Postgres stopped while a user chats. The message sent
meanwhile gets a clear error with Retry, stays in the conversation, and Retry answers it once
Postgres is back, with no app restart (the app runs on its own restartable Postgres)."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.conftest import create_database
from tests.e2e.conftest import AppServer, keep_logs, login
from tests.e2e.test_chat import checkpoint_messages, send
from tests.pg_restart import RestartablePostgres

pytestmark = pytest.mark.e2e

THREAD_URL = re.compile(r".*/thread/([0-9a-f-]{36})$")
AWAY = "could not reach its database"


@pytest.fixture(scope="module")
def outage_app() -> Iterator[tuple[AppServer, RestartablePostgres]]:
    postgres = RestartablePostgres()
    try:
        with tempfile.TemporaryDirectory(prefix="cairn-e2e-outage-") as folder:
            server = AppServer(
                database_url=create_database(postgres.url),
                data_dir=Path(folder),
                extra_env={"CAIRN_POOL_TIMEOUT_S": "3"},
            )
            server.start()
            try:
                yield server, postgres
            finally:
                if not postgres.reachable():
                    postgres.start()
                server.stop()
                keep_logs(Path(folder))
    finally:
        postgres.close()


def test_a_message_sent_while_postgres_is_down_is_kept_and_answered_on_retry(outage_app, browser):
    server, postgres = outage_app
    page = login(browser, server, "alice")
    send(page, "Before the outage: hello")
    expect(page.get_by_text("You said: Before the outage: hello")).to_be_visible()
    page.wait_for_url(THREAD_URL)
    thread_id = THREAD_URL.match(page.url).group(1)
    errors: list[tuple[int, str]] = []
    page.on("response", lambda r: errors.append((r.status, r.url)) if r.status >= 400 else None)

    postgres.stop()
    try:
        send(page, "During the outage: are you there")
        expect(page.get_by_text(AWAY).last).to_be_visible(timeout=30_000)
        expect(page.get_by_text("I'm still working on your previous message")).to_have_count(0)
        # Still shown in the chat, not removed as a refused message would be.
        expect(page.get_by_text("During the outage: are you there")).to_be_visible()
    finally:
        postgres.start()

    assert "/login" not in page.url, f"signed out by the outage; failed requests: {errors}"
    page.get_by_role("button", name="Retry").last.click()
    expect(page.get_by_text("You said: During the outage: are you there")).to_be_visible(
        timeout=30_000
    )
    humans = [
        m.content for m in checkpoint_messages(server.database_url, thread_id) if m.type == "human"
    ]
    assert humans == ["Before the outage: hello", "During the outage: are you there"]

    # Reopened later: the message and its answer are in the stored conversation.
    page.reload()
    page.locator("#chat-input").wait_for()
    expect(page.get_by_text("During the outage: are you there").first).to_be_visible()
    expect(page.get_by_text("You said: During the outage: are you there")).to_be_visible()
    page.context.close()
