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
