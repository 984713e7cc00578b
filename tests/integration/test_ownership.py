"""Thread ownership on a real Postgres: recorded at creation, one winner, one refusal for all."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from auth.ownership import (
    NOT_FOUND,
    ThreadNotFound,
    claim_thread,
    http_refusal,
    owned_thread_ids,
    require_owner,
)
from graphs.core.persistence import Persistence

pytestmark = pytest.mark.integration


def new_thread() -> str:
    return f"thread-{uuid.uuid4()}"


async def test_claiming_a_new_thread_records_the_owner(persistence: Persistence) -> None:
    thread = new_thread()

    await claim_thread(persistence.pool, thread_id=thread, user_id="alice", agent="assistant")

    assert (
        await require_owner(persistence.pool, thread_id=thread, user_id="alice")
    ).agent == "assistant"


async def test_the_owner_can_claim_again(persistence: Persistence) -> None:
    thread = new_thread()
    await claim_thread(persistence.pool, thread_id=thread, user_id="alice", agent="assistant")

    await claim_thread(persistence.pool, thread_id=thread, user_id="alice", agent="assistant")

    assert (
        await require_owner(persistence.pool, thread_id=thread, user_id="alice")
    ).agent == "assistant"
    assert (await owned_thread_ids(persistence.pool, user_id="alice")).count(thread) == 1


async def test_a_thread_keeps_the_agent_it_started_with(persistence: Persistence) -> None:
    thread = new_thread()
    await claim_thread(persistence.pool, thread_id=thread, user_id="alice", agent="assistant")

    await claim_thread(persistence.pool, thread_id=thread, user_id="alice", agent="planner")

    assert (
        await require_owner(persistence.pool, thread_id=thread, user_id="alice")
    ).agent == "assistant"


async def test_another_user_cannot_claim_an_owned_thread(persistence: Persistence) -> None:
    thread = new_thread()
    await claim_thread(persistence.pool, thread_id=thread, user_id="alice", agent="assistant")

    with pytest.raises(ThreadNotFound):
        await claim_thread(persistence.pool, thread_id=thread, user_id="mallory", agent="assistant")

    assert (
        await require_owner(persistence.pool, thread_id=thread, user_id="alice")
    ).agent == "assistant"
    assert thread not in await owned_thread_ids(persistence.pool, user_id="mallory")


async def test_unknown_and_foreign_threads_get_the_same_refusal(persistence: Persistence) -> None:
    foreign = new_thread()
    await claim_thread(persistence.pool, thread_id=foreign, user_id="alice", agent="assistant")

    with pytest.raises(ThreadNotFound) as on_unknown:
        await require_owner(persistence.pool, thread_id=new_thread(), user_id="mallory")
    with pytest.raises(ThreadNotFound) as on_foreign:
        await require_owner(persistence.pool, thread_id=foreign, user_id="mallory")

    assert type(on_unknown.value) is type(on_foreign.value)
    assert str(on_unknown.value) == str(on_foreign.value) == NOT_FOUND
    assert http_refusal().status_code == 404
    assert http_refusal().detail == NOT_FOUND


async def test_a_refused_user_sees_nothing_of_the_owner(persistence: Persistence) -> None:
    thread = new_thread()
    await claim_thread(persistence.pool, thread_id=thread, user_id="alice", agent="assistant")

    with pytest.raises(ThreadNotFound) as caught:
        await require_owner(persistence.pool, thread_id=thread, user_id="mallory")

    assert "alice" not in str(caught.value)
    assert thread not in str(caught.value)


async def test_concurrent_claims_of_a_new_thread_have_exactly_one_winner(
    persistence: Persistence,
) -> None:
    for _ in range(10):
        thread = new_thread()
        users = ["alice", "mallory"]

        results = await asyncio.gather(
            *(
                claim_thread(persistence.pool, thread_id=thread, user_id=user, agent="assistant")
                for user in users
            ),
            return_exceptions=True,
        )

        winners = [
            user
            for user, result in zip(users, results, strict=True)
            if not isinstance(result, BaseException) and result.agent == "assistant"
        ]
        losers = [result for result in results if isinstance(result, ThreadNotFound)]
        assert len(winners) == 1
        assert len(losers) == 1
        [winner] = winners
        assert await require_owner(persistence.pool, thread_id=thread, user_id=winner)
        loser = next(user for user in users if user != winner)
        with pytest.raises(ThreadNotFound):
            await require_owner(persistence.pool, thread_id=thread, user_id=loser)


async def test_owned_thread_ids_lists_only_the_users_threads_in_order(
    persistence: Persistence,
) -> None:
    mine = [new_thread() for _ in range(3)]
    theirs = [new_thread() for _ in range(2)]
    for thread in mine:
        await claim_thread(persistence.pool, thread_id=thread, user_id="owner-x", agent="assistant")
    for thread in theirs:
        await claim_thread(persistence.pool, thread_id=thread, user_id="owner-y", agent="planner")

    assert await owned_thread_ids(persistence.pool, user_id="owner-x") == mine
    assert await owned_thread_ids(persistence.pool, user_id="owner-y") == theirs
    assert await owned_thread_ids(persistence.pool, user_id="nobody") == []
