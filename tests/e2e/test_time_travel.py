"""In real Chromium: edit an earlier message and the conversation forks from before it; the
support view (history, state, fork with a reason, audit) for the support role only."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from langchain_core.messages import HumanMessage
from playwright.sync_api import expect

from tests.conftest import create_database
from tests.e2e.conftest import AppServer, login
from tests.e2e.test_chat import THREAD_URL, checkpoint_messages, send

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def support_server(pg_server_url: str) -> Iterator[AppServer]:
    """The app with bob as support: his id exists once the seeded accounts do, so it starts,
    reads it, and starts again with CAIRN_SUPPORT_USERS set."""
    with tempfile.TemporaryDirectory(prefix="cairn-e2e-") as folder:
        server = AppServer(database_url=create_database(pg_server_url), data_dir=Path(folder))
        server.start()
        try:
            with psycopg.connect(server.database_url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT subject FROM local_accounts WHERE username = 'bob'"
                ).fetchone()
            assert row is not None
            server.extra_env["CAIRN_SUPPORT_USERS"] = f"cairn:{row[0]}"
            server.restart()
            yield server
        finally:
            server.stop()


def user_message(page, text: str):
    return page.locator(".step", has=page.get_by_text(text, exact=True)).last


def test_editing_an_earlier_message_forks_the_conversation(support_server, browser):
    page = login(browser, support_server, "alice")
    for text in ("first message one", "second message two", "third message three"):
        send(page, text)
        expect(page.get_by_text(f"You said: {text}")).to_be_visible()
    page.wait_for_url(THREAD_URL)
    thread_id = THREAD_URL.match(page.url).group(1)  # type: ignore[union-attr]

    message = page.get_by_text("second message two", exact=True)
    message.hover()
    page.locator(".edit-message:visible").first.click()
    page.locator("#edit-chat-input").fill("second message EDITED")
    page.locator(".confirm-edit").click()

    expect(page.get_by_text("You said: second message EDITED")).to_be_visible()
    expect(page.get_by_text("third message three", exact=True)).to_have_count(0)
    expect(page.get_by_text("You said: third message three")).to_have_count(0)
    # The model saw only the live branch: the thread's state holds nothing of the old one.
    messages = checkpoint_messages(support_server.database_url, thread_id)
    assert [m.text for m in messages if isinstance(m, HumanMessage)] == [
        "first message one",
        "second message EDITED",
    ]
    assert "three" not in " ".join(str(m.content) for m in messages)
    # The next message continues the new branch, and a reload shows only it.
    send(page, "fourth message four")
    expect(page.get_by_text("You said: fourth message four")).to_be_visible()
    page.reload()
    expect(page.get_by_text("You said: fourth message four")).to_be_visible()
    expect(page.get_by_text("third message three", exact=True)).to_have_count(0)
    messages = checkpoint_messages(support_server.database_url, thread_id)
    assert [m.text for m in messages if isinstance(m, HumanMessage)] == [
        "first message one",
        "second message EDITED",
        "fourth message four",
    ]
    # The old branch stays in the thread's checkpoints (for support).
    with psycopg.connect(support_server.database_url, autocommit=True) as conn:
        branches = conn.execute(
            "SELECT count(*) FROM checkpoints WHERE thread_id = %s AND metadata->>'step' = '3'",
            (thread_id,),
        ).fetchone()
    assert branches is not None
    assert branches[0] >= 2


def test_support_opens_history_and_forks_and_the_owner_sees_it(support_server, browser):
    alice = login(browser, support_server, "alice")
    send(alice, "Please help: <b>bold</b> question")
    expect(alice.get_by_text("You said: Please help:")).to_be_visible()
    alice.wait_for_url(THREAD_URL)
    thread_id = THREAD_URL.match(alice.url).group(1)  # type: ignore[union-attr]
    # Nobody but support reaches the pages: the owner gets the missing-thread answer.
    for url in ("/support", f"/support/threads/{thread_id}"):
        response = alice.request.get(f"{support_server.url}{url}")
        assert response.status == 404
        assert response.json() == {"detail": "Conversation not found"}

    bob = login(browser, support_server, "bob")
    bob.goto(f"{support_server.url}/support")
    bob.get_by_label("Conversation id").fill(thread_id)
    bob.get_by_role("button", name="Open its history").click()
    bob.wait_for_url(f"**/support/threads/{thread_id}")
    expect(bob.locator("#checkpoints")).to_contain_text("recall_memories")
    expect(bob.locator("#audit")).to_contain_text("history")
    # The checkpoint about to run the assistant: its state, escaped, then a replay fork.
    row = bob.locator("#checkpoints tr", has=bob.locator("td:nth-child(4)", has_text="assistant"))
    row.first.get_by_role("link").click()
    expect(bob.locator("#state")).to_contain_text("<b>bold</b>")
    expect(bob.locator("#state b")).to_have_count(0)
    bob.locator("#fork-reason").fill("Reproducing a reported bad answer")
    bob.get_by_role("button", name="Fork and resume").click()
    expect(bob.locator("#fork-status")).to_contain_text("Forked (done)")
    bob.goto(f"{support_server.url}/support/threads/{thread_id}")
    expect(bob.locator("#audit")).to_contain_text("Reproducing a reported bad answer")
    expect(bob.locator("#checkpoints")).to_contain_text("fork (update_state)")
    # Support cannot read memories: the memory API answers with bob's own (empty) data.
    mine = bob.request.get(f"{support_server.url}/api/memory").json()
    assert all(c["id"] != thread_id for c in mine["conversations"])

    # The owner sees that support opened and forked the conversation.
    alice.goto(f"{support_server.url}/memory")
    item = alice.locator(f'li.conversation[data-id="{thread_id}"]')
    expect(item).to_contain_text("opened by Cairn support")
    expect(item).to_contain_text("forked 1×")
    exported = alice.request.get(f"{support_server.url}/api/memory/export").json()
    actions = {r["action"] for r in exported["support_access"]}
    assert actions == {"history", "state", "fork"}
    alice.goto(f"{support_server.url}/thread/{thread_id}")
    expect(alice.get_by_text("Cairn support resumed this conversation")).to_be_visible()
    expect(alice.get_by_text("Cairn support opened this conversation's history")).to_be_visible()
    # Without the page's header the fork is refused.
    refused = httpx.post(
        f"{support_server.url}/support/threads/{thread_id}/checkpoints/x/fork",
        json={"reason": "no header here"},
        cookies={c["name"]: c["value"] for c in bob.context.cookies()},
    )
    assert refused.status_code == 403
