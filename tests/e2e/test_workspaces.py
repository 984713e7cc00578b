"""In real Chromium: a team made on the workspace page, joined by an invitation link, managed by
its owner, and walled off from anyone who is not a live member of it.

Two team workspaces (alice is in both) and bob, who joins one: every route of the other, and of
the joined one beyond a member's view, answers exactly as a made-up workspace does. Disabling
bob ends his session at once and takes the team's conversations from him.
"""

from __future__ import annotations

import re

import httpx
import psycopg
import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import login, wait_until_connected

pytestmark = pytest.mark.e2e

THREAD_URL = re.compile(r".*/thread/([0-9a-f-]{36})$")
MADE_UP = "w-" + "0" * 32


def _api(page, server) -> httpx.Client:
    """The page's session, spoken by hand as a script would (with the page's request header)."""
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    headers = {"Origin": server.url, "X-Cairn-Request": "1"}
    return httpx.Client(base_url=server.url, cookies=cookies, headers=headers)


def _create_team(page, name: str) -> str:
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_role("button", name="Create team").click()
    expect(page.get_by_text(f"Created {name}; you are working in it.")).to_be_visible()
    expect(page.locator("#team-name-shown")).to_have_text(name)
    return str(page.locator("#switch").input_value())


def _refused_like_missing(api: httpx.Client, team: str) -> None:
    """Every workspace route answers for `team` exactly as for a workspace that does not exist."""
    for method, route, body in [
        ("GET", "", None),
        ("GET", "/audit", None),
        ("POST", "/invites", {"role": "member"}),
        ("POST", "/members/x/role", {"role": "owner"}),
        ("POST", "/members/x/disable", {"disabled": True}),
        ("POST", "/retention", {"days": 1}),
        ("POST", "/leave", None),
    ]:
        theirs = api.request(method, f"/api/workspaces/{team}{route}", json=body)
        missing = api.request(method, f"/api/workspaces/{MADE_UP}{route}", json=body)
        assert theirs.status_code == missing.status_code == 404, (route, theirs.text)
        assert theirs.json() == missing.json()
    switched = api.post("/api/workspaces/switch", json={"workspace_id": team})
    assert switched.status_code == 404
    assert (
        switched.json() == api.post("/api/workspaces/switch", json={"workspace_id": MADE_UP}).json()
    )


def _thread_workspace(database_url: str, thread_id: str) -> str | None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT workspace_id FROM cairn_threads WHERE thread_id = %s", (thread_id,)
        ).fetchone()
    assert row is not None
    return row[0]


def test_a_team_is_made_joined_managed_and_walled_off(app_server, browser) -> None:
    alice = login(browser, app_server, "alice")
    alice.get_by_role("link", name="Workspace").click()
    expect(alice.get_by_role("heading", name="Workspaces")).to_be_visible()
    other = _create_team(alice, "Back office")
    team = _create_team(alice, "Field team")
    assert other != team

    alice.locator("#retention-days").fill("30")
    alice.get_by_role("button", name="Save retention").click()
    expect(alice.get_by_text("inactive conversations are deleted after 30 days")).to_be_visible()
    with _api(alice, app_server) as api:
        too_long = api.post(f"/api/workspaces/{team}/retention", json={"days": 99999})
        assert too_long.status_code == 422

    alice.locator("#invite-role").select_option("member")
    alice.get_by_role("button", name="Make an invitation").click()
    link = alice.locator("#new-invite-link")
    expect(link).to_contain_text("/workspace#join=cairn_inv_")
    invitation = str(link.text_content())

    bob = login(browser, app_server, "bob")
    with _api(bob, app_server) as api:
        # Before joining: neither team exists for bob.
        _refused_like_missing(api, team)
        _refused_like_missing(api, other)
        # A client cannot name a role or a user for itself; a made-up code joins nothing.
        made_up = api.post("/api/workspaces/join", json={"code": "cairn_inv_" + "x" * 32})
        assert made_up.status_code == 404
        assert "not valid" in made_up.json()["detail"]

    bob.goto(invitation)
    expect(bob.get_by_text("Press Join to accept the invitation.")).to_be_visible()
    assert "join=" not in bob.url  # the code leaves the address bar and history
    bob.get_by_role("button", name="Join").click()
    expect(bob.get_by_text("You joined Field team as member.")).to_be_visible()
    expect(bob.locator("#members")).to_contain_text("member")
    expect(bob.locator("#manage")).to_be_hidden()

    with _api(bob, app_server) as api:
        # The same link twice joins nobody twice.
        again = api.post("/api/workspaces/join", json={"code": invitation.split("#join=")[1]})
        assert again.status_code == 404
        # A member sees the members, not the invitations, usage or audit log ...
        details = api.get(f"/api/workspaces/{team}").json()
        assert {"invites", "usage"}.isdisjoint(details)
        assert api.get(f"/api/workspaces/{team}/audit").status_code == 404
        # ... and cannot manage: each answers as for a workspace that does not exist.
        for route, body in [
            ("/invites", {"role": "admin"}),
            ("/members/x/role", {"role": "owner"}),
            ("/members/x/disable", {"disabled": True}),
            ("/retention", {"days": 1}),
        ]:
            mine = api.post(f"/api/workspaces/{team}{route}", json=body)
            missing = api.post(f"/api/workspaces/{MADE_UP}{route}", json=body)
            assert mine.status_code == missing.status_code == 404
        # The team bob is not in stays missing; without the page header nothing changes.
        _refused_like_missing(api, other)
        scripted = httpx.post(
            f"{app_server.url}/api/workspaces/switch",
            json={"workspace_id": team},
            cookies={c["name"]: c["value"] for c in bob.context.cookies()},
        )
        assert scripted.status_code == 403

    # Bob's new conversation belongs to the team he works in.
    bob.goto(app_server.url)
    wait_until_connected(bob)
    bob.locator("#chat-input").fill("team canary 5512")
    bob.keyboard.press("Enter")
    expect(bob.get_by_text("You said: team canary 5512")).to_be_visible(timeout=60_000)
    bob.wait_for_url(THREAD_URL)
    thread_id = THREAD_URL.match(bob.url).group(1)
    assert _thread_workspace(app_server.database_url, thread_id) == team

    # Alice, the owner, sees him and disables him: his session ends at once.
    alice.reload()
    member = alice.locator("#members li", has_text="member")
    expect(member).to_be_visible()
    member.get_by_role("button", name="Disable").click()
    expect(alice.get_by_text("is disabled; their sessions ended.")).to_be_visible()
    # His open tab loses its connection at once and lands on the sign-in page.
    expect(bob).to_have_url(re.compile(r"/login"), timeout=30_000)
    with _api(bob, app_server) as api:
        assert api.get("/api/workspaces").status_code == 401

    # Signed in again, bob has only his personal workspace and not the team's conversation.
    bob.context.close()
    bob = login(browser, app_server, "bob")
    with _api(bob, app_server) as api:
        listed = api.get("/api/workspaces").json()
        assert [w["personal"] for w in listed["workspaces"]] == [True]
        _refused_like_missing(api, team)
        gone = api.get(f"/project/thread/{thread_id}")
        missing = api.get("/project/thread/00000000-0000-4000-8000-000000000000")
        assert gone.status_code == missing.status_code == 404
        assert gone.json() == missing.json()
        listed = api.post("/project/threads", json={"pagination": {"first": 50}, "filter": {}})
        assert listed.status_code == 200
        assert thread_id not in [t["id"] for t in listed.json()["data"]]
        # A link made before he was disabled does not bring him back.
    with _api(alice, app_server) as api:
        fresh = api.post(f"/api/workspaces/{team}/invites", json={"role": "member"}).json()
    with _api(bob, app_server) as api:
        rejoin = api.post("/api/workspaces/join", json={"code": fresh["code"]})
        assert rejoin.status_code == 404

    # The audit log tells the owner what happened, in order.
    alice.reload()
    audit = alice.locator("#audit")
    for action in ("workspace.created", "invite.created", "invite.accepted", "member.disabled"):
        expect(audit).to_contain_text(action)
    with _api(alice, app_server) as api:
        actions = [e["action"] for e in api.get(f"/api/workspaces/{team}/audit").json()["entries"]]
    assert actions.index("member.disabled") < actions.index("invite.accepted")  # newest first
    alice.context.close()
    bob.context.close()


@pytest.fixture(scope="module")
def groups_server(pg_server_url: str):
    import tempfile
    from pathlib import Path

    from tests.conftest import create_database
    from tests.e2e.conftest import AppServer

    with tempfile.TemporaryDirectory(prefix="cairn-e2e-groups-") as folder:
        server = AppServer(
            database_url=create_database(pg_server_url),
            data_dir=Path(folder),
            extra_env={
                "CAIRN_OIDC_GROUPS": "eng=Engineering:member,eng-leads=Engineering:admin",
                "CAIRN_LOCAL_GROUPS": "alice=eng|eng-leads,bob=eng",
            },
        )
        server.start()
        try:
            yield server
        finally:
            server.stop()


def test_the_sign_ins_groups_claim_makes_the_mapped_team_memberships(
    groups_server, browser
) -> None:
    alice = login(browser, groups_server, "alice")
    bob = login(browser, groups_server, "bob")
    with _api(alice, groups_server) as api:
        teams = [w for w in api.get("/api/workspaces").json()["workspaces"] if not w["personal"]]
        assert [(w["name"], w["role"]) for w in teams] == [("Engineering", "admin")]
        team = teams[0]["id"]
        log = api.get(f"/api/workspaces/{team}/audit").json()["entries"]
        assert {e["action"] for e in log} == {"oidc.joined"}
    with _api(bob, groups_server) as api:
        teams = [w for w in api.get("/api/workspaces").json()["workspaces"] if not w["personal"]]
        assert [(w["id"], w["role"]) for w in teams] == [(team, "member")]
        # A member's client cannot lift its own role: roles come from the claim, not the client.
        lifted = api.post(f"/api/workspaces/{team}/members/x/role", json={"role": "admin"})
        assert lifted.status_code == 404
    alice.context.close()
    bob.context.close()
