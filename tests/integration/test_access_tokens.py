"""Personal access tokens on a real Postgres: hashed, refused when expired, revoked or wiped, and
limits that hold across workers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from auth.sessions import SessionRevocations
from auth.tokens import (
    AccessTokens,
    LimitExceeded,
    TokenInfo,
    TokenLimits,
    TokenRejected,
    hash_token,
)
from graphs.core.migrations import migrate
from graphs.core.persistence import Pool, make_pool
from graphs.core.runs import CALL_LAPSED, RunJournal

pytestmark = pytest.mark.integration

SCOPES = ("assistant", "planner")
"""The app passes the agents offered over MCP (ui.mcp_server.token_scopes)."""
ROOMY = TokenLimits(max_concurrent=5, max_runs_per_hour=50, max_model_calls=10)


@pytest.fixture(scope="module")
async def pools(database_url: str) -> AsyncIterator[list[Pool]]:
    """Two pools on one database: two workers."""
    found = [make_pool(database_url, max_size=4), make_pool(database_url, max_size=4)]
    for pool in found:
        await pool.open(wait=True)
    await migrate(found[0])
    yield found
    for pool in found:
        await pool.close()


async def make(
    tokens: AccessTokens, user: str = "alice", limits: TokenLimits = ROOMY
) -> tuple[str, TokenInfo]:
    made = await tokens.create(
        user, name="t", scopes=frozenset({"assistant"}), days=7, limits=limits
    )
    return made.secret, made.info


async def test_only_a_hash_is_stored_and_the_token_stands_for_its_user(pools: list[Pool]) -> None:
    tokens = AccessTokens(pools[0], scopes=SCOPES)
    secret, info = await make(tokens)
    async with pools[0].connection() as conn:
        cur = await conn.execute("SELECT * FROM cairn_access_tokens WHERE id = %s", (info.id,))
        row = await cur.fetchone()
    assert row is not None
    assert secret not in {str(v) for v in row.values()}
    assert row["token_hash"] == hash_token(secret)
    assert (await tokens.verify(secret)).user_id == "alice"
    assert (await tokens.owned("alice"))[0].last_used_at is not None


@pytest.mark.parametrize(
    "secret", [None, "", "cairn_pat_unknown", "not-a-token", "cairn_pat_" * 40]
)
async def test_a_missing_or_unknown_token_is_refused(pools: list[Pool], secret: str | None) -> None:
    with pytest.raises(TokenRejected):
        await AccessTokens(pools[0], scopes=SCOPES).verify(secret)


async def test_expired_and_revoked_tokens_are_refused(pools: list[Pool]) -> None:
    tokens = AccessTokens(pools[0], scopes=SCOPES)
    expired, expired_info = await make(tokens)
    async with pools[0].connection() as conn:
        await conn.execute(
            "UPDATE cairn_access_tokens SET expires_at = now() - interval '1 second' WHERE id = %s",
            (expired_info.id,),
        )
    with pytest.raises(TokenRejected):
        await tokens.verify(expired)

    revoked, revoked_info = await make(tokens)
    assert not await tokens.revoke("bob", revoked_info.id)  # not his: nothing happens
    assert (await tokens.verify(revoked)).id == revoked_info.id
    assert await tokens.revoke("alice", revoked_info.id)
    with pytest.raises(TokenRejected):
        await AccessTokens(pools[1], scopes=SCOPES).verify(revoked)  # on the other worker too
    listed = {t.id: t for t in await tokens.owned("alice")}
    assert listed[revoked_info.id].revoked_at is not None
    assert not listed[expired_info.id].active


async def test_a_wipe_cut_off_ends_the_accounts_tokens_like_its_sessions(
    pools: list[Pool],
) -> None:
    revocations = SessionRevocations(pools[0])
    tokens = AccessTokens(pools[0], scopes=SCOPES, cut_off=revocations)
    secret, _ = await make(tokens, user="carol")
    assert (await tokens.verify(secret)).user_id == "carol"
    await revocations.revoke("carol")
    with pytest.raises(TokenRejected):
        await AccessTokens(pools[1], scopes=SCOPES, cut_off=SessionRevocations(pools[1])).verify(
            secret
        )


async def test_concurrent_runs_are_limited_across_workers(pools: list[Pool]) -> None:
    limits = TokenLimits(max_concurrent=2, max_runs_per_hour=50, max_model_calls=10)
    _, info = await make(AccessTokens(pools[0], scopes=SCOPES), limits=limits)
    workers = [AccessTokens(pools[0], scopes=SCOPES), AccessTokens(pools[1], scopes=SCOPES)]

    async def begin(i: int) -> int | str:
        try:
            return await workers[i % 2].begin_call(info, "ask_assistant", None)
        except LimitExceeded as exc:
            return str(exc)

    results = await asyncio.gather(*(begin(i) for i in range(6)))
    started = [r for r in results if isinstance(r, int)]
    refused = [r for r in results if isinstance(r, str)]
    assert len(started) == 2
    assert len(refused) == 4
    assert all("2 at once" in r for r in refused)
    await workers[0].finish_call(started[0], status="done", thread_id="t", model_calls=3)
    assert isinstance(await workers[1].begin_call(info, "ask_assistant", None), int)


async def test_runs_per_hour_count_started_runs_not_refusals(pools: list[Pool]) -> None:
    limits = TokenLimits(max_concurrent=5, max_runs_per_hour=2, max_model_calls=10)
    tokens = AccessTokens(pools[0], scopes=SCOPES)
    _, info = await make(tokens, limits=limits)
    for _ in range(2):
        call = await tokens.begin_call(info, "research", None)
        await tokens.finish_call(call, status="done", thread_id="t", model_calls=1)
    for _ in range(2):
        with pytest.raises(LimitExceeded, match="2 per hour"):
            await tokens.begin_call(info, "research", None)
    logged = await tokens.calls(info.id, "alice")
    assert [c["status"] for c in logged] == ["refused", "refused", "done", "done"]
    assert await tokens.calls(info.id, "bob") == []
    # An hour later the window has moved on.
    async with pools[0].connection() as conn:
        await conn.execute(
            "UPDATE cairn_token_calls SET started_at = now() - interval '61 minutes' "
            "WHERE token_id = %s",
            (info.id,),
        )
    assert isinstance(await tokens.begin_call(info, "research", None), int)


STALE_S = 5.0


async def postgres_up_for(pool: Pool, seconds: float) -> None:
    """Sweeps wait until every live worker could beat since Postgres started."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT extract(epoch FROM now() - pg_postmaster_start_time()) AS up"
        )
        row = await cur.fetchone()
    assert row is not None
    await asyncio.sleep(max(0.0, seconds + 0.5 - float(row["up"])))


async def test_a_call_is_closed_when_its_workers_lease_lapses_and_only_then(
    pools: list[Pool],
) -> None:
    """Two workers run a call each; one stops beating. Any live worker's sweep closes that
    worker's call (its place is free again) and leaves the live one's, however old."""
    limits = TokenLimits(max_concurrent=2, max_runs_per_hour=50, max_model_calls=10)
    tokens = AccessTokens(pools[0], scopes=SCOPES)
    _, info = await make(tokens, limits=limits)
    live, dead = RunJournal(pools[0], worker="w-live"), RunJournal(pools[1], worker="w-dead")
    for journal in (live, dead):
        await journal.beat()
    running = await tokens.begin_call(info, "ask_assistant", "t-live", worker=live.worker)
    stranded = await tokens.begin_call(info, "ask_assistant", "t-dead", worker=dead.worker)
    with pytest.raises(LimitExceeded):
        await tokens.begin_call(info, "ask_assistant", None, worker=live.worker)
    async with pools[0].connection() as conn:  # both calls started a while ago; one worker died
        await conn.execute(
            "UPDATE cairn_token_calls SET started_at = now() - interval '10 minutes' "
            "WHERE id = ANY(%s)",
            ([running, stranded],),
        )
        await conn.execute(
            "UPDATE cairn_workers SET heartbeat_at = now() - interval '1 minute' "
            "WHERE worker_id = %s",
            (dead.worker,),
        )
    await postgres_up_for(pools[0], STALE_S)
    await live.beat()

    await RunJournal(pools[1], worker="w-sweeper").take_stranded(stale_s=STALE_S)
    by_id = {c["thread_id"]: c for c in await tokens.calls(info.id, "alice")}
    assert (by_id["t-dead"]["status"], by_id["t-dead"]["detail"]) == ("interrupted", CALL_LAPSED)
    assert by_id["t-live"]["status"] == "running"
    assert by_id["t-live"]["finished_at"] is None
    assert isinstance(await tokens.begin_call(info, "ask_assistant", None, worker="w-live"), int)

    # A worker that was only cut off comes back: its lease again, and the call's real end.
    await dead.beat()
    await tokens.finish_call(stranded, status="done", thread_id="t-dead", model_calls=2)
    await RunJournal(pools[1], worker="w-sweeper").take_stranded(stale_s=STALE_S)
    statuses = {c["thread_id"]: c["status"] for c in await tokens.calls(info.id, "alice")}
    assert statuses["t-dead"] == "done"
    assert statuses["t-live"] == "running"
