"""Team budgets and caps on a real Postgres with two workers (two pools): a team's monthly budget
and its runs-at-once cap hold for every run of its conversations, whoever runs them, on top of
each user's own; only the team's managers change them, and bad values are refused."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from auth import identity
from auth.ownership import claim_thread
from auth.workspaces import ADMIN, MEMBER, Membership, Workspaces, personal_id
from graphs.core.migrations import migrate
from graphs.core.persistence import Pool, make_pool
from graphs.core.runs import RunJournal, TeamTooManyRuns, TooManyRuns
from graphs.core.settings import Settings
from graphs.core.usage import Budget, OverBudget, RunUsage, TeamOverBudget, UsageLedger
from tests.conftest import create_database
from tests.integration.test_durable_runs import make_runner
from ui.runtime import current_runtime
from ui.surface import HeadlessSurface
from ui.workspace_page import build_router

pytestmark = pytest.mark.integration

PRICES = {"chat": (0.001, 0.002)}
ESTIMATE = 4000
PAGE = {"x-cairn-request": "1", "origin": "http://test"}


def new_user() -> str:
    return f"user-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
async def pools(database_url: str) -> AsyncIterator[list[Pool]]:
    found = [make_pool(database_url, max_size=8), make_pool(database_url, max_size=8)]
    for pool in found:
        await pool.open(wait=True)
    await migrate(found[0])
    yield found
    for pool in found:
        await pool.close()


def ledger(pool: Pool, *, tokens: int = 0) -> UsageLedger:
    return UsageLedger(pool, budget=Budget(tokens, 0.0), prices=PRICES, default_estimate=ESTIMATE)


async def team_of(pool: Pool, *members: str, **limits: Any) -> Membership:
    """A team whose owner is a new user, with `members` in it and `limits` as its settings."""
    workspaces = Workspaces(pool)
    team = await workspaces.create(new_user(), "Budgeted")
    for member in members:
        await workspaces.accept(member, (await workspaces.invite(team, MEMBER))[0])
    if limits:
        await workspaces.update_settings(team, limits)
    return team


async def spend(worker: UsageLedger, user: str, tokens: int, workspace_id: str | None) -> None:
    """A finished run that used `tokens` (of an agent of its own: the next run's estimate of
    any other agent stays ESTIMATE)."""
    admission = await worker.admit(
        user_id=user,
        thread_id=f"t-{uuid.uuid4().hex[:6]}",
        agent=f"spent-{uuid.uuid4().hex[:6]}",
        workspace_id=workspace_id,
    )
    used = RunUsage(model_calls=1)
    used.add("chat", PRICES, tokens, 0)
    await worker.settle(admission, used, status="done", wall_s=0.1)


async def test_a_team_over_its_budget_refuses_team_runs_not_its_members_own(pools):
    alice, bob = new_user(), new_user()
    team = await team_of(pools[0], alice, bob, budget={"tokens": 20_000, "cost": None})
    other = await team_of(pools[0], alice, budget={"tokens": 20_000})
    worker = ledger(pools[0], tokens=1_000_000)
    await spend(worker, alice, 9000, team.workspace_id)
    await spend(worker, bob, 8000, team.workspace_id)  # 17,000 of 20,000: no room for 4,000

    for who in (alice, bob):
        with pytest.raises(TeamOverBudget) as refused:
            await worker.admit(
                user_id=who, thread_id="next", agent="team", workspace_id=team.workspace_id
            )
        assert "your team's monthly budget, set by its admins" in str(refused.value)
        assert "17,000 of its 20,000 tokens" in str(refused.value)
    # The same user's personal run, and their run in another team, have their own budgets.
    await worker.admit(user_id=alice, thread_id="mine", agent="team")
    await worker.admit(
        user_id=alice, thread_id="elsewhere", agent="team", workspace_id=other.workspace_id
    )
    # A run the server resumes after its worker died was admitted already: never refused.
    await worker.admit(
        user_id=bob,
        thread_id="resumed",
        agent="team",
        budgeted=False,
        workspace_id=team.workspace_id,
    )
    month = await worker.team_month(team.workspace_id)
    assert (month.tokens, month.runs) == (17_000, 3)


async def test_the_users_own_budget_still_applies_in_a_team(pools):
    carol = new_user()
    team = await team_of(pools[0], carol, budget={"tokens": 1_000_000})
    worker = ledger(pools[0], tokens=5000)
    await spend(worker, carol, 2000, team.workspace_id)
    with pytest.raises(OverBudget) as refused:
        await worker.admit(
            user_id=carol, thread_id="x", agent="team-own", workspace_id=team.workspace_id
        )
    assert not isinstance(refused.value, TeamOverBudget)
    assert "your team" not in str(refused.value)


async def admitted(attempts: list) -> int:
    results = await asyncio.gather(*attempts, return_exceptions=True)
    unexpected = [r for r in results if isinstance(r, Exception) and not isinstance(r, OverBudget)]
    assert not unexpected
    return sum(not isinstance(r, Exception) for r in results)


async def test_a_team_budget_raced_on_two_workers_admits_only_what_it_covers(pools):
    # Room for two runs' reservations (2 x 4000 <= 10000), not three. Three members, each with
    # their own (ample) budget, so both rows are locked: user's, then team's, on every attempt.
    members = [new_user() for _ in range(3)]
    team = await team_of(pools[0], *members, budget={"tokens": 10_000})
    workers = [ledger(pool, tokens=1_000_000) for pool in pools]
    attempts = [
        workers[i % 2].admit(
            user_id=members[i % 3],
            thread_id=f"race-{i}",
            agent="team-race",
            workspace_id=team.workspace_id,
        )
        for i in range(12)
    ]
    assert await admitted(attempts) == 2
    month = await workers[1].team_month(team.workspace_id)
    assert month.reserved_tokens == 2 * ESTIMATE


async def test_a_money_budget_is_checked_the_same_way(pools):
    # The estimate's cost: 4000 tokens at the dearest price, 0.002 per 1k = 0.008.
    members = [new_user(), new_user()]
    team = await team_of(pools[0], *members, budget={"tokens": None, "cost": 0.02})
    workers = [ledger(pool) for pool in pools]
    attempts = [
        workers[i % 2].admit(
            user_id=members[i % 2],
            thread_id=f"spend-{i}",
            agent="team-spend",
            workspace_id=team.workspace_id,
        )
        for i in range(6)
    ]
    assert await admitted(attempts) == 2


async def team_threads(pool: Pool, team: Membership, users: list[str], n: int) -> list[str]:
    workspaces = Workspaces(pool)
    threads = []
    for i in range(n):
        user = users[i % len(users)]
        await workspaces.switch(user, team.workspace_id)
        thread = f"cap-{uuid.uuid4().hex[:8]}"
        owned = await claim_thread(pool, thread_id=thread, user_id=user, agent="assistant")
        assert owned.workspace_id == team.workspace_id
        threads.append(thread)
    return threads


async def test_two_workers_start_no_more_team_runs_than_its_cap(pools):
    members = [new_user() for _ in range(3)]
    team = await team_of(pools[0], *members, max_runs=2)
    threads = await team_threads(pools[0], team, members, 9)
    journals = [RunJournal(pool, worker=f"team-cap-{i}") for i, pool in enumerate(pools)]
    refusals: list[str] = []

    async def start(i: int) -> bool:
        try:
            await journals[i % 2].started(
                thread_id=threads[i],
                user_id=members[i % 3],
                agent="assistant",
                cap=5,  # each user's own cap too: both locks, in one order
                workspace_id=team.workspace_id,
            )
        except TeamTooManyRuns as exc:
            refusals.append(str(exc))
            return False
        return True

    started = await asyncio.gather(*(start(i) for i in range(9)))
    assert sum(started) == 2
    assert all("your team already has 2 runs going at once" in r for r in refusals)
    # The members' personal conversations are not the team's; a finished team run frees a place.
    await Workspaces(pools[0]).switch(members[0], personal_id(members[0]))
    await journals[0].started(
        thread_id=f"own-{uuid.uuid4().hex[:6]}", user_id=members[0], agent="assistant", cap=5
    )
    first = next(i for i, ok in enumerate(started) if ok)
    late = next(i for i, ok in enumerate(started) if not ok)
    with pytest.raises(TeamTooManyRuns):
        await journals[1].started(
            thread_id=threads[late],
            user_id=members[late % 3],
            agent="assistant",
            workspace_id=team.workspace_id,
        )
    await journals[0].finished(threads[first])
    await journals[1].started(
        thread_id=threads[late],
        user_id=members[late % 3],
        agent="assistant",
        workspace_id=team.workspace_id,
    )


async def test_without_a_cap_or_with_one_of_zero_team_runs_are_not_capped(pools):
    members = [new_user()]
    team = await team_of(pools[0], *members, max_runs=None)
    threads = await team_threads(pools[0], team, members, 4)
    journal = RunJournal(pools[0], worker="team-nocap")
    for thread in threads:
        await journal.started(
            thread_id=thread, user_id=members[0], agent="assistant", workspace_id=team.workspace_id
        )
    await Workspaces(pools[0]).update_settings(team, {"max_runs": 0})
    journal.released(threads[0])
    await journal.started(
        thread_id=threads[0], user_id=members[0], agent="assistant", workspace_id=team.workspace_id
    )
    assert not isinstance(TooManyRuns("x"), TeamTooManyRuns)


async def _turn(runner: Any, user: str, thread_id: str, surface: HeadlessSurface) -> Any:
    return await runner.message(
        surface,
        user_id=user,
        thread_id=thread_id,
        profile="Assistant",
        text="Remember that I drink green tea.",
        message_id=f"{thread_id}-m1",
        temporary=False,
    )


async def test_the_runner_refuses_a_team_run_over_budget_before_it_starts(pg_server_url):
    database_url = create_database(pg_server_url)
    runner, close = await make_runner(database_url, worker="team-budget", agent="assistant")
    pool = runner.threads.pool  # type: ignore[attr-defined]
    try:
        member = new_user()
        team = await team_of(pool, member, budget={"tokens": 3000})  # < one run's estimate
        runner.usage = ledger(pool)
        workspaces = Workspaces(pool)
        await workspaces.switch(member, team.workspace_id)
        refused = HeadlessSurface()
        outcome = await _turn(runner, member, "team-thread", refused)
        assert outcome.status == "refused"
        assert len(refused.errors) == 1
        assert "your team's monthly budget, set by its admins" in refused.errors[0]
        state = await runner.graphs["assistant"].aget_state(
            {"configurable": {"thread_id": "team-thread"}}
        )
        assert state.values == {}, "nothing of the refused turn ran"
        # Their personal conversation runs, and is recorded as nobody's team's.
        await workspaces.switch(member, personal_id(member))
        assert (await _turn(runner, member, "own-thread", HeadlessSurface())).status == "done"
        # Once the team's admins raise the budget, the team conversation runs and counts.
        await workspaces.update_settings(team, {"budget": {"tokens": 1_000_000, "cost": None}})
        assert (await _turn(runner, member, "team-thread", HeadlessSurface())).status == "done"
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT thread_id, workspace_id FROM cairn_usage WHERE user_id = %s "
                "ORDER BY created_at",
                (member,),
            )
            rows = [(r["thread_id"], r["workspace_id"]) for r in await cur.fetchall()]
        assert rows == [("own-thread", None), ("team-thread", team.workspace_id)]
    finally:
        await close()


async def test_the_runner_refuses_a_team_run_over_its_cap_before_it_starts(pg_server_url):
    # Two workers; each model call takes a second, so the first team turn is still going.
    database_url = create_database(pg_server_url)
    busy, close_busy = await make_runner(
        database_url, worker="team-cap-a", slow_s=1.0, agent="assistant"
    )
    other, close_other = await make_runner(database_url, worker="team-cap-b", agent="assistant")
    pool = busy.threads.pool  # type: ignore[attr-defined]
    try:
        first_user, second_user = new_user(), new_user()
        team = await team_of(pool, first_user, second_user, max_runs=1)
        workspaces = Workspaces(pool)
        for who in (first_user, second_user):
            await workspaces.switch(who, team.workspace_id)
        first = asyncio.create_task(_turn(busy, first_user, "cap-run-1", HeadlessSurface()))
        async with asyncio.timeout(10):
            while "cap-run-1" not in busy.journal._running:  # type: ignore[union-attr]
                await asyncio.sleep(0.05)
        refused = HeadlessSurface()
        outcome = await _turn(other, second_user, "cap-run-2", refused)
        assert outcome.status == "refused"
        assert refused.errors == [
            "Not started: your team already has 1 run going at once, the most its admins "
            "allow. Send this again when one of them has finished."
        ]
        assert (await first).status == "done"
        assert (await _turn(other, second_user, "cap-run-2", HeadlessSurface())).status == "done"
    finally:
        await close_busy()
        await close_other()


@dataclass
class Runtime:
    """What the workspace page reads from the worker's start-up (ui/runtime.AppRuntime)."""

    settings: Settings
    workspaces: Workspaces
    public_url: str = "http://test"
    revocations: Any = None
    agents: tuple[Any, ...] = ()


def client_as(pool: Pool, user_id: str) -> httpx.AsyncClient:
    app = FastAPI()
    app.include_router(build_router())
    runtime = Runtime(settings=Settings(), workspaces=Workspaces(pool))
    app.dependency_overrides[current_runtime] = lambda: runtime
    app.dependency_overrides[identity._session_claims] = lambda: {"identifier": user_id}
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


async def test_managers_set_the_teams_limits_and_see_its_month(pools):
    owner, admin, member, stranger = new_user(), new_user(), new_user(), new_user()
    workspaces = Workspaces(pools[0])
    team = await workspaces.create(owner, "Limits")
    await workspaces.accept(admin, (await workspaces.invite(team, ADMIN))[0])
    await workspaces.accept(member, (await workspaces.invite(team, MEMBER))[0])
    await spend(ledger(pools[0]), member, 1234, team.workspace_id)
    limits = f"/api/workspaces/{team.workspace_id}/limits"
    body = {"budget": {"tokens": 50_000, "cost": 12.5}, "max_runs": 3}

    async with client_as(pools[0], admin) as client:
        saved = await client.post(limits, json=body, headers=PAGE)
        assert saved.status_code == 200
        assert saved.json() == body
        # A field left out keeps its setting; zero is no limit.
        saved = await client.post(limits, json={"max_runs": 0}, headers=PAGE)
        assert saved.json() == {"budget": {"tokens": 50_000, "cost": 12.5}, "max_runs": None}
        shown = (await client.get(f"/api/workspaces/{team.workspace_id}")).json()
    assert shown["limits"]["budget"] == {"tokens": 50_000, "cost": 12.5}
    assert shown["limits"]["month"]["tokens"] == 1234
    assert shown["limits"]["month"]["runs"] == 1
    assert [u["tokens"] for u in shown["usage"] if u["user_id"] == member] == [1234]
    changes = [
        e["detail"]
        for e in await workspaces.audit_log(team.workspace_id)
        if e["action"] == "settings.changed"
    ]
    assert changes == [{"max_runs": None}, body]

    # A member, a stranger, a made-up id and a personal workspace all get the same 404.
    for who, target in (
        (member, team.workspace_id),
        (stranger, team.workspace_id),
        (admin, "w-" + "0" * 32),
        (admin, personal_id(admin)),
    ):
        async with client_as(pools[0], who) as client:
            refused = await client.post(
                f"/api/workspaces/{target}/limits", json={"max_runs": 50}, headers=PAGE
            )
            assert (refused.status_code, refused.json()) == (404, {"detail": "Workspace not found"})
            shown = (await client.get(f"/api/workspaces/{target}")).json()
            assert "limits" not in shown
    assert (await workspaces.settings(team.workspace_id))["max_runs"] is None


@pytest.mark.parametrize(
    "body",
    [
        {"budget": {"tokens": -1}},
        {"budget": {"tokens": 10**13}},
        {"budget": {"tokens": 2.5}},
        {"budget": {"tokens": "100"}},
        {"budget": {"tokens": True}},
        {"budget": {"cost": -0.01}},
        {"budget": {"cost": 1e12}},
        {"budget": {"cost": "lots"}},
        {"max_runs": -1},
        {"max_runs": 100_000},
        {"max_runs": "2"},
        {"budget": "none"},
    ],
)
async def test_bad_limits_are_refused_and_nothing_changes(pools, body):
    owner = new_user()
    workspaces = Workspaces(pools[0])
    team = await workspaces.create(owner, "Validated")
    async with client_as(pools[0], owner) as client:
        refused = await client.post(
            f"/api/workspaces/{team.workspace_id}/limits", json=body, headers=PAGE
        )
    assert refused.status_code == 422
    assert await workspaces.settings(team.workspace_id) == {}
