"""In real Chromium: sign in through the bundled OIDC provider, chat with streaming, resume after a restart."""

from __future__ import annotations

import json
import re

import httpx
import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from playwright.sync_api import expect

from graphs.assistant.graph import build_graph
from graphs.core.offline import OfflineChatModel
from tests.e2e.conftest import login, wait_until_connected

pytestmark = pytest.mark.e2e

THREAD_URL = re.compile(r".*/thread/([0-9a-f-]{36})$")


def checkpoint_messages(database_url: str, thread_id: str) -> list:
    """The thread's messages as the graph reads them from its Postgres checkpoints."""
    with psycopg.connect(database_url, autocommit=True, prepare_threshold=0) as conn:
        graph = build_graph(checkpointer=PostgresSaver(conn), store=None, model=OfflineChatModel())
        state = graph.get_state({"configurable": {"thread_id": thread_id}})
    return list(state.values.get("messages", []))


def send(page, text: str) -> None:
    page.locator("#chat-input").fill(text)
    page.keyboard.press("Enter")


def test_login_then_reply_streams(app_server, browser):
    page = login(browser, app_server, "alice")
    frames: list[str] = []
    page.on("websocket", lambda ws: ws.on("framereceived", lambda f: frames.append(str(f))))
    # The socket opened during login; reconnect so the listener sees this page's socket.
    page.reload()
    page.locator("#chat-input").wait_for()
    wait_until_connected(page)

    send(page, "Streaming check: one two three four five")

    expect(page.get_by_text("You said: Streaming check: one two three four five")).to_be_visible()
    # The first word opens the stream at once; the rest of a burst is coalesced
    # (ui.surface.STREAM_WINDOW_S, tests/unit/test_reply_stream.py) and the final step is whole.
    events = [json.loads(f[2:]) for f in frames if f.startswith("42[")]
    opened = [e[1]["output"] for e in events if e[0] == "stream_start"]
    final = [e[1]["output"] for e in events if e[0] == "new_message"]
    reply = next(o for o in final if "You said: Streaming check" in o)
    assert any(o and reply.startswith(o) and o != reply for o in opened), (opened, reply)
    # Loading the page and chatting raised no error toast (the browser's own requests pass).
    assert [e for e in events if e[0] == "toast"] == []
    expect(page.get_by_text("Used Thinking")).to_be_visible()
    page.context.close()


def test_conversation_resumes_after_server_restart(app_server, browser):
    page = login(browser, app_server, "alice")
    send(page, "Note the word marigold for this chat")
    expect(page.get_by_text("You said: Note the word marigold")).to_be_visible()
    page.wait_for_url(THREAD_URL)
    thread_id = THREAD_URL.match(page.url).group(1)
    page.context.close()

    app_server.restart()

    page = login(browser, app_server, "alice")
    page.get_by_text("Note the word marigold for this chat").first.click()
    page.wait_for_url(f"**/thread/{thread_id}")
    page.locator("#chat-input").wait_for()
    expect(page.get_by_text("You said: Note the word marigold")).to_be_visible()
    send(page, "And a second message after the restart")
    expect(page.get_by_text("You said: And a second message after the restart")).to_be_visible()

    messages = checkpoint_messages(app_server.database_url, thread_id)
    assert [m.type for m in messages] == ["human", "ai", "human", "ai"]
    assert "marigold" in messages[0].content
    page.context.close()


def test_oversize_message_is_refused_and_nothing_is_stored(app_server, browser):
    page = login(browser, app_server, "bob")
    send(page, "short hello")
    expect(page.get_by_text("You said: short hello")).to_be_visible()
    page.wait_for_url(THREAD_URL)
    thread_id = THREAD_URL.match(page.url).group(1)

    send(page, "x" * 8001)

    expect(page.get_by_text("the limit is 8,000")).to_be_visible()
    messages = checkpoint_messages(app_server.database_url, thread_id)
    assert [m.type for m in messages] == ["human", "ai"]
    send(page, "still working?")
    expect(page.get_by_text("You said: still working?")).to_be_visible()
    page.context.close()


def test_deleting_a_conversation_removes_its_checkpoints_and_owner_record(app_server, browser):
    page = login(browser, app_server, "alice")
    send(page, "Note the word heliotrope here")
    expect(page.get_by_text("You said: Note the word heliotrope here")).to_be_visible()
    page.wait_for_url(THREAD_URL)
    thread_id = THREAD_URL.match(page.url).group(1)
    assert checkpoint_messages(app_server.database_url, thread_id)

    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    with httpx.Client(
        base_url=app_server.url, cookies=cookies, headers={"Origin": app_server.url}
    ) as api:
        assert (
            api.request("DELETE", "/project/thread", json={"threadId": thread_id}).status_code
            == 200
        )
        assert api.get(f"/project/thread/{thread_id}").status_code == 404

    assert checkpoint_messages(app_server.database_url, thread_id) == []
    with psycopg.connect(app_server.database_url, autocommit=True) as conn:
        owners = conn.execute(
            "SELECT count(*) FROM cairn_threads WHERE thread_id = %s", (thread_id,)
        ).fetchone()[0]
        writes = conn.execute(
            "SELECT count(*) FROM checkpoint_writes WHERE thread_id = %s", (thread_id,)
        ).fetchone()[0]
    assert owners == 0
    assert writes == 0
    page.context.close()


def test_a_refused_file_type_is_explained_in_words_not_mime_types(app_server, browser, tmp_path):
    page = login(browser, app_server, "alice")
    picture = tmp_path / "holiday.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)

    page.locator("input[type=file]").first.set_input_files(str(picture))

    refusal = page.get_by_text("Cairn cannot read that kind of file").last
    expect(refusal).to_be_visible()
    expect(refusal).to_contain_text("You can attach text (.txt), Markdown (.md), CSV (.csv)")
    expect(page.get_by_text("text/plain")).to_have_count(0)
    page.context.close()


def test_enter_confirms_a_rename_in_the_sidebar(app_server, browser):
    page = login(browser, app_server, "alice")
    page.locator("#chat-input").fill("a conversation to rename by keyboard")
    page.keyboard.press("Enter")
    expect(page.get_by_text("You said: a conversation to rename by keyboard")).to_be_visible()
    page.wait_for_url(re.compile(r".*/thread/[0-9a-f-]{36}$"))
    item = page.locator("#thread-history a, #thread-history li", has_text="rename by keyboard")
    expect(item.first).to_be_visible(timeout=20_000)
    item.first.hover()
    item.first.locator("#thread-options").click()
    page.locator("#rename-thread").click()
    name = page.locator('[role="dialog"] input#name')
    name.fill("Renamed with Enter")
    name.press("Enter")
    expect(page.get_by_role("dialog")).to_have_count(0)
    expect(page.get_by_text("Renamed with Enter").first).to_be_visible()
    page.reload()
    expect(page.get_by_text("Renamed with Enter").first).to_be_visible(timeout=20_000)
    page.context.close()
