"""Time travel on a real Postgres: edit-and-resend through the runner, the support pages
(history, state, fork, audit, refusals), the owner's view of it, and deletion of every branch."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from langchain_core.messages import HumanMessage

from auth import identity
from auth.sessions import SessionRevocations
from auth.workspaces import Workspaces, personal_id
from graphs.assistant.offline import offline_assistant
from graphs.core.persistence import Persistence
from graphs.core.runlock import ThreadRunLocks
from graphs.core.settings import Settings, get_settings
from graphs.core.timetravel import (
    MessageCheckpoints,
    SupportAudit,
    checkpoint_id,
    history,
    snapshot_at,
    state_digest,
)
from graphs.memory.privacy import Privacy
from tests.integration.test_memory_jobs import db
from tests.integration.test_privacy import chainlit_thread, scalar
from ui.agents import AGENTS
from ui.agents.assistant import SPEC as ASSISTANT
from ui.agents.planner import SPEC as PLANNER
from ui.agents.research import SPEC as RESEARCH
from ui.chainlit.adapter import ChainlitChat
from ui.chainlit.agents import discover
from ui.memory_page import build_router as build_memory_router
from ui.runner import PostgresThreads, Runner
from ui.runtime import current_runtime
from ui.support_page import build_router as build_support_router
from ui.surface import HeadlessSurface

pytestmark = pytest.mark.integration

__all__ = ["db"]

SUPPORT = "cairn:support-" + uuid.uuid4().hex
PAGE = {"x-cairn-request": "1", "origin": "http://test"}


@dataclass
class Runtime:
    """What the pages read from the worker's start-up (ui/runtime.AppRuntime)."""

    settings: Settings
    pool: Any
    persistence: Persistence
    graphs: dict[str, Any]
    runner: Runner
    privacy: Privacy
    support_audit: SupportAudit
    workspaces: Workspaces
    public_url: str = "http://test"
    accounts: Any = None
    memory_jobs: Any = None
    port: Any = None
    usage: Any = None
    """The usage ledger (none here: the page shows no usage)."""
    """The chat port (set below: the Chainlit adapter's, on the test database)."""
    signed_in: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
async def runtime(db: Persistence) -> AsyncIterator[Runtime]:
    graphs = {
        "assistant": ASSISTANT.build(
            checkpointer=db.checkpointer, store=db.store, model=offline_assistant()
        ),
        "planner": PLANNER.build(checkpointer=db.checkpointer, store=db.store),
        "research": RESEARCH.build(checkpointer=db.checkpointer, store=db.store),
    }
    locks = ThreadRunLocks(db.pool)
    runner = Runner(
        agents=(ASSISTANT, PLANNER, RESEARCH),
        graphs=graphs,
        threads=PostgresThreads(db.pool),
        locks=locks,
        fork_points=MessageCheckpoints(db.pool),
    )
    privacy = Privacy(
        pool=db.pool,
        store=db.store,
        checkpointer=db.checkpointer,
        memory_jobs=None,
        revocations=SessionRevocations(db.pool),
        default_retention_days=365,
    )
    yield Runtime(
        settings=Settings(data_dir=Path("/nonexistent")),
        pool=db.pool,
        persistence=db,
        graphs=graphs,
        runner=runner,
        privacy=privacy,
        support_audit=SupportAudit(db.pool),
        workspaces=Workspaces(db.pool),
        port=ChainlitChat(db.pool, discover(AGENTS)),
    )
    await runner.drain()
    await locks.close()


@pytest.fixture
def support_role(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_SUPPORT_USERS", f"cairn:someone-else, {SUPPORT}")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def client_as(runtime: Runtime, user_id: str) -> httpx.AsyncClient:
    app = FastAPI()
    app.include_router(build_memory_router())
    app.include_router(build_support_router())
    app.dependency_overrides[current_runtime] = lambda: runtime
    app.dependency_overrides[identity._session_claims] = lambda: {"identifier": user_id}
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def new_user() -> str:
    return f"cairn:{uuid.uuid4()}"


async def chat(runtime: Runtime, user: str, *texts: str, thread: str | None = None) -> str:
    thread = thread or str(uuid.uuid4())
    for i, text in enumerate(texts):
        outcome = await runtime.runner.message(
            HeadlessSurface(),
            user_id=user,
            thread_id=thread,
            profile="Assistant",
            text=text,
            message_id=f"{thread}-m{i}",
            temporary=False,
        )
        assert outcome.status == "done", outcome
    return thread


def texts(values: dict[str, Any]) -> list[str]:
    return [m.text for m in values.get("messages", [])]


async def test_an_edited_message_forks_on_postgres_and_the_live_branch_is_the_head(runtime):
    user = new_user()
    thread = await chat(runtime, user, "one", "two", "three")
    graph = runtime.graphs["assistant"]
    before = await history(graph, thread)

    outcome = await runtime.runner.edit(
        HeadlessSurface(), user_id=user, thread_id=thread, message_id=f"{thread}-m1", text="TWO"
    )

    assert outcome.status == "done"
    head = await graph.aget_state({"configurable": {"thread_id": thread}})
    assert texts(head.values) == [
        "one",
        "(offline model) You said: one",
        "TWO",
        "(offline model) You said: TWO",
    ]
    # The memory job reads the latest state: only the live branch.
    assert "three" not in " ".join(texts(head.values))
    after = await history(graph, thread)
    assert {c.checkpoint_id for c in before} < {c.checkpoint_id for c in after}
    # The first message too: the thread starts afresh from its root.
    await runtime.runner.edit(
        HeadlessSurface(), user_id=user, thread_id=thread, message_id=f"{thread}-m0", text="ONE"
    )
    head = await graph.aget_state({"configurable": {"thread_id": thread}})
    assert texts(head.values) == ["ONE", "(offline model) You said: ONE"]


async def test_support_pages_are_a_404_for_everyone_else(runtime, support_role):
    owner = new_user()
    thread = await chat(runtime, owner, "hello")
    [latest, *_] = await history(runtime.graphs["assistant"], thread)
    urls = [
        "/support",
        f"/support/threads/{thread}",
        f"/support/threads/{thread}/checkpoints/{latest.checkpoint_id}",
    ]
    for who in (owner, new_user()):
        async with client_as(runtime, who) as client:
            for url in urls:
                assert (await client.get(url)).status_code == 404, (who, url)
            forked = await client.post(f"{urls[2]}/fork", json={"reason": "x" * 10}, headers=PAGE)
            assert forked.status_code == 404
            assert forked.json() == {"detail": "Conversation not found"}
    assert await runtime.support_audit.for_thread(thread) == []
    async with client_as(runtime, SUPPORT) as client:
        missing = await client.get("/support/threads/no-such-thread")
        assert missing.status_code == 404
        assert missing.json() == {"detail": "Conversation not found"}


async def test_support_opens_history_and_state_escaped_and_every_access_is_audited(
    runtime, support_role
):
    owner = new_user()
    thread = await chat(runtime, owner, "<script>alert(1)</script> hi")
    async with client_as(runtime, SUPPORT) as client:
        page = await client.get(f"/support/threads/{thread}")
        assert page.status_code == 200
        assert "<script>alert" not in page.text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
        listed = await history(runtime.graphs["assistant"], thread)
        assert all(c.checkpoint_id in page.text for c in listed)
        assert "recall_memories" in page.text
        assert "assistant" in page.text
        one = listed[0].checkpoint_id
        state = await client.get(f"/support/threads/{thread}/checkpoints/{one}")
        assert state.status_code == 200
        assert "<script>alert" not in state.text
        assert "recalled" not in state.text  # memories are never shown
        assert (await client.get(f"/support/threads/{thread}/checkpoints/nope")).status_code == 404

    rows = await runtime.support_audit.for_thread(thread)
    assert [r["action"] for r in rows] == ["state", "history"]
    assert all(r["actor_id"] == SUPPORT and r["owner_id"] == owner for r in rows)
    # The owner sees it on the memory page and in their export.
    async with client_as(runtime, owner) as client:
        overview = (await client.get("/api/memory")).json()
        [mine] = [c for c in overview["conversations"] if c["id"] == thread]
        assert mine["support_opened_at"] is not None
        exported = (await client.get("/api/memory/export")).json()
        assert {r["action"] for r in exported["support_access"]} == {"history", "state"}
        # ... and in the audit log of the conversation's workspace (here: the owner's own).
        seen = [e for e in exported["workspace_audit"] if e["action"] == "support.viewed"]
        assert [(e["workspace_id"], e["actor_id"], e["detail"]["view"]) for e in seen] == [
            (personal_id(owner), SUPPORT, "history"),
            (personal_id(owner), SUPPORT, "state"),
        ]
    async with client_as(runtime, new_user()) as client:
        assert (await client.get("/api/memory/export")).json()["support_access"] == []


async def planner_thread(runtime: Runtime, owner: str) -> str:
    thread = str(uuid.uuid4())
    outcome = await runtime.runner.message(
        HeadlessSurface(),
        user_id=owner,
        thread_id=thread,
        profile="Planner",
        text="Which region had the most revenue?",
        message_id=f"{thread}-m0",
        temporary=False,
    )
    assert outcome.status == "paused"  # waiting for the plan's approval
    return thread


async def test_a_fork_with_an_edited_plan_makes_a_branch_and_leaves_history_intact(
    runtime, support_role
):
    owner = new_user()
    thread = await planner_thread(runtime, owner)
    await chainlit_thread(runtime.persistence, owner, thread)
    graph = runtime.graphs["planner"]
    original = [s async for s in graph.aget_state_history({"configurable": {"thread_id": thread}})]
    paused = original[0]
    assert paused.values.get("plan")
    digests = {checkpoint_id(s.config): state_digest(s.values) for s in original}
    url = f"/support/threads/{thread}/checkpoints/{checkpoint_id(paused.config)}/fork"
    body = {"reason": "Plan skipped the join", "field": "plan", "text": "Sum revenue by region"}

    async with client_as(runtime, SUPPORT) as client:
        assert (await client.post(url, json=body)).status_code == 403  # no page header
        bad = await client.post(url, json={**body, "field": "todos"}, headers=PAGE)
        assert bad.status_code == 422
        short = await client.post(url, json={**body, "reason": ""}, headers=PAGE)
        assert short.status_code == 422
        made = await client.post(url, json=body, headers=PAGE)

    assert made.status_code == 200, made.text
    result = made.json()
    forked = await snapshot_at(graph, thread, result["new_checkpoint_id"])
    assert forked is not None
    assert forked.values["plan"] == ["Sum revenue by region"]
    assert checkpoint_id(forked.parent_config) == checkpoint_id(paused.config)
    # The resumed fork paused again for the owner's approval of the edited plan.
    assert result["status"] == "paused"
    head = await graph.aget_state({"configurable": {"thread_id": thread}})
    assert head.values["plan"] == ["Sum revenue by region"]
    for cid, digest in digests.items():
        again = await snapshot_at(graph, thread, str(cid))
        assert again is not None
        assert state_digest(again.values) == digest
    [fork_row] = [
        r for r in await runtime.support_audit.for_thread(thread) if r["action"] == "fork"
    ]
    assert fork_row["reason"] == "Plan skipped the join"
    assert fork_row["before_digest"] == digests[checkpoint_id(paused.config)]
    assert fork_row["after_digest"] == state_digest(forked.values)
    assert fork_row["new_checkpoint_id"] == result["new_checkpoint_id"]
    [forked_entry] = [
        e for e in await runtime.workspaces.audit_about(owner) if e["action"] == "support.forked"
    ]
    assert forked_entry["workspace_id"] == personal_id(owner)
    assert forked_entry["detail"]["new_checkpoint_id"] == result["new_checkpoint_id"]
    notice = await scalar(
        runtime.persistence,
        'SELECT output FROM "Step" WHERE "threadId" = %s AND type = \'assistant_message\'',
        thread,
    )
    assert "Cairn support resumed this conversation" in notice


async def test_deleting_a_conversation_removes_every_branch_and_its_audit(runtime, support_role):
    owner = new_user()
    thread = await chat(runtime, owner, "one", "two")
    await chainlit_thread(runtime.persistence, owner, thread)
    await runtime.runner.edit(
        HeadlessSurface(), user_id=owner, thread_id=thread, message_id=f"{thread}-m1", text="2"
    )
    async with client_as(runtime, SUPPORT) as client:
        assert (await client.get(f"/support/threads/{thread}")).status_code == 200
    assert await scalar(
        runtime.persistence,
        "SELECT count(*) FROM cairn_message_checkpoints WHERE thread_id = %s",
        thread,
    )

    async with client_as(runtime, owner) as client:
        deleted = await client.post(
            f"/api/conversations/{thread}/delete", json={"forget": False}, headers=PAGE
        )
    assert deleted.status_code == 200

    for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
        sql = f"SELECT count(*) FROM {table} WHERE thread_id = %s"
        assert await scalar(runtime.persistence, sql, thread) == 0, table
    for table in ("cairn_message_checkpoints", "cairn_support_audit"):
        sql = f"SELECT count(*) FROM {table} WHERE thread_id = %s"
        assert await scalar(runtime.persistence, sql, thread) == 0, table
    async with client_as(runtime, SUPPORT) as client:
        assert (await client.get(f"/support/threads/{thread}")).status_code == 404


async def test_a_wipe_removes_the_owners_audit_but_not_a_support_accounts_record_of_others(
    runtime, support_role
):
    owner, other = new_user(), new_user()
    mine = await chat(runtime, owner, "mine")
    theirs = await chat(runtime, other, "theirs")
    async with client_as(runtime, SUPPORT) as client:
        for thread in (mine, theirs):
            assert (await client.get(f"/support/threads/{thread}")).status_code == 200

    report = await runtime.privacy.wipe_account(owner)

    assert report.verified, report.leftovers
    assert report.leftovers["support_audit"] == 0
    assert report.leftovers["message_checkpoints"] == 0
    assert await runtime.support_audit.for_owner(owner) == []
    assert len(await runtime.support_audit.for_owner(other)) == 1
    # A wiped support account: its record of other users' conversations stays theirs.
    await runtime.privacy.wipe_account(SUPPORT)
    assert len(await runtime.support_audit.for_owner(other)) == 1


async def test_an_edit_of_another_users_message_is_refused_on_postgres(runtime):
    owner, mallory = new_user(), new_user()
    thread = await chat(runtime, owner, "private")
    other = await chat(runtime, mallory, "mine")
    surface = HeadlessSurface()

    as_mallory = await runtime.runner.edit(
        surface, user_id=mallory, thread_id=thread, message_id=f"{thread}-m0", text="x"
    )
    cross = await runtime.runner.edit(
        surface, user_id=mallory, thread_id=other, message_id=f"{thread}-m0", text="x"
    )

    assert as_mallory.status == cross.status == "not_found"
    head = await runtime.graphs["assistant"].aget_state({"configurable": {"thread_id": thread}})
    assert texts(head.values)[0] == "private"
    assert next(m for m in head.values["messages"] if isinstance(m, HumanMessage)).text == "private"


async def test_a_research_fork_with_an_edited_todo_list_pauses_for_review_again(
    runtime, support_role
):
    graph = runtime.graphs["research"]
    owner, thread = new_user(), str(uuid.uuid4())
    outcome = await runtime.runner.message(
        HeadlessSurface(),
        user_id=owner,
        thread_id=thread,
        profile=RESEARCH.profile,
        text="What is pgvector and how does HNSW work?",
        message_id=f"{thread}-m0",
        temporary=False,
    )
    assert outcome.status == "paused"
    paused = await graph.aget_state({"configurable": {"thread_id": thread}})
    assert paused.values["todos"]
    async with client_as(runtime, SUPPORT) as client:
        made = await client.post(
            f"/support/threads/{thread}/checkpoints/{checkpoint_id(paused.config)}/fork",
            json={"reason": "Try a narrower plan", "field": "todos", "text": "HNSW only"},
            headers=PAGE,
        )
    assert made.status_code == 200, made.text
    assert made.json()["status"] == "paused"
    head = await graph.aget_state({"configurable": {"thread_id": thread}})
    assert [t["content"] for t in head.values["todos"]] == ["HNSW only"]
    assert head.interrupts  # waiting for the owner's approval of the edited plan
    again = await snapshot_at(graph, thread, str(checkpoint_id(paused.config)))
    assert again is not None
    assert state_digest(again.values) == state_digest(paused.values)


async def test_editing_a_research_question_paused_for_review_asks_again(runtime):
    owner, thread = new_user(), str(uuid.uuid4())
    outcome = await runtime.runner.message(
        HeadlessSurface(),
        user_id=owner,
        thread_id=thread,
        profile=RESEARCH.profile,
        text="What is pgvector?",
        message_id=f"{thread}-m0",
        temporary=False,
    )
    assert outcome.status == "paused"

    edited = await runtime.runner.edit(
        HeadlessSurface(),
        user_id=owner,
        thread_id=thread,
        message_id=f"{thread}-m0",
        text="How does HNSW indexing work?",
    )

    assert edited.status == "paused"
    head = await runtime.graphs["research"].aget_state({"configurable": {"thread_id": thread}})
    assert [m.text for m in head.values["messages"] if isinstance(m, HumanMessage)] == [
        "How does HNSW indexing work?"
    ]
    assert head.values["question"] == "How does HNSW indexing work?"
    assert head.interrupts
