"""In real Chromium: a team that wants a reviewer for Planner plans. Bob's plan waits; he
cannot approve it himself; Carol, the team's reviewer, approves it from the queue, and the run
goes on in Bob's open chat with who decided and when. Nobody else reaches the queue or a
decision, and a decision is taken once."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import login, wait_until_connected

pytestmark = pytest.mark.e2e

THREAD_URL = re.compile(r".*/thread/([0-9a-f-]{36})$")
GOAL = "Which region had the highest churn last quarter?"


def _api(page, server) -> httpx.Client:
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    headers = {"Origin": server.url, "X-Cairn-Request": "1"}
    return httpx.Client(base_url=server.url, cookies=cookies, headers=headers, timeout=30)


def _invite(page, role: str) -> str:
    page.locator("#invite-role").select_option(role)
    page.get_by_role("button", name="Make an invitation").click()
    expect(page.get_by_text(f"Invitation for a {role} made.")).to_be_visible()
    return str(page.locator("#new-invite-link").text_content())


def _join(browser, server, user: str, link: str):
    page = login(browser, server, user)
    page.goto(link)
    page.get_by_role("button", name="Join").click()
    expect(page.get_by_text("You joined Ops as")).to_be_visible()
    return page


def test_a_reviewer_approves_a_members_plan_and_the_run_goes_on(app_server, browser) -> None:
    alice = login(browser, app_server, "alice")
    alice.goto(f"{app_server.url}/workspace")
    alice.get_by_label("Name", exact=True).fill("Ops")
    alice.get_by_role("button", name="Create team").click()
    expect(alice.locator("#team-name-shown")).to_have_text("Ops")
    alice.get_by_label("Planner").check()
    alice.get_by_role("button", name="Save approval settings").click()
    expect(alice.get_by_text("Approval settings saved.")).to_be_visible()
    member_link, reviewer_link = _invite(alice, "member"), _invite(alice, "reviewer")

    bob = _join(browser, app_server, "bob", member_link)
    carol = _join(browser, app_server, "carol", reviewer_link)
    expect(carol.get_by_role("link", name="open the plans waiting for review")).to_be_visible()

    bob.goto(app_server.url)
    wait_until_connected(bob)
    bob.locator("#chat-profiles").click()
    bob.locator('[data-test="select-item:Planner"]').click()
    wait_until_connected(bob)
    bob.locator("#chat-input").fill(GOAL)
    bob.keyboard.press("Enter")
    expect(bob.get_by_text("Proposed plan").last).to_be_visible(timeout=60_000)
    expect(bob.get_by_text("this one is in the reviewers' queue").last).to_be_visible()
    bob.wait_for_url(THREAD_URL)
    bob.get_by_role("button", name="Approve").click()
    expect(bob.get_by_text("you cannot approve it yourself").last).to_be_visible()

    # Carol sees the plan and who asked; the owner and the requester do not reach the queue.
    carol.goto(f"{app_server.url}/review")
    waiting = carol.locator("#pending li", has_text="Planner plan from bob")
    expect(waiting).to_be_visible()
    expect(waiting).to_contain_text(GOAL)
    with _api(carol, app_server) as api:
        [pending] = api.get("/api/reviews").json()["pending"]
    for page in (alice, bob):
        with _api(page, app_server) as api:
            assert api.get("/api/reviews").status_code == 404
            mine = api.post(f"/api/reviews/{pending['id']}/decide", json={"decision": "approve"})
            made_up = api.post("/api/reviews/rv-000000/decide", json={"decision": "approve"})
            assert mine.status_code == made_up.status_code == 404
            assert mine.json() == made_up.json()

    waiting.get_by_role("button", name="Approve").click()
    expect(carol.get_by_text("Approved: the run goes on for bob.")).to_be_visible()
    with _api(carol, app_server) as api:
        again = api.post(f"/api/reviews/{pending['id']}/decide", json={"decision": "reject"})
        assert again.status_code == 409
        assert "decided this plan first" in again.json()["detail"]

    # The run goes on in Bob's open chat, saying who decided; it is there again after a reload.
    expect(bob.get_by_text("Approved by carol (reviewer) on").last).to_be_visible(timeout=30_000)
    expect(bob.locator(".js-plotly-plot").last).to_be_visible(timeout=90_000)
    bob.reload()
    expect(bob.get_by_text("Approved by carol (reviewer) on").last).to_be_visible(timeout=30_000)
    expect(bob.get_by_text("Here is what the plan found").last).to_be_visible()

    with _api(alice, app_server) as api:
        team = api.get("/api/workspaces").json()["active"]["id"]
        actions = [e["action"] for e in api.get(f"/api/workspaces/{team}/audit").json()["entries"]]
    assert actions.index("review.approve") < actions.index("review.requested")  # newest first

    # The approved plan is now the team's example: every member sees it, without its author;
    # only the owner (or an admin) deletes it.
    carol.goto(f"{app_server.url}/workspace")
    entry = carol.locator("#gallery li", has_text="by a member")
    expect(entry).to_be_visible()
    expect(entry.get_by_role("button", name="Delete")).to_have_count(0)
    alice.goto(f"{app_server.url}/workspace")
    entry = alice.locator("#gallery li", has_text="by a member")
    expect(entry).to_contain_text("churn")
    alice.once("dialog", lambda dialog: dialog.accept())
    entry.get_by_role("button", name="Delete").click()
    expect(alice.get_by_text("Plan deleted from the gallery.")).to_be_visible()
    expect(alice.locator("#gallery")).to_contain_text("No approved plans yet.")
    for page in (alice, bob, carol):
        page.context.close()


@pytest.fixture(scope="module")
def two_workers(pg_server_url: str):
    """Two workers on one database, each with its own data folder, sharing the auth secret."""
    import secrets
    import tempfile
    from pathlib import Path

    from tests.conftest import create_database
    from tests.e2e.conftest import AppServer

    url = create_database(pg_server_url)
    secret = secrets.token_urlsafe(48)
    with (
        tempfile.TemporaryDirectory(prefix="cairn-rv1-") as one,
        tempfile.TemporaryDirectory(prefix="cairn-rv2-") as two,
    ):
        servers = [
            AppServer(database_url=url, data_dir=Path(d), extra_env={"CAIRN_AUTH_SECRET": secret})
            for d in (one, two)
        ]
        try:
            for server in servers:  # one after the other: the first creates the schema
                server.start()
            yield servers
        finally:
            for server in servers:
                server.stop()


def test_a_decision_on_another_worker_is_told_in_the_requesters_open_chat(
    two_workers, browser
) -> None:
    here, there = two_workers
    alice = login(browser, here, "alice")
    with _api(alice, here) as api:
        team = api.post("/api/workspaces", json={"name": "Ops"}).json()["active"]["id"]
        saved = api.post(f"/api/workspaces/{team}/settings", json={"review": {"planner": True}})
        assert saved.status_code == 200
        member = api.post(f"/api/workspaces/{team}/invites", json={"role": "member"}).json()
        reviewer = api.post(f"/api/workspaces/{team}/invites", json={"role": "reviewer"}).json()
    bob = login(browser, here, "bob")
    carol = login(browser, there, "carol")
    for page, server, invite in ((bob, here, member), (carol, there, reviewer)):
        with _api(page, server) as api:
            assert (
                api.post("/api/workspaces/join", json={"code": invite["code"]}).status_code == 200
            )

    bob.goto(here.url)
    wait_until_connected(bob)
    bob.locator("#chat-profiles").click()
    bob.locator('[data-test="select-item:Planner"]').click()
    wait_until_connected(bob)
    bob.locator("#chat-input").fill(GOAL)
    bob.keyboard.press("Enter")
    expect(bob.get_by_text("this one is in the reviewers' queue").last).to_be_visible(
        timeout=60_000
    )
    bob.wait_for_url(THREAD_URL)

    # Carol decides on the other worker; Bob's open chat here hears of it at once.
    with _api(carol, there) as api:
        [pending] = api.get("/api/reviews").json()["pending"]
        decided = api.post(f"/api/reviews/{pending['id']}/decide", json={"decision": "approve"})
        assert decided.status_code == 200
    expect(bob.get_by_text("reload this conversation to follow it").last).to_be_visible(
        timeout=20_000
    )
    expect(bob.get_by_text("Approved by carol (reviewer) on").last).to_be_visible()
    # The run went on on the other worker, into the stored conversation.
    for _ in range(30):
        bob.reload()
        bob.locator("#chat-input").wait_for()
        if bob.get_by_text("Here is what the plan found").count():
            break
        bob.wait_for_timeout(2000)
    expect(bob.get_by_text("Here is what the plan found").last).to_be_visible()
    expect(bob.get_by_text("Approved by carol (reviewer) on").last).to_be_visible()
    for page in (alice, bob, carol):
        page.context.close()
