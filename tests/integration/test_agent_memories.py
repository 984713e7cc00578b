"""Research's source ratings and the Planner's examples on the memory page, on a real Postgres:
listed with where they came from, exported, deleted by their user only, and kept deleted."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from auth import identity
from auth.ownership import claim_thread
from auth.sessions import SessionRevocations
from graphs.core.persistence import Persistence
from graphs.core.settings import Settings
from graphs.memory.locks import user_locks_for
from graphs.memory.plans import PLANS, PlanMemory, summary_key
from graphs.memory.privacy import Privacy
from graphs.memory.research import SOURCES_KEY, ResearchMemory, source_id
from graphs.memory.scoped import user_label
from graphs.tools.fetchlog import FetchRecord, new_record
from tests.integration.test_memory_jobs import db
from tests.integration.test_privacy import chainlit_thread
from ui.agents import AGENTS
from ui.chainlit.adapter import ChainlitChat
from ui.chainlit.agents import discover
from ui.memory_page import build_router
from ui.runtime import current_runtime

pytestmark = pytest.mark.integration

__all__ = ["db"]

PAGE = {"x-cairn-request": "1", "origin": "http://test"}
GOAL = "Compare churn by region for last quarter"
STEPS = ["Count customers per region", "Count cancellations per region", "Divide the two"]


@dataclass(frozen=True)
class Citation:
    url: str
    passed: bool


@dataclass(frozen=True)
class Checked:
    citations: list[Citation]


@dataclass
class Runtime:
    """What the memory page reads from the worker's start-up (ui/runtime.AppRuntime)."""

    settings: Settings
    pool: Any
    persistence: Persistence
    privacy: Privacy
    graphs: dict[str, Any] = field(default_factory=dict)
    public_url: str = "http://test"
    accounts: Any = None
    memory_jobs: Any = None
    port: Any = None
    usage: Any = None
    """The usage ledger (none here: the page shows no usage)."""
    """The chat port (set below: the Chainlit adapter's, on the test database)."""
    runner: Any = None
    support_audit: Any = None
    workspaces: Any = None


@pytest.fixture(scope="module")
def runtime(db: Persistence) -> Runtime:
    privacy = Privacy(
        pool=db.pool,
        store=db.store,
        checkpointer=db.checkpointer,
        memory_jobs=None,
        revocations=SessionRevocations(db.pool),
        default_retention_days=365,
    )
    return Runtime(
        Settings(data_dir=Path("/nonexistent")),
        db.pool,
        db,
        privacy,
        port=ChainlitChat(db.pool, discover(AGENTS)),
    )


def client_as(runtime: Runtime, user_id: str) -> httpx.AsyncClient:
    app = FastAPI()
    app.include_router(build_router())
    app.dependency_overrides[current_runtime] = lambda: runtime
    app.dependency_overrides[identity._session_claims] = lambda: {"identifier": user_id}
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def new_user() -> str:
    return f"cairn:{uuid.uuid4()}"


def page(thread_id: str, url: str, *, at: datetime | None = None) -> FetchRecord:
    record = new_record(
        thread_id=thread_id, url=url, final_url=url, status=200, title="", content="text"
    )
    return replace(record, fetched_at=at.isoformat()) if at else record


async def research_thread(db: Persistence, user: str, *urls: str, failing: str = "") -> str:
    """A Research conversation whose checked report cited `urls` (every quote held up but those
    from `failing`), recorded as the research graph records it."""
    thread = f"thread-{uuid.uuid4()}"
    await claim_thread(db.pool, thread_id=thread, user_id=user, agent="research")
    await chainlit_thread(db, user, thread)
    citations = [Citation(u, passed=failing not in u or not failing) for u in urls]
    fetched = [page(thread, u) for u in urls]
    await ResearchMemory(db.store, user).record_check(Checked(citations), fetched, thread_id=thread)
    return thread


async def planner_thread(db: Persistence, user: str, goal: str = GOAL) -> tuple[str, str]:
    thread = f"thread-{uuid.uuid4()}"
    await claim_thread(db.pool, thread_id=thread, user_id=user, agent="planner")
    await chainlit_thread(db, user, thread)
    key = summary_key(thread, goal)
    await PlanMemory(db.store, user).record(
        key=key, thread_id=thread, goal=goal, steps=STEPS, outcome="answered"
    )
    return thread, key


async def test_the_page_lists_and_exports_what_research_and_the_planner_remember(
    db: Persistence, runtime: Runtime
) -> None:
    user = new_user()
    thread = await research_thread(
        db,
        user,
        "https://stats.example/a",
        "https://stats.example/b",
        "https://blog.example/x",
        failing="blog.example",
    )
    plan_thread, key = await planner_thread(db, user)
    async with client_as(runtime, user) as client:
        overview = (await client.get("/api/memory")).json()
        exported = (await client.get("/api/memory/export")).json()

    sources = {s["source"]: s for s in overview["research_sources"]}
    assert sources.keys() == {"stats.example", "blog.example"}
    stats = sources["stats.example"]
    assert (stats["passed"], stats["total"]) == (2, 2)
    assert stats["id"] == source_id("stats.example")
    assert stats["conversations"] == [{"thread_id": thread, "conversation": "A conversation"}]
    assert stats["last_cited"] == datetime.now(UTC).date().isoformat()
    assert (sources["blog.example"]["passed"], sources["blog.example"]["total"]) == (0, 1)

    [plan] = overview["plan_examples"]
    assert plan["key"] == key
    assert (plan["goal"], plan["steps"], plan["outcome"]) == (GOAL, STEPS, "answered")
    assert (plan["thread_id"], plan["conversation"]) == (plan_thread, "A conversation")

    assert {s["source"] for s in exported["research_sources"]} == sources.keys()
    assert [p["key"] for p in exported["plan_examples"]] == [key]
    assert exported["research_sources_deleted"] == exported["plan_examples_deleted"] == []

    # Nobody else sees any of it.
    async with client_as(runtime, new_user()) as client:
        other = (await client.get("/api/memory")).json()
        other_export = (await client.get("/api/memory/export")).json()
    assert other["research_sources"] == other["plan_examples"] == []
    assert other_export["research_sources"] == other_export["plan_examples"] == []


async def test_a_deleted_source_rating_and_plan_example_stay_deleted(
    db: Persistence, runtime: Runtime
) -> None:
    user = new_user()
    thread = await research_thread(db, user, "https://stats.example/a", "https://blog.example/x")
    plan_thread, key = await planner_thread(db, user)
    async with client_as(runtime, user) as client:
        gone = await client.delete(
            f"/api/memory/sources/{source_id('stats.example')}", headers=PAGE
        )
        assert gone.status_code == 200, gone.text
        assert gone.json()["source"] == "stats.example"
        assert (await client.delete(f"/api/memory/plans/{key}", headers=PAGE)).status_code == 200
        overview = (await client.get("/api/memory")).json()
        exported = (await client.get("/api/memory/export")).json()
    assert [s["source"] for s in overview["research_sources"]] == ["blog.example"]
    assert overview["plan_examples"] == []
    [deleted_source] = exported["research_sources_deleted"]
    assert deleted_source["source"] == "stats.example"
    assert [p["key"] for p in exported["plan_examples_deleted"]] == [key]

    # What the orchestrator reads no longer has it either.
    research = ResearchMemory(db.store, user)
    item = await db.store.aget(research.namespace, SOURCES_KEY)
    assert item is not None
    assert "stats.example" not in item.value["content"]
    assert "blog.example" in item.value["content"]

    # A run that read the source before the delete does not bring it back; new evidence counts.
    before = datetime.now(UTC) - timedelta(minutes=5)
    cited = Checked([Citation("https://stats.example/a", passed=True)])
    await research.record_check(
        cited, [page(thread, "https://stats.example/a", at=before)], thread_id=thread
    )
    assert "stats.example" not in await research.source_stats()
    later = datetime.now(UTC) + timedelta(seconds=5)
    fresh = f"thread-{uuid.uuid4()}"
    await research.record_check(
        cited, [page(fresh, "https://stats.example/a", at=later)], thread_id=fresh
    )
    assert (await research.source_stats())["stats.example"][:2] == (1, 1)

    # A re-run of the planner node writes the same summary again: it is not kept.
    plans = PlanMemory(db.store, user)
    await plans.record(key=key, thread_id=plan_thread, goal=GOAL, steps=STEPS, outcome="answered")
    assert await plans.examples() == []
    assert await plans.similar(GOAL) == []


async def test_another_users_or_a_forged_id_answers_like_a_missing_one(
    db: Persistence, runtime: Runtime
) -> None:
    owner, intruder = new_user(), new_user()
    await research_thread(db, owner, "https://stats.example/a")
    _, key = await planner_thread(db, owner)
    theirs = source_id("stats.example")
    async with client_as(runtime, intruder) as client:
        await research_thread(db, intruder, "https://stats.example/a")  # the same source id
        for url in (f"/api/memory/plans/{key}", f"/api/memory/plans/{'0' * 32}"):
            refused = await client.delete(url, headers=PAGE)
            assert (refused.status_code, refused.json()) == (
                404,
                {"detail": "Plan example not found"},
            )
        missing = await client.delete(f"/api/memory/sources/{'0' * 32}", headers=PAGE)
        assert (missing.status_code, missing.json()) == (
            404,
            {"detail": "Research source not found"},
        )
        # Deleting their own rating of the same source leaves the owner's alone.
        mine = await client.delete(f"/api/memory/sources/{theirs}", headers=PAGE)
        assert mine.status_code == 200
        for bad in ("%00" + "0" * 31, "0" * 33, "A" * 32, "x", "0" * 31 + "%0A", "0" * 4000):
            malformed = await client.delete(f"/api/memory/plans/{bad}", headers=PAGE)
            assert malformed.status_code == 422, bad
            assert malformed.json()["detail"] == "That is not a plan example id."
            assert (
                await client.delete(f"/api/memory/sources/{bad}", headers=PAGE)
            ).status_code == 422
    async with client_as(runtime, owner) as client:
        # The page's request header and origin are required, as for every change.
        for headers in ({}, {**PAGE, "origin": "https://evil.example"}):
            refused = await client.delete(f"/api/memory/plans/{key}", headers=headers)
            assert refused.status_code == 403
            refused = await client.delete(f"/api/memory/sources/{theirs}", headers=headers)
            assert refused.status_code == 403
        overview = (await client.get("/api/memory")).json()
    assert [s["source"] for s in overview["research_sources"]] == ["stats.example"]
    assert [p["key"] for p in overview["plan_examples"]] == [key]


class PausingStore:
    """The real store, with reads of one namespace held until released: a job that has read
    and not yet written, for as long as the test needs."""

    def __init__(self, store: Any, namespace: tuple[str, ...]) -> None:
        self._store = store
        self._namespace = namespace
        self.read = asyncio.Event()
        self.release = asyncio.Event()

    async def aget(self, namespace: tuple[str, ...], key: str, **kwargs: Any) -> Any:
        item = await self._store.aget(namespace, key, **kwargs)
        if tuple(namespace) == self._namespace:
            self.read.set()
            await self.release.wait()
        return item

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def test_a_source_delete_holds_against_a_rating_being_recorded_meanwhile(
    db: Persistence,
) -> None:
    user = new_user()
    thread = f"thread-{uuid.uuid4()}"
    research = ResearchMemory(db.store, user)
    cited = Checked([Citation("https://stats.example/a", passed=True)])
    fetched = [page(thread, "https://stats.example/a")]
    await research.record_check(cited, fetched, thread_id=thread)

    # Another research run (on another worker, as far as the lock knows) has read the ratings.
    paused = PausingStore(db.store, research.namespace)
    slow = ResearchMemory(paused, user, locks=user_locks_for(db.store))  # type: ignore[arg-type]
    other = f"thread-{uuid.uuid4()}"
    job = asyncio.create_task(
        slow.record_check(cited, [page(other, "https://stats.example/a")], thread_id=other)
    )
    await asyncio.wait_for(paused.read.wait(), 10)
    delete = asyncio.create_task(research.forget_source(source_id("stats.example")))
    await asyncio.sleep(0.3)
    paused.release.set()
    await job
    assert await delete is not None
    assert await research.sources() == []


async def test_a_plan_delete_holds_against_the_same_summary_being_written_meanwhile(
    db: Persistence,
) -> None:
    user = new_user()
    plans = PlanMemory(db.store, user)
    key = summary_key("t", GOAL)
    await plans.record(key=key, thread_id="t", goal=GOAL, steps=STEPS, outcome="partial")

    # The planner's node running again (a retry) has checked the deletes and not yet written.
    paused = PausingStore(db.store, (user_label(user), PLANS, "tombstones"))
    slow = PlanMemory(paused, user, locks=user_locks_for(db.store))  # type: ignore[arg-type]
    job = asyncio.create_task(
        slow.record(key=key, thread_id="t", goal=GOAL, steps=STEPS, outcome="answered")
    )
    await asyncio.wait_for(paused.read.wait(), 10)
    delete = asyncio.create_task(plans.forget(key))
    await asyncio.sleep(0.3)
    paused.release.set()
    await job
    assert await delete is not None
    assert await plans.examples() == []


async def test_deleting_a_conversation_takes_its_examples_and_if_asked_its_source_counts(
    db: Persistence, runtime: Runtime
) -> None:
    user = new_user()
    kept = await research_thread(db, user, "https://stats.example/a")
    dropped = await research_thread(db, user, "https://stats.example/b", "https://blog.example/x")
    plan_thread, _ = await planner_thread(db, user)
    research = ResearchMemory(db.store, user)
    assert (await research.source_stats())["stats.example"][:2] == (2, 2)

    await runtime.privacy.delete_conversation(user_id=user, thread_id=dropped, forget=True)
    [left] = await research.sources()
    assert (left.source, left.passed, left.total, left.threads) == ("stats.example", 1, 1, (kept,))

    await runtime.privacy.delete_conversation(user_id=user, thread_id=kept, forget=False)
    [left] = await research.sources()
    assert (left.passed, left.total, left.threads, left.earlier) == (1, 1, (), True)

    await runtime.privacy.delete_conversation(user_id=user, thread_id=plan_thread, forget=False)
    assert await PlanMemory(db.store, user).examples() == []


async def test_a_wipe_takes_the_ratings_the_examples_and_their_delete_records(
    db: Persistence, runtime: Runtime
) -> None:
    user = new_user()
    await research_thread(db, user, "https://stats.example/a", "https://blog.example/x")
    _, key = await planner_thread(db, user)
    await ResearchMemory(db.store, user).forget_source(source_id("blog.example"))
    await PlanMemory(db.store, user).forget(key)

    report = await runtime.privacy.wipe_account(user)
    assert report.verified, report.leftovers
    assert await ResearchMemory(db.store, user).sources() == []
    assert await ResearchMemory(db.store, user).forgotten() == {}
    assert await PlanMemory(db.store, user).forgotten() == []
