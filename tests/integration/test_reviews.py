"""Four-eyes approval on a real Postgres, through the real runner and the offline Planner: a
team plan waits for a reviewer, is decided once, and goes on when carried out, on any worker."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from auth.ownership import claim_thread
from auth.reviews import AlreadyDecided, ReviewNotFound, Reviews
from auth.workspaces import MEMBER, REVIEWER, WorkspaceNotFound, Workspaces
from tests.integration.test_durable_runs import (
    GOAL,
    chainlit_thread,
    chat_port,
    make_runner,
    stored_replies,
)
from ui.recovery import carry_out
from ui.runner import NEEDS_REVIEWER, WAITING_FOR_REVIEWER
from ui.surface import HeadlessSurface

pytestmark = pytest.mark.integration


def user() -> str:
    return f"user-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def runner(database_url: str):
    made, close = await make_runner(database_url, worker="reviews")
    made.reviews = Reviews(made.threads.pool)  # type: ignore[attr-defined]
    yield made
    await close()


async def team_with_review(pool: Any, *, required: bool = True) -> dict[str, Any]:
    """An owner, a member who asks, and two reviewers, in a team that wants Planner reviews."""
    workspaces = Workspaces(pool)
    owner, asker, first, second = user(), user(), user(), user()
    team = await workspaces.create(owner, "Reviewed")
    for who, role in ((asker, MEMBER), (first, REVIEWER), (second, REVIEWER)):
        await workspaces.accept(who, (await workspaces.invite(team, role))[0], display_name=who)
    await workspaces.update_settings(team, {"review": {"planner": required}})
    await workspaces.switch(asker, team.workspace_id)
    return {
        "workspaces": workspaces,
        "team": team,
        "asker": asker,
        "reviewers": [await workspaces.membership(r, team.workspace_id) for r in (first, second)],
    }


async def ask(runner: Any, asker: str, surface: HeadlessSurface | None = None) -> tuple[str, Any]:
    thread = str(uuid.uuid4())
    pool = runner.threads.pool
    await claim_thread(pool, thread_id=thread, user_id=asker, agent="planner")
    await chainlit_thread(runner, thread)
    outcome = await runner.message(
        surface or HeadlessSurface(),
        user_id=asker,
        thread_id=thread,
        profile="Planner",
        text=GOAL,
        message_id="m1",
        temporary=False,
    )
    assert outcome.status == "paused"
    return thread, outcome


async def test_a_team_plan_waits_for_a_reviewer_and_goes_on_once_approved(runner) -> None:
    pool = runner.threads.pool
    t = await team_with_review(pool)
    surface = HeadlessSurface()
    thread, paused = await ask(runner, t["asker"], surface)
    assert WAITING_FOR_REVIEWER in surface.errors
    [first, second] = t["reviewers"]
    [queued] = await runner.reviews.queue(first)
    assert queued.details["goal"] == GOAL
    assert queued.requester_name == t["asker"]

    # The requester's own Approve is refused and changes nothing; Edit and Reject stay theirs.
    refused = HeadlessSurface()
    own = await runner.answer(
        refused,
        user_id=t["asker"],
        thread_id=thread,
        interrupt_id=paused.interrupts[0].id,
        decision="approve",
    )
    assert own.status == "paused"
    assert NEEDS_REVIEWER in refused.errors
    assert [r.id for r in await runner.reviews.queue(first)] == [queued.id]

    decided = await runner.reviews.decide(first, queued.id, "approve")
    chat = chat_port(pool)
    done = await carry_out(runner, chat, runner.reviews, decided, "Approved by first.")
    assert done.status == "done"
    replies = await stored_replies(runner, thread)
    assert replies[0] == "Approved by first."
    assert "region" in replies[-1].lower()
    # Carried out again (a sweep after a worker stopped): the question is gone, nothing reruns.
    again = await carry_out(runner, chat, runner.reviews, decided)
    assert again.status == "refused"
    assert await stored_replies(runner, thread) == replies
    assert await runner.reviews.queue(second) == []
    actions = [e["action"] for e in await t["workspaces"].audit_log(t["team"].workspace_id)]
    assert actions[:2] == ["review.approve", "review.requested"]


async def test_two_reviewers_racing_decide_once(runner) -> None:
    t = await team_with_review(runner.threads.pool)
    await ask(runner, t["asker"])
    [first, second] = t["reviewers"]
    [queued] = await runner.reviews.queue(first)

    results = await asyncio.gather(
        runner.reviews.decide(first, queued.id, "approve"),
        runner.reviews.decide(second, queued.id, "reject"),
        return_exceptions=True,
    )

    assert sum(not isinstance(r, BaseException) for r in results) == 1
    assert any(isinstance(r, AlreadyDecided) for r in results)


async def test_an_edit_by_the_requester_withdraws_the_old_request_and_queues_the_new_plan(
    runner,
) -> None:
    t = await team_with_review(runner.threads.pool)
    thread, paused = await ask(runner, t["asker"])
    [first, _] = t["reviewers"]
    [old] = await runner.reviews.queue(first)

    async def feedback(_q: str, _s: int) -> str:
        return "Also break the churn down by plan tier"

    edited = await runner.answer(
        HeadlessSurface(),
        user_id=t["asker"],
        thread_id=thread,
        interrupt_id=paused.interrupts[0].id,
        decision="edit",
        ask=feedback,
    )

    assert edited.status == "paused"
    [new] = await runner.reviews.queue(first)
    assert new.id != old.id
    assert new.interrupt_id == edited.interrupts[0].id
    with pytest.raises(AlreadyDecided) as late:
        await runner.reviews.decide(first, old.id, "approve")
    assert late.value.status == "withdrawn"


async def test_nobody_outside_the_teams_reviewers_reaches_a_review(runner) -> None:
    pool = runner.threads.pool
    t = await team_with_review(pool)
    other = await team_with_review(pool)
    await ask(runner, t["asker"])
    [first, _] = t["reviewers"]
    [queued] = await runner.reviews.queue(first)
    workspaces = t["workspaces"]

    # A reviewer of another team: the review does not exist for them.
    with pytest.raises(ReviewNotFound):
        await runner.reviews.decide(other["reviewers"][0], queued.id, "approve")
    # The requester, the owner and a member are not reviewers here.
    for who in (t["asker"], t["team"].user_id):
        membership = await workspaces.membership(who, t["team"].workspace_id)
        with pytest.raises(WorkspaceNotFound):
            await runner.reviews.queue(membership)
    # A reviewer who asks for a plan never sees or decides their own.
    await workspaces.switch(first.user_id, t["team"].workspace_id)
    await ask(runner, first.user_id)
    assert [r.requester_id for r in await runner.reviews.queue(first)] == [t["asker"]]
    [own] = [
        r for r in await runner.reviews.queue(t["reviewers"][1]) if r.requester_id == first.user_id
    ]
    with pytest.raises(ReviewNotFound):
        await runner.reviews.decide(first, own.id, "approve")
    # A disabled requester's plans leave the queue.
    await workspaces.set_disabled(t["team"], t["asker"], disabled=True)
    assert [r.requester_id for r in await runner.reviews.queue(first)] == []


async def test_a_decision_its_worker_never_carried_out_is_taken_up_by_one_sweep(runner) -> None:
    pool = runner.threads.pool
    t = await team_with_review(pool)
    thread, _ = await ask(runner, t["asker"])
    [first, _] = t["reviewers"]
    [queued] = await runner.reviews.queue(first)
    await runner.reviews.decide(first, queued.id, "reject")  # ... and the worker stopped
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE cairn_reviews SET tried_at = now() - interval '1 minute' WHERE id = %s",
            (queued.id,),
        )

    taken = await asyncio.gather(
        runner.reviews.take_unapplied(stale_s=30), runner.reviews.take_unapplied(stale_s=30)
    )

    mine = [[r for r in batch if r.id == queued.id] for batch in taken]
    assert sorted(len(batch) for batch in mine) == [0, 1]
    [review] = [r for batch in mine for r in batch]
    outcome = await carry_out(runner, chat_port(pool), runner.reviews, review)
    assert outcome.status == "done"
    assert review.id not in [r.id for r in await runner.reviews.take_unapplied(stale_s=0)]
    state = await runner.graphs["planner"].aget_state({"configurable": {"thread_id": thread}})
    assert not state.interrupts


async def test_a_personal_plan_or_a_team_without_the_setting_is_the_requesters_to_approve(
    runner,
) -> None:
    pool = runner.threads.pool
    t = await team_with_review(pool, required=False)
    surface = HeadlessSurface()
    thread, paused = await ask(runner, t["asker"], surface)
    assert WAITING_FOR_REVIEWER not in surface.errors
    assert await runner.reviews.queue(t["reviewers"][0]) == []
    approved = await runner.answer(
        HeadlessSurface(),
        user_id=t["asker"],
        thread_id=thread,
        interrupt_id=paused.interrupts[0].id,
        decision="approve",
    )
    assert approved.status == "done"
