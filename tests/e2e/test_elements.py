"""In real Chromium: a Planner chart, a research report's files and an Assistant upload come back
under the same messages after a reload and after a server restart, for their owner only."""

from __future__ import annotations

import re

import psycopg
import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import login
from tests.e2e.test_planner import EDITED_STEPS, GOAL, choose_planner
from tests.e2e.test_research import QUESTION, research_page

pytestmark = pytest.mark.e2e

THREAD_URL = re.compile(r".*/thread/([0-9a-f-]{36})$")
UPLOAD = "trip-notes.txt"
UPLOAD_TEXT = b"Train to Porto at 9:40, hotel near the river.\n"
MEMORY_NOTE = re.compile(r"^Memory: ")
"""The note under the reply (what the memory tools decided with an attachment beside the message)."""


def send(page, text: str) -> None:
    page.locator("#chat-input").fill(text)
    page.keyboard.press("Enter")


def watch_errors(page, errors: list[str]) -> None:
    page.on("pageerror", lambda exc: errors.append(f"{page.url}: {exc} {exc.stack}"))


def stored_keys(database_url: str) -> dict[str, str]:
    """Element name -> object key of every element whose bytes are kept."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            'SELECT e.name, f.object_key FROM cairn_element_files f JOIN "Element" e '
            'ON e."objectKey" = f.object_key'
        ).fetchall()
    return {name: key for name, key in rows}


def planner_chart(browser, app_server, errors: list[str]) -> str:
    page = login(browser, app_server, "alice")
    watch_errors(page, errors)
    choose_planner(page)
    send(page, GOAL)
    page.get_by_role("button", name="Edit").click()
    expect(page.get_by_text("Send the plan as you want it").last).to_be_visible()
    send(page, "\n".join(f"{i}. {step}" for i, step in enumerate(EDITED_STEPS, 1)))
    expect(page.get_by_text("2 edits left").last).to_be_visible()
    page.get_by_role("button", name="Approve").click()
    expect(page.locator(".js-plotly-plot").last).to_be_visible(timeout=60_000)
    page.wait_for_url(THREAD_URL)
    url = page.url
    page.context.close()
    return url


def research_report(browser, app_server, errors: list[str]) -> str:
    page = research_page(browser, app_server, "alice")
    watch_errors(page, errors)
    send(page, QUESTION)
    page.get_by_role("button", name="Approve").click()
    expect(page.get_by_text("final_report.pdf").last).to_be_visible(timeout=120_000)
    page.wait_for_url(THREAD_URL)
    url = page.url
    page.context.close()
    return url


def assistant_upload(browser, app_server, errors: list[str], tmp_path) -> str:
    page = login(browser, app_server, "alice")
    watch_errors(page, errors)
    upload = tmp_path / UPLOAD
    upload.write_bytes(UPLOAD_TEXT)
    page.locator("input[type=file]").first.set_input_files(str(upload))
    expect(page.get_by_text(UPLOAD).last).to_be_visible()
    send(page, "remember that I like jazz")
    expect(page.get_by_text(MEMORY_NOTE).last).to_be_visible(timeout=60_000)
    page.wait_for_url(THREAD_URL)
    url = page.url
    page.context.close()
    return url


def reopen(browser, app_server, url: str, errors: list[str]):
    page = login(browser, app_server, "alice")
    watch_errors(page, errors)
    page.goto(url)
    page.locator("#chat-input").wait_for()
    return page


def shows_the_same_elements(page, kind: str, tmp_path) -> None:
    if kind == "planner":
        expect(page.locator(".js-plotly-plot").last).to_be_visible(timeout=30_000)
        expect(page.get_by_text("Here is what the plan found").last).to_be_visible()
    elif kind == "research":
        expect(page.get_by_text("final_report.pdf").last).to_be_visible()
        with page.expect_download() as download:
            page.get_by_text("final_report.md").last.click()
        saved = tmp_path / "reopened_report.md"
        download.value.save_as(saved)
        assert saved.read_text().startswith("# When did the seed vault open")
    else:
        expect(page.get_by_text(UPLOAD).last).to_be_visible()
        expect(page.get_by_text(MEMORY_NOTE).last).to_be_visible()


def test_what_a_reply_showed_comes_back_after_a_reload_and_a_restart(
    app_server, browser, tmp_path
) -> None:
    errors: list[str] = []
    threads = {
        "planner": planner_chart(browser, app_server, errors),
        "research": research_report(browser, app_server, errors),
        "assistant": assistant_upload(browser, app_server, errors, tmp_path),
    }
    keys = stored_keys(app_server.database_url)
    assert {"final_report.md", "final_report.pdf", UPLOAD} <= set(keys)

    for kind, url in threads.items():
        page = reopen(browser, app_server, url, errors)
        shows_the_same_elements(page, kind, tmp_path)
        page.reload()
        page.locator("#chat-input").wait_for()
        shows_the_same_elements(page, kind, tmp_path)
        page.context.close()

    app_server.restart()
    for kind, url in threads.items():
        page = reopen(browser, app_server, url, errors)
        shows_the_same_elements(page, kind, tmp_path)
        page.context.close()

    # The bytes are alice's: bob (signed in) gets what a missing element gets.
    alice = login(browser, app_server, "alice")
    bob = login(browser, app_server, "bob")
    watch_errors(alice, errors)
    watch_errors(bob, errors)
    upload_url = f"{app_server.url}/elements/{keys[UPLOAD]}"
    mine = alice.request.get(upload_url)
    assert mine.status == 200
    assert mine.body() == UPLOAD_TEXT
    theirs = bob.request.get(upload_url)
    missing = bob.request.get(re.sub(r"[0-9a-f]{12}$", "0" * 12, upload_url))
    assert theirs.status == missing.status == 404
    alice.context.close()
    bob.context.close()
    assert errors == [], "\n".join(errors)
