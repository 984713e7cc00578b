"""Tokens, sign-ins and support access in workspaces on a real Postgres: a team token stops when
its member is disabled or leaves, its runs' threads go to its team, its making and revoking are
audited there, the export lists the user's entries, and a wipe leaves every workspace."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from chainlit.user import User
from fastapi import FastAPI
from mcp.server.fastmcp.exceptions import ToolError

from auth import identity
from auth.oauth import audit_sign_in
from auth.ownership import InWorkspace, ThreadNotFound, claim_thread
from auth.sessions import SessionRevocations
from auth.tokens import AccessTokens, TokenLimits, TokenRejected, hash_token
from auth.workspaces import ADMIN, MEMBER, WorkspaceNotFound, Workspaces, personal_id
from graphs.assistant.offline import offline_assistant
from graphs.core.persistence import Persistence
from graphs.core.runlock import ThreadRunLocks
from graphs.core.settings import Settings
from graphs.memory.privacy import Privacy
from ui.agents import assistant as assistant_agent
from ui.chainlit.oauth import audited_oauth_callback
from ui.mcp_server import McpEndpoint
from ui.memory_page import build_router as build_memory_router
from ui.runner import PostgresThreads, Runner
from ui.runtime import current_runtime
from ui.tokens_page import build_router as build_tokens_router

pytestmark = pytest.mark.integration

PAGE = {"x-cairn-request": "1", "origin": "http://test"}
LIMITS = TokenLimits(max_concurrent=5, max_runs_per_hour=50, max_model_calls=20)
ASSISTANT = assistant_agent.SPEC


def user() -> str:
    return f"cairn:{uuid.uuid4().hex[:12]}"


@dataclass
class Runtime:
    """What the tokens and memory pages read from the worker's start-up (ui/runtime.AppRuntime)."""

    settings: Settings
    pool: Any
    persistence: Persistence
    privacy: Privacy
    tokens: AccessTokens
    workspaces: Workspaces
    public_url: str = "http://test"
    support_audit: Any = None
    accounts: Any = None
    memory_jobs: Any = None
    port: Any = None
    usage: Any = None
    runner: Any = None


@pytest.fixture
def runtime(persistence: Persistence) -> Runtime:
    pool = persistence.pool
    return Runtime(
        settings=Settings(data_dir=Path("/nonexistent")),
        pool=pool,
        persistence=persistence,
        privacy=Privacy(
            pool=pool,
            store=persistence.store,
            checkpointer=persistence.checkpointer,
            memory_jobs=None,
            revocations=SessionRevocations(pool),
            default_retention_days=365,
        ),
        tokens=AccessTokens(pool, scopes=("assistant", "planner")),
        workspaces=Workspaces(pool),
    )


def client_as(runtime: Runtime, user_id: str) -> httpx.AsyncClient:
    app = FastAPI()
    app.include_router(build_memory_router())
    app.include_router(build_tokens_router([ASSISTANT]))
    app.dependency_overrides[current_runtime] = lambda: runtime
    app.dependency_overrides[identity._session_claims] = lambda: {"identifier": user_id}
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


@dataclass
class Team:
    workspace_id: str
    owner: str
    member: str


async def team(workspaces: Workspaces, *, role: str = MEMBER, name: str = "Data team") -> Team:
    """A team of two: an owner, and a member who has it active."""
    owner, member = user(), user()
    made = await workspaces.create(owner, name)
    code, _ = await workspaces.invite(made, role)
    await workspaces.accept(member, code)
    await workspaces.switch(member, made.workspace_id)
    return Team(made.workspace_id, owner, member)


async def make_token(
    tokens: AccessTokens, user_id: str, workspace_id: str | None, name: str = "editor"
) -> tuple[str, str]:
    made = await tokens.create(
        user_id,
        name=name,
        scopes=frozenset({"assistant"}),
        days=7,
        limits=LIMITS,
        workspace_id=workspace_id,
    )
    return made.secret, made.info.id


async def audit_actions(workspaces: Workspaces, workspace_id: str) -> list[tuple[str, Any]]:
    return [(e["action"], e["detail"]) for e in await workspaces.audit_log(workspace_id)]


# -- a token belongs to a workspace -----------------------------------------------------------


async def test_a_team_token_stops_when_its_member_is_disabled_or_leaves(runtime: Runtime) -> None:
    workspaces, tokens = runtime.workspaces, runtime.tokens
    t = await team(workspaces)
    in_team, _ = await make_token(tokens, t.member, t.workspace_id)
    personal, _ = await make_token(tokens, t.member, None)
    owner = await workspaces.membership(t.owner, t.workspace_id)

    assert (await tokens.verify(in_team)).workspace_id == t.workspace_id
    assert (await tokens.verify(personal)).workspace_id is None

    await workspaces.set_disabled(owner, t.member, disabled=True)
    with pytest.raises(TokenRejected):
        await tokens.verify(in_team)
    assert (await tokens.verify(personal)).user_id == t.member  # a personal token is unaffected
    listed = {i.workspace_id: i.public() for i in await tokens.owned(t.member)}
    assert listed[t.workspace_id]["workspace"] == "Data team"
    assert listed[t.workspace_id]["membership_ended"] is True
    assert listed[t.workspace_id]["active"] is False
    assert listed[None]["workspace"] == "Personal"
    assert listed[None]["active"] is True

    await workspaces.set_disabled(owner, t.member, disabled=False)
    assert (await tokens.verify(in_team)).user_id == t.member

    await workspaces.leave(await workspaces.membership(t.member, t.workspace_id))
    with pytest.raises(TokenRejected):
        await tokens.verify(in_team)
    assert (await tokens.verify(personal)).user_id == t.member


async def test_a_refused_team_token_is_not_marked_used(runtime: Runtime) -> None:
    t = await team(runtime.workspaces)
    secret, token_id = await make_token(runtime.tokens, t.member, t.workspace_id)
    owner = await runtime.workspaces.membership(t.owner, t.workspace_id)
    await runtime.workspaces.set_disabled(owner, t.member, disabled=True)

    with pytest.raises(TokenRejected):
        await runtime.tokens.verify(secret)

    [info] = [i for i in await runtime.tokens.owned(t.member) if i.id == token_id]
    assert info.last_used_at is None


async def test_a_token_is_made_only_in_a_team_of_which_the_user_is_a_live_member(
    runtime: Runtime,
) -> None:
    t = await team(runtime.workspaces)
    stranger = user()

    with pytest.raises(WorkspaceNotFound):
        await make_token(runtime.tokens, stranger, t.workspace_id)
    with pytest.raises(WorkspaceNotFound):  # a personal token's workspace is NULL, never its id
        await make_token(
            runtime.tokens, stranger, (await runtime.workspaces.personal(stranger)).workspace_id
        )

    assert await runtime.tokens.owned(stranger) == []
    assert all(
        a != "token.created" for a, _ in await audit_actions(runtime.workspaces, t.workspace_id)
    )


# -- the tokens page and the audit log ---------------------------------------------------------


async def test_the_page_makes_a_token_in_the_active_workspace_and_audits_it_there(
    runtime: Runtime,
) -> None:
    t = await team(runtime.workspaces)
    body = {"name": "my editor", "scopes": ["assistant"], "days": 7}
    async with client_as(runtime, t.member) as client:
        made = (await client.post("/api/tokens", json=body, headers=PAGE)).json()
        overview = (await client.get("/api/tokens")).json()
        assert made["workspace_id"] == t.workspace_id
        assert made["workspace"] == "Data team"
        assert overview["workspace"]["id"] == t.workspace_id
        assert (await client.post(f"/api/tokens/{made['id']}/revoke", headers=PAGE)).json() == {
            "revoked": made["id"]
        }
        again = await client.post(f"/api/tokens/{made['id']}/revoke", headers=PAGE)
        assert again.status_code == 200

    logged = await audit_actions(runtime.workspaces, t.workspace_id)
    detail = {"token_id": made["id"], "name": "my editor", "scopes": ["assistant"]}
    assert [entry for entry in logged if entry[0].startswith("token.")] == [
        ("token.revoked", detail),  # once: revoking again changes nothing
        ("token.created", detail),
    ]
    async with runtime.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT token_hash FROM cairn_access_tokens WHERE id = %s", (made["id"],)
        )
        row = await cur.fetchone()
        cur = await conn.execute("SELECT detail::text AS d FROM cairn_workspace_audit")
        texts = [r["d"] for r in await cur.fetchall()]
    assert row is not None
    assert hash_token(made["token"]) == row["token_hash"]
    assert not any(made["token"] in d or row["token_hash"] in d for d in texts)


async def test_a_personal_token_is_audited_in_the_personal_workspace(runtime: Runtime) -> None:
    alice = user()
    _, token_id = await make_token(runtime.tokens, alice, None, name="laptop")

    assert await runtime.tokens.revoke(alice, token_id)

    logged = await audit_actions(runtime.workspaces, personal_id(alice))
    assert [a for a, _ in logged] == ["token.revoked", "token.created"]


async def test_another_users_token_cannot_be_revoked(runtime: Runtime) -> None:
    alice, mallory = user(), user()
    secret, token_id = await make_token(runtime.tokens, alice, None)

    async with client_as(runtime, mallory) as client:
        refused = await client.post(f"/api/tokens/{token_id}/revoke", headers=PAGE)
        missing = await client.post("/api/tokens/tok_nosuchtoken/revoke", headers=PAGE)

    assert refused.status_code == missing.status_code == 404
    assert refused.json() == missing.json()
    assert (await runtime.tokens.verify(secret)).user_id == alice
    assert [a for a, _ in await audit_actions(runtime.workspaces, personal_id(alice))] == [
        "token.created"
    ]


async def test_signing_out_everywhere_audits_each_token_in_its_workspace(runtime: Runtime) -> None:
    t = await team(runtime.workspaces)
    await make_token(runtime.tokens, t.member, t.workspace_id)
    await make_token(runtime.tokens, t.member, None)

    assert await runtime.tokens.revoke_all(t.member) == 2

    for workspace in (t.workspace_id, personal_id(t.member)):
        [(_, detail)] = [
            e for e in await audit_actions(runtime.workspaces, workspace) if e[0] == "token.revoked"
        ]
        assert detail["why"] == "signed out everywhere"


# -- sign-ins -----------------------------------------------------------------------------------


async def test_a_sign_in_is_audited_in_the_active_workspace_and_never_blocks(
    runtime: Runtime,
) -> None:
    t = await team(runtime.workspaces)
    hook = audited_oauth_callback(lambda: runtime)  # type: ignore[arg-type,return-value]
    newcomer = uuid.uuid4().hex

    signed_in = await hook("cairn", "tok", {"sub": newcomer}, User(identifier=newcomer), None)
    await audit_sign_in(runtime.workspaces, t.member, "cairn")

    assert signed_in is not None
    assert [
        a for a, _ in await audit_actions(runtime.workspaces, personal_id(signed_in.identifier))
    ] == ["sign_in"]
    [(_, detail)] = [
        e for e in await audit_actions(runtime.workspaces, t.workspace_id) if e[0] == "sign_in"
    ]
    assert detail == {"provider": "cairn"}

    class Broken:
        async def active(self, user_id: str) -> Any:
            msg = "database away"
            raise OSError(msg)

    await audit_sign_in(Broken(), t.member, "cairn")  # type: ignore[arg-type]  # logged only

    def starting() -> Any:
        msg = "still starting"
        raise RuntimeError(msg)

    late = await audited_oauth_callback(starting)("cairn", "t", {"sub": "x"}, User("x"), None)
    assert late is not None
    assert late.identifier == "cairn:x"


# -- runs over MCP act in the token's workspace ----------------------------------------------------


class FakeChat:
    async def add_outside_turn(self, **_: Any) -> None:
        return None

    async def append_reply(self, *_: Any, **__: Any) -> None:
        return None


class FakeContext:
    async def info(self, text: str) -> None:
        return None


@pytest.fixture
async def mcp(runtime: Runtime) -> AsyncIterator[McpEndpoint]:
    persistence = runtime.persistence
    graph = ASSISTANT.build(
        checkpointer=persistence.checkpointer, store=persistence.store, model=offline_assistant()
    )
    locks = ThreadRunLocks(runtime.pool)
    runner = Runner(
        agents=[ASSISTANT],
        graphs={"assistant": graph},
        threads=PostgresThreads(runtime.pool),
        locks=locks,
    )
    yield McpEndpoint(
        settings=runtime.settings,
        public_url="http://test",
        pool=runtime.pool,
        agents=[ASSISTANT],
        runner=lambda: runner,
        tokens=lambda: runtime.tokens,
        chat=lambda: FakeChat(),  # type: ignore[arg-type,return-value]
    )
    await runner.drain()
    await locks.close()


async def thread_workspace_of(runtime: Runtime, thread_id: str) -> str | None:
    async with runtime.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT workspace_id FROM cairn_threads WHERE thread_id = %s", (thread_id,)
        )
        row = await cur.fetchone()
    assert row is not None
    return row["workspace_id"]


async def run_with(
    mcp: McpEndpoint, runtime: Runtime, secret: str, thread_id: str | None = None
) -> dict[str, Any]:
    token = await runtime.tokens.verify(secret)
    return await mcp._start(
        FakeContext(),  # type: ignore[arg-type]
        token,
        ASSISTANT,
        "hello",
        thread_id,
        temporary=False,
        pre_approve=False,
    )


async def test_a_run_over_mcp_starts_its_thread_in_the_tokens_workspace(
    runtime: Runtime, mcp: McpEndpoint
) -> None:
    t = await team(runtime.workspaces)
    in_team, _ = await make_token(runtime.tokens, t.member, t.workspace_id)
    personal, _ = await make_token(runtime.tokens, t.member, None)

    # The member has the team active; a personal token's thread is personal all the same.
    mine = await run_with(mcp, runtime, personal)
    assert await thread_workspace_of(runtime, mine["thread_id"]) is None
    # With the personal workspace active, a team token's thread goes to the team.
    await runtime.workspaces.switch(t.member, personal_id(t.member))
    ours = await run_with(mcp, runtime, in_team)
    assert await thread_workspace_of(runtime, ours["thread_id"]) == t.workspace_id
    assert (await run_with(mcp, runtime, in_team, ours["thread_id"]))["status"] == "done"

    # Each token reaches only its own workspace's conversations.
    with pytest.raises(ToolError, match="not found"):
        await run_with(mcp, runtime, in_team, mine["thread_id"])
    with pytest.raises(ToolError, match="not found"):
        await run_with(mcp, runtime, personal, ours["thread_id"])


async def test_a_pinned_claim_is_refused_once_the_member_is_out(runtime: Runtime) -> None:
    t = await team(runtime.workspaces)
    owner = await runtime.workspaces.membership(t.owner, t.workspace_id)
    await runtime.workspaces.set_disabled(owner, t.member, disabled=True)

    with pytest.raises(ThreadNotFound):
        await claim_thread(
            runtime.pool,
            thread_id=f"thread-{uuid.uuid4()}",
            user_id=t.member,
            agent="assistant",
            workspace=InWorkspace(t.workspace_id),
        )
    stranger = user()
    with pytest.raises(ThreadNotFound):
        await claim_thread(
            runtime.pool,
            thread_id=f"thread-{uuid.uuid4()}",
            user_id=stranger,
            agent="assistant",
            workspace=InWorkspace(t.workspace_id),
        )
    # Unpinned (chat), the disabled member's new thread goes to their personal workspace.
    chat = await claim_thread(
        runtime.pool, thread_id=f"thread-{uuid.uuid4()}", user_id=t.member, agent="assistant"
    )
    assert chat.workspace_id is None


# -- export and wipe -------------------------------------------------------------------------------


async def test_the_export_lists_the_workspace_audit_entries_about_the_user(
    runtime: Runtime,
) -> None:
    t = await team(runtime.workspaces)
    _, token_id = await make_token(runtime.tokens, t.member, t.workspace_id)

    async with client_as(runtime, t.member) as client:
        exported = (await client.get("/api/memory/export")).json()
    async with client_as(runtime, user()) as client:
        stranger = (await client.get("/api/memory/export")).json()

    entries = exported["workspace_audit"]
    assert {(e["workspace_id"], e["action"]) for e in entries} >= {
        (t.workspace_id, "invite.accepted"),
        (t.workspace_id, "token.created"),
    }
    [made] = [e for e in entries if e["action"] == "token.created"]
    assert made["detail"]["token_id"] == token_id
    assert made["workspace"] == "Data team"
    assert isinstance(made["at"], str)  # datetimes as ISO text
    assert stranger["workspace_audit"] == []


async def test_a_wipe_leaves_every_workspace_and_team_logs_no_longer_name_the_user(
    runtime: Runtime,
) -> None:
    workspaces = runtime.workspaces
    t = await team(workspaces, role=ADMIN)
    bob, carol = t.member, user()
    bob_admin = await workspaces.membership(bob, t.workspace_id)
    used, _ = await workspaces.invite(bob_admin, MEMBER)
    await workspaces.accept(carol, used)
    await workspaces.invite(bob_admin, MEMBER)  # never used
    await make_token(runtime.tokens, bob, t.workspace_id, name="bob's laptop")
    await workspaces.personal(bob)
    bobs_team = await workspaces.create(bob, "Bob's own")

    report = await runtime.privacy.wipe_account(bob)

    assert report.verified, report.leftovers
    assert report.leftovers["workspaces"] == 0
    assert await workspaces.audit_about(bob) == []
    assert [m.personal for m in await workspaces.memberships(carol)] == [True, False]
    assert {m["user_id"] for m in await workspaces.members(t.workspace_id)} == {t.owner, carol}
    async with runtime.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM cairn_workspace_invites WHERE workspace_id = %s "
            "AND used_at IS NULL",
            (t.workspace_id,),
        )
        unused = await cur.fetchone()
        cur = await conn.execute(
            "SELECT created_by FROM cairn_workspaces WHERE id = %s", (bobs_team.workspace_id,)
        )
        made = await cur.fetchone()
        cur = await conn.execute(
            "SELECT count(*) AS n FROM cairn_workspaces WHERE id = %s", (personal_id(bob),)
        )
        personal = await cur.fetchone()
    assert unused == {"n": 0}
    assert made == {"created_by": None}
    assert personal == {"n": 0}
    logged = await workspaces.audit_log(t.workspace_id)
    anonymised = [e for e in logged if e["detail"].get("actor_wiped")]
    assert {e["action"] for e in anonymised} == {
        "invite.accepted",
        "invite.created",
        "token.created",
    }
    assert all(e["actor_id"] is None for e in anonymised)
    [token_entry] = [e for e in anonymised if e["action"] == "token.created"]
    assert "name" not in token_entry["detail"]  # the name bob gave it goes with bob
    # Entries about someone else keep naming them.
    assert any(e["action"] == "invite.accepted" and e["actor_id"] == carol for e in logged)
