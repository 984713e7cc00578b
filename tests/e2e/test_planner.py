"""In real Chromium: a churn question becomes a plan you edit and approve (across a reload and a
server restart), then progress, a table and a chart."""

from __future__ import annotations

import re

import psycopg
import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import login, wait_until_connected

pytestmark = pytest.mark.e2e

THREAD_URL = re.compile(r".*/thread/([0-9a-f-]{36})$")
GOAL = "Which region had the highest churn last quarter?"
EDITED_STEPS = [
    "List the tables available in the analytics database",
    "Count churned customers and lost MRR by region for the latest quarter in churn_events",
]


def send(page, text: str) -> None:
    page.locator("#chat-input").fill(text)
    page.keyboard.press("Enter")


def choose_planner(page) -> None:
    page.locator("#chat-profiles").click()
    page.locator('[data-test="select-item:Planner"]').click()
    expect(page.locator("#chat-profiles")).to_contain_text("Planner")
    wait_until_connected(page)


def plan_summaries(database_url: str) -> list[dict]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute("SELECT value FROM store WHERE prefix LIKE '%%.plans'").fetchall()
    return [r[0] for r in rows]


def demo_churn_rows(database_url: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM analytics_demo.churn_events").fetchone()
    assert row is not None
    return int(row[0])


def test_plan_edit_approve_progress_and_an_answer_with_table_and_chart(app_server, browser):
    churn_rows = demo_churn_rows(app_server.database_url)
    page = login(browser, app_server, "alice")
    choose_planner(page)
    send(page, GOAL)

    expect(page.get_by_text("Proposed plan").last).to_be_visible()
    expect(page.get_by_text("Step budget: 6 steps").last).to_be_visible()
    expect(page.get_by_text("Describe the columns of the churn_events table").last).to_be_visible()
    page.wait_for_url(THREAD_URL)

    # Reloading mid-review brings the pending plan back with buttons that still work.
    page.reload()
    page.locator("#chat-input").wait_for()
    page.wait_for_timeout(1500)  # the browser may resume the thread twice; let it settle
    expect(page.get_by_role("button", name="Edit")).to_have_count(1)
    page.get_by_role("button", name="Edit").click()
    expect(page.get_by_text("Send the plan as you want it").last).to_be_visible()
    send(page, "\n".join(f"{i}. {step}" for i, step in enumerate(EDITED_STEPS, 1)))

    # The redraft comes back for review with the reviewer's steps and one edit fewer.
    expect(page.get_by_text("2 edits left").last).to_be_visible()
    redraft = page.get_by_text("Proposed plan").last.locator("xpath=ancestor::*[3]")
    expect(redraft).not_to_contain_text("Describe the columns")
    thread_url = page.url

    # A server restart mid-review: reopening the conversation shows the plan and its buttons.
    page.context.close()
    app_server.restart()
    page = login(browser, app_server, "alice")
    page.goto(thread_url)
    expect(page.get_by_text("2 edits left").last).to_be_visible()
    page.wait_for_timeout(1000)  # the browser may resume the thread twice; one set of buttons stays
    expect(page.get_by_role("button", name="Approve")).to_have_count(1)
    page.get_by_role("button", name="Approve").click()

    # Progress: each executed step shows up as its own collapsible step, the task list ends Done.
    expect(page.get_by_text("Step 1: List the tables available").last).to_be_visible()
    expect(page.get_by_text(f"Step 2: {EDITED_STEPS[1]}").last).to_be_visible()
    expect(page.locator("aside.tasklist")).to_contain_text("Done", timeout=30_000)
    expect(page.locator("aside.tasklist")).to_contain_text(EDITED_STEPS[1])
    # Each step counts itself the way the task list does: the second one is "2 of 6".
    page.get_by_text(f"Step 2: {EDITED_STEPS[1]}").last.click()
    expect(
        page.get_by_text(re.compile(r"^\d+ row\(s\) returned · 2 of 6 steps used"))
    ).to_be_visible()

    # The answer: a rendered table with every region, and a chart of it.
    answer = page.get_by_text("Here is what the plan found").last
    expect(answer).to_be_visible()
    table = page.locator("table").last
    for region in ("North America", "EMEA", "APAC", "LATAM"):
        expect(table).to_contain_text(region)
    expect(page.locator(".js-plotly-plot").last).to_be_visible(timeout=30_000)
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)  # answered: buttons gone
    expect(page.locator("aside.tasklist")).to_contain_text("Done · 2 of 6 steps used")

    # Reopened later, the finished plan's task list and why it stopped come back with it.
    page.reload()
    page.locator("#chat-input").wait_for()
    expect(page.locator("aside.tasklist")).to_contain_text("Done · 2 of 6 steps used")
    expect(page.locator("aside.tasklist")).to_contain_text(EDITED_STEPS[1])
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)

    # The plan was remembered for alice (structure and outcome, no rows); no data changed.
    summaries = plan_summaries(app_server.database_url)
    assert [s["outcome"] for s in summaries] == ["answered"]
    assert summaries[0]["steps"] == EDITED_STEPS
    assert demo_churn_rows(app_server.database_url) == churn_rows
    page.context.close()
