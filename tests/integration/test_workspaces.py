"""Workspaces on a real Postgres: membership is the only source of a role, and foreign looks missing."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest

from auth.ownership import ThreadNotFound, claim_thread, require_owner
from auth.workspaces import (
    ADMIN,
    MEMBER,
    OWNER,
    REVIEWER,
    WorkspaceNotFound,
    WorkspaceRefused,
    Workspaces,
    claimed_groups,
    group_rules,
    personal_id,
)
from graphs.core.persistence import Persistence

pytestmark = pytest.mark.integration


def user() -> str:
    return f"user-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def workspaces(persistence: Persistence) -> Workspaces:
    return Workspaces(persistence.pool)


async def test_a_new_user_has_only_their_personal_workspace(workspaces: Workspaces) -> None:
    alice = user()

    found = await workspaces.memberships(alice)

    assert [(m.workspace_id, m.role, m.personal) for m in found] == [
        (personal_id(alice), OWNER, True)
    ]
    assert (await workspaces.active(alice)).personal


async def test_an_invitation_joins_once_with_its_role(workspaces: Workspaces) -> None:
    alice, bob, carol = user(), user(), user()
    team = await workspaces.create(alice, "  Data   team ")
    code, _ = await workspaces.invite(team, REVIEWER)

    joined = await workspaces.accept(bob, code)

    assert (joined.workspace_id, joined.role, joined.name) == (
        team.workspace_id,
        REVIEWER,
        "Data team",
    )
    with pytest.raises(WorkspaceNotFound):
        await workspaces.accept(carol, code)  # single use
    with pytest.raises(WorkspaceNotFound):
        await workspaces.membership(carol, team.workspace_id)
    actions = [e["action"] for e in await workspaces.audit_log(team.workspace_id)]
    assert actions == ["invite.accepted", "invite.created", "workspace.created"]


async def test_two_users_racing_one_invitation_make_one_member(workspaces: Workspaces) -> None:
    alice = user()
    team = await workspaces.create(alice, "Race")
    code, _ = await workspaces.invite(team, MEMBER)
    racers = [user() for _ in range(6)]

    results = await asyncio.gather(
        *(workspaces.accept(r, code) for r in racers), return_exceptions=True
    )

    assert sum(not isinstance(r, Exception) for r in results) == 1
    assert all(isinstance(r, WorkspaceNotFound) for r in results if isinstance(r, Exception))
    assert len(await workspaces.members(team.workspace_id)) == 2


async def test_an_expired_or_made_up_code_is_refused_alike(
    workspaces: Workspaces, persistence: Persistence
) -> None:
    alice, bob = user(), user()
    team = await workspaces.create(alice, "Expiry")
    code, _ = await workspaces.invite(team, MEMBER, ttl=timedelta(minutes=5))
    async with persistence.pool.connection() as conn:
        await conn.execute(
            "UPDATE cairn_workspace_invites SET expires_at = now() - interval '1 second' "
            "WHERE workspace_id = %s",
            (team.workspace_id,),
        )

    for presented in (code, code + "x", "cairn_inv_made-up", "not-a-code", "x" * 5000):
        with pytest.raises(WorkspaceNotFound):
            await workspaces.accept(bob, presented)


async def test_only_managers_invite_and_only_owners_make_admins(workspaces: Workspaces) -> None:
    alice, bob, carol = user(), user(), user()
    team = await workspaces.create(alice, "Roles")
    code, _ = await workspaces.invite(team, MEMBER)
    member = await workspaces.accept(bob, code)
    admin_code, _ = await workspaces.invite(team, ADMIN)
    admin = await workspaces.accept(carol, admin_code)

    with pytest.raises(WorkspaceNotFound):  # a member does not see management at all
        await workspaces.invite(member, MEMBER)
    with pytest.raises(WorkspaceRefused):
        await workspaces.invite(admin, ADMIN)
    with pytest.raises(WorkspaceRefused):
        await workspaces.set_role(admin, bob, OWNER)
    with pytest.raises(WorkspaceRefused):
        await workspaces.set_role(admin, alice, MEMBER)
    with pytest.raises(WorkspaceRefused):
        await workspaces.invite(team, "owner")

    await workspaces.set_role(admin, bob, REVIEWER)

    assert (await workspaces.membership(bob, team.workspace_id)).role == REVIEWER


async def test_the_last_owner_keeps_the_role(workspaces: Workspaces) -> None:
    alice = user()
    team = await workspaces.create(alice, "Owners")

    with pytest.raises(WorkspaceRefused):
        await workspaces.set_role(team, alice, MEMBER)
    with pytest.raises(WorkspaceRefused):
        await workspaces.leave(team)
    assert (await workspaces.membership(alice, team.workspace_id)).role == OWNER


async def test_a_disabled_member_loses_the_workspace_and_its_threads(
    workspaces: Workspaces, persistence: Persistence
) -> None:
    alice, bob = user(), user()
    team = await workspaces.create(alice, "Disable")
    code, _ = await workspaces.invite(team, MEMBER)
    await workspaces.accept(bob, code)
    await workspaces.switch(bob, team.workspace_id)
    thread = f"thread-{uuid.uuid4()}"
    owned = await claim_thread(persistence.pool, thread_id=thread, user_id=bob, agent="assistant")
    assert owned.workspace_id == team.workspace_id

    assert await workspaces.set_disabled(team, bob, disabled=True)

    with pytest.raises(WorkspaceNotFound):
        await workspaces.membership(bob, team.workspace_id)
    assert (await workspaces.active(bob)).personal
    with pytest.raises(ThreadNotFound):
        await require_owner(persistence.pool, thread_id=thread, user_id=bob)
    with pytest.raises(ThreadNotFound):
        await claim_thread(persistence.pool, thread_id=thread, user_id=bob, agent="assistant")
    code_again, _ = await workspaces.invite(team, MEMBER)
    with pytest.raises(WorkspaceNotFound):  # a link does not undo a disable
        await workspaces.accept(bob, code_again)
    # ... and the refused use did not spend the code.
    assert (await workspaces.accept(user(), code_again)).role == MEMBER


async def test_switching_to_a_foreign_workspace_looks_missing(workspaces: Workspaces) -> None:
    alice, mallory = user(), user()
    team = await workspaces.create(alice, "Private")

    with pytest.raises(WorkspaceNotFound):
        await workspaces.switch(mallory, team.workspace_id)
    with pytest.raises(WorkspaceNotFound):
        await workspaces.switch(mallory, "w-" + "0" * 32)
    with pytest.raises(WorkspaceNotFound):
        await workspaces.switch(mallory, personal_id(alice))
    assert (await workspaces.active(mallory)).personal


async def test_a_new_thread_belongs_to_the_active_team(
    workspaces: Workspaces, persistence: Persistence
) -> None:
    alice = user()
    team = await workspaces.create(alice, "Threads")
    personal_thread = f"thread-{uuid.uuid4()}"
    personal = await claim_thread(
        persistence.pool, thread_id=personal_thread, user_id=alice, agent="assistant"
    )

    await workspaces.switch(alice, team.workspace_id)
    team_thread = f"thread-{uuid.uuid4()}"
    in_team = await claim_thread(
        persistence.pool, thread_id=team_thread, user_id=alice, agent="planner"
    )
    again = await claim_thread(
        persistence.pool, thread_id=personal_thread, user_id=alice, agent="assistant"
    )

    assert personal.workspace_id is None
    assert in_team.workspace_id == team.workspace_id
    assert again.workspace_id is None  # a thread stays where it was made


async def test_a_revoked_invitation_joins_nobody_and_only_its_workspace_can_revoke_it(
    workspaces: Workspaces,
) -> None:
    alice, bob, mallory = user(), user(), user()
    team = await workspaces.create(alice, "Revocable")
    theirs = await workspaces.create(mallory, "Elsewhere")
    code, _ = await workspaces.invite(team, MEMBER)
    [pending] = await workspaces.invites(team)

    # Another workspace's manager names the invitation: nothing happens.
    assert not await workspaces.revoke_invite(theirs, pending["id"])
    assert await workspaces.revoke_invite(team, pending["id"])
    assert not await workspaces.revoke_invite(team, pending["id"])  # once

    with pytest.raises(WorkspaceNotFound):
        await workspaces.accept(bob, code)
    assert await workspaces.invites(team) == []
    member = await workspaces.accept(bob, (await workspaces.invite(team, MEMBER))[0])
    with pytest.raises(WorkspaceNotFound):
        await workspaces.invites(member)  # a member does not see invitations
    actions = [e["action"] for e in await workspaces.audit_log(team.workspace_id)]
    assert "invite.revoked" in actions


async def test_invitations_and_workspaces_are_bounded_under_concurrent_requests(
    workspaces: Workspaces, monkeypatch: pytest.MonkeyPatch
) -> None:
    import auth.workspaces as module

    monkeypatch.setattr(module, "MAX_PENDING_INVITES", 3)
    monkeypatch.setattr(module, "MAX_CREATED", 2)
    alice = user()
    team = await workspaces.create(alice, "Bounded")

    made = await asyncio.gather(
        *(workspaces.invite(team, MEMBER) for _ in range(6)), return_exceptions=True
    )

    assert sum(not isinstance(m, Exception) for m in made) == 3
    assert all(isinstance(m, WorkspaceRefused) for m in made if isinstance(m, Exception))
    await workspaces.create(alice, "Second")
    with pytest.raises(WorkspaceRefused, match="at most 2"):
        await workspaces.create(alice, "Third")


async def test_usage_counts_only_the_workspaces_own_conversations(
    workspaces: Workspaces, persistence: Persistence
) -> None:
    alice, bob = user(), user()
    team = await workspaces.create(alice, "Usage")
    await workspaces.accept(bob, (await workspaces.invite(team, MEMBER))[0])
    await workspaces.switch(bob, team.workspace_id)
    in_team, personal = str(uuid.uuid4()), str(uuid.uuid4())
    await claim_thread(persistence.pool, thread_id=in_team, user_id=bob, agent="assistant")
    await workspaces.switch(bob, personal_id(bob))
    await claim_thread(persistence.pool, thread_id=personal, user_id=bob, agent="assistant")
    async with persistence.pool.connection() as conn:
        # As the ledger records them: with the conversation's workspace (NULL: personal).
        for thread, ws, tokens in ((in_team, team.workspace_id, 120), (personal, None, 5000)):
            await conn.execute(
                "INSERT INTO cairn_usage (run_id, user_id, thread_id, workspace_id, agent, "
                "status, input_tokens, output_tokens, cost) VALUES (%s, %s, %s, %s, "
                "'assistant', 'done', %s, 0, 0.5)",
                (uuid.uuid4(), bob, thread, ws, tokens),
            )

    usage = {row["user_id"]: row for row in await workspaces.usage(team)}

    assert (usage[bob]["runs"], usage[bob]["tokens"]) == (1, 120)
    assert (usage[alice]["runs"], usage[alice]["tokens"]) == (0, 0)
    bobs = await workspaces.membership(bob, team.workspace_id)
    with pytest.raises(WorkspaceNotFound):
        await workspaces.usage(bobs)


async def test_groups_from_the_sign_in_make_follow_and_end_memberships(
    persistence: Persistence,
) -> None:
    rules = group_rules(
        ["eng=Engineering:member", "eng-leads=Engineering:admin", "qa=Quality:reviewer"]
    )
    workspaces = Workspaces(persistence.pool, rules)
    alice, bob = user(), user()
    eng = rules[0].workspace_id
    assert rules[1].workspace_id == eng  # one workspace per name, on every worker

    await workspaces.sync_groups(alice, frozenset({"eng", "eng-leads", "unmapped"}), "Alice")
    await workspaces.sync_groups(bob, frozenset({"eng", "qa"}))

    assert (await workspaces.membership(alice, eng)).role == ADMIN  # the strongest role wins
    assert {(m.name, m.role) for m in await workspaces.memberships(bob) if not m.personal} == {
        ("Engineering", MEMBER),
        ("Quality", REVIEWER),
    }
    # Bob's groups change: the role follows, and a group left takes its workspace away.
    await workspaces.sync_groups(bob, frozenset({"eng-leads"}))
    assert (await workspaces.membership(bob, eng)).role == ADMIN
    with pytest.raises(WorkspaceNotFound):
        await workspaces.membership(bob, rules[2].workspace_id)
    actions = [e["action"] for e in await workspaces.audit_log(rules[2].workspace_id)]
    assert actions == ["oidc.removed", "oidc.joined"]

    # An admin's disabling outlives the next sign-in; leaving the group does not undo it either.
    await workspaces.sync_groups(bob, frozenset({"eng"}))
    admin = await workspaces.membership(alice, eng)
    await workspaces.set_disabled(admin, bob, disabled=True)
    await workspaces.sync_groups(bob, frozenset({"eng"}))
    await workspaces.sync_groups(bob, frozenset())
    await workspaces.sync_groups(bob, frozenset({"eng"}))
    with pytest.raises(WorkspaceNotFound):
        await workspaces.membership(bob, eng)


async def test_groups_never_touch_invited_or_owner_memberships(persistence: Persistence) -> None:
    carol, dave = user(), user()
    plain = Workspaces(persistence.pool)
    team = await plain.create(carol, "Invited")
    rules = group_rules(["staff=Invited:reviewer"])
    assert rules[0].workspace_id != team.workspace_id  # a mapped name is its own workspace
    workspaces = Workspaces(persistence.pool, rules)
    await workspaces.accept(dave, (await workspaces.invite(team, MEMBER))[0])

    await workspaces.sync_groups(dave, frozenset({"staff"}))
    await workspaces.sync_groups(dave, frozenset())

    assert (await workspaces.membership(dave, team.workspace_id)).role == MEMBER
    assert (await workspaces.membership(carol, team.workspace_id)).role == OWNER


def test_group_rules_refuse_what_they_cannot_honour() -> None:
    for entry in ("eng", "=Engineering:member", "eng=Engineering:owner", "eng=:member", "eng=x:"):
        with pytest.raises(ValueError, match="CAIRN_OIDC_GROUPS"):
            group_rules([entry])
    assert group_rules(["a=Team: with colon:admin"])[0].name == "Team: with colon"


def test_a_hostile_groups_claim_is_read_as_strings_only() -> None:
    assert claimed_groups("eng") == {"eng"}
    assert claimed_groups(["eng", 7, None, {"x": 1}, "", "q" * 300]) == {"eng"}
    assert claimed_groups({"eng": True}) == frozenset()
    assert len(claimed_groups([f"g{i}" for i in range(5000)])) == 1000
