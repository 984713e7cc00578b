"""Shares on a real Postgres: who sees a shared conversation, what it shows, and what takes it
away. Cross-workspace canaries: two workspaces, a user in both, users in one each."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from auth.ownership import ThreadNotFound, claim_thread
from auth.sessions import SessionRevocations
from auth.shares import (
    MEMBERS,
    PERSONAL_REFUSED,
    WORKSPACE,
    Include,
    ShareNotFound,
    ShareRefused,
    Shares,
)
from auth.workspaces import MEMBER, Membership, Workspaces
from graphs.core.persistence import Persistence
from graphs.memory.privacy import Privacy
from ui.memory_note import NOTE_KIND, RECALL_STEP
from ui.shared_conversation import NOTE, RECALL, REPLY, USER, attachment, render, transcript

pytestmark = pytest.mark.integration

HOSTILE = "<img src=x onerror=alert(1)><script>alert(2)</script>"


def user() -> str:
    return f"user-{uuid.uuid4().hex[:8]}"


@dataclass
class Teams:
    """Workspace A (alice owner, bob member), workspace B (alice and carol): alice is in both,
    bob only in A, carol only in B."""

    a: Membership
    b: Membership
    alice: str
    bob: str
    carol: str


@pytest.fixture
def workspaces(persistence: Persistence) -> Workspaces:
    return Workspaces(persistence.pool)


@pytest.fixture
def shares(persistence: Persistence) -> Shares:
    return Shares(persistence.pool)


async def join(workspaces: Workspaces, team: Membership, who: str) -> Membership:
    code, _ = await workspaces.invite(team, MEMBER)
    return await workspaces.accept(who, code)


@pytest.fixture
async def teams(workspaces: Workspaces) -> Teams:
    alice, bob, carol = user(), user(), user()
    a = await workspaces.create(alice, "Team A")
    b = await workspaces.create(carol, "Team B")
    await join(workspaces, a, bob)
    await join(workspaces, b, alice)
    return Teams(a=a, b=b, alice=alice, bob=bob, carol=carol)


async def team_thread(
    db: Persistence, workspaces: Workspaces, owner: str, workspace_id: str | None
) -> str:
    """A conversation the owner starts in workspace_id (None: their personal one)."""
    if workspace_id is None:
        workspace_id = (await workspaces.personal(owner)).workspace_id
    await workspaces.switch(owner, workspace_id)
    thread_id = f"thread-{uuid.uuid4()}"
    await claim_thread(db.pool, thread_id=thread_id, user_id=owner, agent="assistant")
    return thread_id


async def chainlit_rows(db: Persistence, owner: str, thread_id: str, steps: list[dict]) -> None:
    """Chainlit's stored rows of the conversation, as its data layer writes them."""
    async with db.pool.connection() as conn:
        await conn.execute(
            'INSERT INTO "User" (id, identifier, metadata) VALUES (%s, %s, %s) '
            "ON CONFLICT (identifier) DO NOTHING",
            (str(uuid.uuid4()), owner, "{}"),
        )
        await conn.execute(
            'INSERT INTO "Thread" (id, name, "userId") '
            'SELECT %s, %s, id FROM "User" WHERE identifier = %s',
            (thread_id, f"Plan {HOSTILE}", owner),
        )
        for n, step in enumerate(steps):
            await conn.execute(
                'INSERT INTO "Step" (id, "threadId", name, type, output, metadata, "startTime", '
                '"endTime") VALUES (%s, %s, %s, %s, %s, %s, now() + make_interval(secs => %s), '
                "now() + make_interval(secs => %s))",
                (
                    step.get("id", str(uuid.uuid4())),
                    thread_id,
                    step["name"],
                    step["type"],
                    step["output"],
                    json.dumps(step.get("metadata", {})),
                    n,
                    n,
                ),
            )


async def visible(shares: Shares, viewer: str, share_id: str) -> bool:
    try:
        await shares.visible(viewer_id=viewer, share_id=share_id)
    except ShareNotFound:
        return False
    return True


async def test_a_workspace_share_is_for_its_members_only(
    persistence: Persistence, workspaces: Workspaces, shares: Shares, teams: Teams
) -> None:
    in_a = await team_thread(persistence, workspaces, teams.alice, teams.a.workspace_id)
    in_b = await team_thread(persistence, workspaces, teams.alice, teams.b.workspace_id)

    share_a = await shares.create(owner_id=teams.alice, thread_id=in_a, audience=WORKSPACE)
    share_b = await shares.create(owner_id=teams.alice, thread_id=in_b, audience=WORKSPACE)

    assert (share_a.workspace_id, share_b.workspace_id) == (
        teams.a.workspace_id,
        teams.b.workspace_id,
    )
    # alice (in both) sees both; bob only A's; carol only B's; a stranger neither.
    assert await visible(shares, teams.alice, share_a.id)
    assert await visible(shares, teams.alice, share_b.id)
    assert await visible(shares, teams.bob, share_a.id)
    assert not await visible(shares, teams.bob, share_b.id)
    assert await visible(shares, teams.carol, share_b.id)
    assert not await visible(shares, teams.carol, share_a.id)
    assert not await visible(shares, user(), share_a.id)


async def test_foreign_revoked_and_made_up_shares_raise_the_same_refusal(
    persistence: Persistence, workspaces: Workspaces, shares: Shares, teams: Teams
) -> None:
    thread = await team_thread(persistence, workspaces, teams.alice, teams.a.workspace_id)
    share = await shares.create(owner_id=teams.alice, thread_id=thread, audience=WORKSPACE)
    refusals = []
    for viewer, share_id in (
        (teams.carol, share.id),  # another workspace's member
        (teams.bob, "A" * 22),  # made up, well formed
        (teams.bob, "../" + share.id),  # malformed
    ):
        with pytest.raises(ShareNotFound) as caught:
            await shares.visible(viewer_id=viewer, share_id=share_id)
        refusals.append(str(caught.value))

    assert await shares.revoke(owner_id=teams.alice, share_id=share.id)
    with pytest.raises(ShareNotFound) as caught:
        await shares.visible(viewer_id=teams.bob, share_id=share.id)
    refusals.append(str(caught.value))

    assert len(set(refusals)) == 1
    assert not await shares.revoke(owner_id=teams.alice, share_id=share.id)  # once
    assert await shares.owned(teams.alice) == []


async def test_only_the_owner_revokes_and_both_changes_are_audited(
    persistence: Persistence, workspaces: Workspaces, shares: Shares, teams: Teams
) -> None:
    thread = await team_thread(persistence, workspaces, teams.alice, teams.a.workspace_id)
    share = await shares.create(
        owner_id=teams.alice, thread_id=thread, audience=WORKSPACE, include=Include(recall=True)
    )

    for other in (teams.bob, teams.carol):
        with pytest.raises(ShareNotFound):
            await shares.revoke(owner_id=other, share_id=share.id)
    assert await visible(shares, teams.bob, share.id)
    await shares.revoke(owner_id=teams.alice, share_id=share.id)

    log = await workspaces.audit_log(teams.a.workspace_id)
    entries = [(e["action"], e["actor_id"], e["detail"]) for e in log if "share" in e["action"]]
    assert entries == [
        ("share.revoked", teams.alice, {"share_id": share.id, "thread_id": thread}),
        (
            "share.created",
            teams.alice,
            {
                "share_id": share.id,
                "thread_id": thread,
                "audience": WORKSPACE,
                "members": [],
                "include": ["recall"],
            },
        ),
    ]
    # Nothing about A's share went into B's log, though alice is in both.
    assert not [
        e for e in await workspaces.audit_log(teams.b.workspace_id) if "share" in e["action"]
    ]


async def test_named_members_must_be_live_members_of_the_conversations_workspace(
    persistence: Persistence, workspaces: Workspaces, shares: Shares, teams: Teams
) -> None:
    dave = user()
    await join(workspaces, teams.a, dave)
    thread = await team_thread(persistence, workspaces, teams.alice, teams.a.workspace_id)

    with pytest.raises(ShareRefused, match="Not a member"):  # carol is in B, not A
        await shares.create(
            owner_id=teams.alice, thread_id=thread, audience=MEMBERS, members=[teams.carol]
        )
    with pytest.raises(ShareRefused):
        await shares.create(owner_id=teams.alice, thread_id=thread, audience=MEMBERS, members=[])
    share = await shares.create(
        owner_id=teams.alice, thread_id=thread, audience=MEMBERS, members=[teams.bob]
    )

    assert share.members == (teams.bob,)
    assert await visible(shares, teams.bob, share.id)
    assert not await visible(shares, dave, share.id)  # in A, not in the audience
    assert await visible(shares, teams.alice, share.id)  # the owner
    assert [s.id for s in await shares.owned(teams.alice)] == [share.id]
    assert await shares.owned(teams.bob) == []


async def test_only_the_owner_of_a_team_conversation_can_share_it(
    persistence: Persistence, workspaces: Workspaces, shares: Shares, teams: Teams
) -> None:
    personal = await team_thread(persistence, workspaces, teams.alice, None)
    bobs = await team_thread(persistence, workspaces, teams.bob, teams.a.workspace_id)

    with pytest.raises(ShareRefused) as refused:
        await shares.create(owner_id=teams.alice, thread_id=personal, audience=WORKSPACE)
    assert str(refused.value) == PERSONAL_REFUSED
    # bob's thread in the team alice owns, and a missing one, look alike.
    for thread_id in (bobs, f"thread-{uuid.uuid4()}"):
        with pytest.raises(ThreadNotFound):
            await shares.create(owner_id=teams.alice, thread_id=thread_id, audience=WORKSPACE)


async def test_a_disabled_viewer_or_an_owner_who_left_sees_nothing(
    persistence: Persistence, workspaces: Workspaces, shares: Shares, teams: Teams
) -> None:
    carols = await team_thread(persistence, workspaces, teams.carol, teams.b.workspace_id)
    alices = await team_thread(persistence, workspaces, teams.alice, teams.b.workspace_id)
    by_carol = await shares.create(owner_id=teams.carol, thread_id=carols, audience=WORKSPACE)
    by_alice = await shares.create(owner_id=teams.alice, thread_id=alices, audience=WORKSPACE)
    assert await visible(shares, teams.alice, by_carol.id)
    assert await visible(shares, teams.carol, by_alice.id)

    await workspaces.set_disabled(teams.b, teams.alice, disabled=True)

    assert not await visible(shares, teams.alice, by_carol.id)  # disabled viewer
    assert not await visible(shares, teams.carol, by_alice.id)  # owner no longer a member
    assert not await visible(shares, teams.alice, by_alice.id)


async def test_the_view_hides_notes_recall_and_attachments_and_escapes_everything(
    persistence: Persistence, workspaces: Workspaces, teams: Teams
) -> None:
    thread = await team_thread(persistence, workspaces, teams.alice, teams.a.workspace_id)
    reply_id = str(uuid.uuid4())
    await chainlit_rows(
        persistence,
        teams.alice,
        thread,
        [
            {"name": teams.alice, "type": "user_message", "output": f"hello {HOSTILE}"},
            {"name": teams.alice, "type": "user_message", "output": "hello &lt;b>entity"},
            {"name": RECALL_STEP, "type": "run", "output": "Used 1 fact(s): User lives in Porto"},
            {"name": "remember", "type": "tool", "output": "User lives in Porto (tool)"},
            {"id": reply_id, "name": "Assistant", "type": "assistant_message", "output": "Hi!"},
            {
                "name": "Cairn",
                "type": "assistant_message",
                "output": "Memory: Saved: User likes figs",
                "metadata": {"kind": NOTE_KIND},
            },
            {"name": "Cairn", "type": "assistant_message", "output": "Memory: Forgotten: old"},
            {"name": "Usage", "type": "tool", "output": "42 tokens"},
        ],
    )
    async with persistence.pool.connection() as conn:
        await conn.execute(
            'INSERT INTO "Element" (id, "threadId", "stepId", name, mime, "objectKey") '
            "VALUES (%s, %s, %s, 'chart.json', 'application/json', %s)",
            (str(uuid.uuid4()), thread, reply_id, f"threads/{thread}/files/x"),
        )
        await conn.execute(
            "INSERT INTO cairn_element_files (object_key, thread_id, user_id, mime, size, data) "
            "VALUES (%s, %s, %s, 'application/json', 2, '{}')",
            (f"threads/{thread}/files/x", thread, teams.alice),
        )

    plain = await transcript(persistence.pool, thread, Include(), "Alice")
    everything = await transcript(
        persistence.pool, thread, Include(memory_notes=True, recall=True, attachments=True), "Alice"
    )

    assert [(e.kind, e.text) for e in plain.entries] == [
        (USER, f"hello {HOSTILE}"),
        (USER, "hello <b>entity"),
        (REPLY, "Hi!"),
    ]
    assert plain.entries[2].attachments == []
    assert [e.kind for e in everything.entries] == [USER, USER, RECALL, REPLY, NOTE, NOTE]
    assert [a.name for a in everything.entries[3].attachments] == ["chart.json"]
    chart = everything.entries[3].attachments[0].id
    assert await attachment(persistence.pool, thread, chart) == (
        "chart.json",
        "application/json",
        b"{}",
    )
    other = await team_thread(persistence, workspaces, teams.alice, teams.a.workspace_id)
    assert await attachment(persistence.pool, other, chart) is None  # only its own conversation's
    page = render("/share/x", plain, Include(), "Alice")
    for live in ("<img", "<script>alert", "Porto", "figs", "42 tokens"):
        assert live not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "hello &lt;b&gt;entity" in page  # the sanitiser's entity, decoded, escaped again
    assert "Not included: memory notes, recall details, attachments." in page
    full = render("/share/x", everything, Include(True, True, True), "Alice")
    assert "User lives in Porto" in full
    assert "figs" in full
    assert "(tool)" not in full


async def test_deleting_the_conversation_or_wiping_the_account_removes_its_shares(
    persistence: Persistence, workspaces: Workspaces, shares: Shares, teams: Teams
) -> None:
    privacy = Privacy(
        pool=persistence.pool,
        store=persistence.store,
        checkpointer=persistence.checkpointer,
        memory_jobs=None,
        revocations=SessionRevocations(persistence.pool),
        default_retention_days=365,
    )
    deleted = await team_thread(persistence, workspaces, teams.alice, teams.a.workspace_id)
    kept = await team_thread(persistence, workspaces, teams.alice, teams.a.workspace_id)
    gone = await shares.create(owner_id=teams.alice, thread_id=deleted, audience=WORKSPACE)
    stays = await shares.create(
        owner_id=teams.alice, thread_id=kept, audience=MEMBERS, members=[teams.bob]
    )
    bobs = await team_thread(persistence, workspaces, teams.bob, teams.a.workspace_id)
    by_bob = await shares.create(owner_id=teams.bob, thread_id=bobs, audience=WORKSPACE)

    await privacy.delete_conversation(user_id=teams.alice, thread_id=deleted, forget=False)

    assert not await visible(shares, teams.bob, gone.id)
    assert [s.id for s in await shares.owned(teams.alice)] == [stays.id]
    assert await count(persistence, "WHERE id = %s", gone.id) == 0

    report = await privacy.wipe_account(teams.bob)

    assert report.verified, report.leftovers
    assert report.leftovers["shares"] == 0
    assert await count(persistence, "WHERE owner_id = %s", teams.bob) == 0
    assert not await visible(shares, teams.alice, by_bob.id)
    # bob is no longer named in alice's share: an account made again starts with none.
    assert (await shares.owned(teams.alice))[0].members == ()

    await privacy.wipe_account(teams.alice)
    assert await count(persistence, "WHERE owner_id = %s", teams.alice) == 0


async def count(db: Persistence, where: str, *args: Any) -> int:
    async with db.pool.connection() as conn:
        cur = await conn.execute(f"SELECT count(*) AS n FROM cairn_thread_shares {where}", args)
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])
