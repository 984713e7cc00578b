"""Persistence on a real Postgres: migrations, the embedding record, semantic search, reconnects, resume."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from graphs.assistant.graph import build_graph
from graphs.core import pool as pool_module
from graphs.core.context import Context
from graphs.core.embeddings import EmbeddingModelChanged, EmbeddingSpec, check_embedding_record
from graphs.core.migrations import MIGRATIONS, migrate
from graphs.core.offline import OfflineChatModel
from graphs.core.persistence import Persistence, Pool, make_pool, open_persistence
from graphs.core.settings import Settings
from tests.conftest import create_database

pytestmark = pytest.mark.integration

ALL_MIGRATIONS = [migration.id for migration in MIGRATIONS]
# The order start-up applied them in before they were one list: graphs.core's own, then the
# ones ui/runtime.py passed as extras (local auth, the job queue, the Planner's demo data).
OLD_ORDER = (
    "0001_core",
    "0002_chainlit",
    "0006_privacy",
    "0007_research_fetch_log",
    "0003_local_auth",
    "0004_procrastinate",
    "0005_memory_dead_letters",
    "0100_analytics_demo",
)


async def applied_migrations(persistence: Persistence) -> list[str]:
    async with persistence.pool.connection() as conn:
        cur = await conn.execute("SELECT name FROM cairn_migrations ORDER BY name")
        return [row["name"] for row in await cur.fetchall()]


async def test_migrations_run_again_apply_nothing(persistence: Persistence) -> None:
    assert await migrate(persistence.pool) == []
    assert await applied_migrations(persistence) == sorted(ALL_MIGRATIONS)


async def test_concurrent_migrations_from_two_workers_apply_each_once(pg_server_url: str) -> None:
    url = create_database(pg_server_url)
    pools = [make_pool(url, max_size=2), make_pool(url, max_size=2)]
    for pool in pools:
        await pool.open(wait=True)
    try:
        results = await asyncio.gather(*(migrate(pool) for pool in pools))
    finally:
        for pool in pools:
            await pool.close()

    applied = [name for result in results for name in result]
    assert sorted(applied) == sorted(ALL_MIGRATIONS)


async def test_a_database_migrated_in_the_old_order_applies_nothing_again(
    pg_server_url: str,
) -> None:
    # A database made before the migrations were one ordered list recorded the same ids in
    # another order (and the extras under the same names): none may run a second time.
    # Migrations added since (e.g. 0008_runs) are the only ones left to run.
    by_id = {migration.id: migration for migration in MIGRATIONS}
    newer = [m.id for m in MIGRATIONS if m.id not in OLD_ORDER]
    assert set(OLD_ORDER) <= set(by_id)
    assert newer == [
        "0008_runs",
        "0009_time_travel",
        "0101_embedding_reembed",
        "0102_access_tokens",
        "0103_fence_check",
        "0104_checkpoint_prune",
        "0105_worker_leases",
        "0106_sign_out",
        "0107_usage",
        "0108_shared_limits",
        "0109_run_edits",
        "0110_element_files",
        "0111_usage_roles",
        "0112_workspaces",
        "0113_reviews",
        "0114_workspace_wipe",
        "0115_thread_shares",
        "0116_team_limits",
    ]
    pool = make_pool(create_database(pg_server_url), max_size=2)
    await pool.open(wait=True)
    try:
        assert await migrate(pool, tuple(by_id[i] for i in OLD_ORDER)) == list(OLD_ORDER)
        assert await migrate(pool) == newer
        assert await migrate(pool) == []
    finally:
        await pool.close()


async def test_a_database_missing_later_migrations_gets_just_those_in_order(
    pg_server_url: str,
) -> None:
    # As a database set up with graphs.core's own migrations only (no extras) was left.
    partial = ("0001_core", "0002_chainlit", "0006_privacy", "0007_research_fetch_log")
    pool = make_pool(create_database(pg_server_url), max_size=2)
    await pool.open(wait=True)
    try:
        await migrate(pool, tuple(m for m in MIGRATIONS if m.id in partial))
        assert await migrate(pool) == [m.id for m in MIGRATIONS if m.id not in partial]
    finally:
        await pool.close()


async def test_two_workers_starting_together_on_a_fresh_database_both_start(
    pg_server_url: str, embedding: EmbeddingSpec, tmp_path: Path
) -> None:
    # Scaling out: several workers boot at once against one new database. Everything
    # open_persistence sets up (Cairn's migrations, the saver's and the store's tables) must
    # tolerate that, not just Cairn's own migrations.
    url = create_database(pg_server_url)
    settings = Settings(_env_file=None, data_dir=tmp_path)  # type: ignore[call-arg]
    results = await asyncio.gather(
        *(
            open_persistence(
                settings,
                pool=make_pool(url, max_size=2),
                embedding=embedding,
            )
            for _ in range(3)
        ),
        return_exceptions=True,
    )
    for result in results:
        if isinstance(result, Persistence):
            await result.close()

    failures = [r for r in results if isinstance(r, BaseException)]
    assert failures == []


async def test_the_embedding_model_is_recorded(
    persistence: Persistence, embedding: EmbeddingSpec
) -> None:
    async with persistence.pool.connection() as conn:
        cur = await conn.execute("SELECT value FROM cairn_meta WHERE key = 'embedding'")
        row = await cur.fetchone()

    assert row is not None
    assert row["value"] == {"name": embedding.name, "dims": embedding.dims}
    await check_embedding_record(persistence.pool, embedding)  # same model: starts fine


@pytest.mark.parametrize(
    ("name", "dims"),
    [("openai:text-embedding-3-small", 384), (None, 1536)],
    ids=["other-model", "other-dims"],
)
async def test_a_changed_embedding_model_refuses_to_start(
    persistence: Persistence, embedding: EmbeddingSpec, name: str | None, dims: int
) -> None:
    changed = EmbeddingSpec(name or embedding.name, dims, embedding.embeddings)

    with pytest.raises(EmbeddingModelChanged) as caught:
        await check_embedding_record(persistence.pool, changed)

    message = str(caught.value)
    assert embedding.name in message
    assert changed.name in message
    assert f"({embedding.dims} dims)" in message
    assert f"({dims} dims)" in message
    # The refusal leaves the record alone, so switching back works.
    await check_embedding_record(persistence.pool, embedding)


async def test_semantic_search_finds_the_relevant_memory_first(persistence: Persistence) -> None:
    store = persistence.store
    u1 = ("memories", "search-u1")
    facts = {
        "diet": "I am vegetarian",
        "sister": "My sister lives in Lisbon",
        "job": "I work night shifts as a nurse",
        "car": "I drive an old blue Volvo",
    }
    for key, content in facts.items():
        await store.aput(u1, key, {"content": content})

    results = await store.asearch(u1, query="What food should I cook for dinner?", limit=4)

    assert results[0].key == "diet"
    assert results[0].score is not None
    assert results[0].score > results[-1].score


async def test_search_never_crosses_into_another_users_namespace(
    persistence: Persistence,
) -> None:
    store = persistence.store
    await store.aput(("memories", "ns-u1"), "diet", {"content": "I am vegetarian"})
    # Closer to the query than u1's own memory, and in namespaces that share a text prefix.
    await store.aput(("memories", "ns-u2"), "diet", {"content": "What should I eat for dinner"})
    await store.aput(("memories", "ns-u10"), "diet", {"content": "Dinner: I eat steak"})
    await store.aput(("memories", "ns-u1x"), "diet", {"content": "Dinner food I eat"})

    results = await store.asearch(("memories", "ns-u1"), query="What should I eat for dinner?")
    listed = await store.asearch(("memories", "ns-u1"), limit=50)

    assert [r.namespace for r in results] == [("memories", "ns-u1")]
    assert [r.namespace for r in listed] == [("memories", "ns-u1")]


async def pool_whose_backends_were_terminated(database_url: str, name: str) -> Pool:
    """An open pool (own application_name) whose connections Postgres has just terminated."""
    separator = "&" if "?" in database_url else "?"
    pool = make_pool(f"{database_url}{separator}application_name={name}", min_size=2, max_size=2)
    await pool.open(wait=True)
    async with pool.connection() as conn:
        await conn.execute("SELECT 1")  # used moments ago, as on a busy server
    with psycopg.connect(database_url, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (name,),
        ).fetchall()
        assert len(killed) == 2
        for _ in range(100):  # termination is asynchronous
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
            ).fetchone()
            if row is not None and row[0] == 0:
                break
            await asyncio.sleep(0.05)
    return pool


async def test_the_next_query_after_postgres_drops_the_connections_works(
    database_url: str,
) -> None:
    # A failover or an operator's pg_terminate_backend can come at any moment, not only
    # after the connections sat idle; no request should fail on a connection Postgres closed.
    pool = await pool_whose_backends_were_terminated(database_url, "cairn-dropped-now")
    try:
        for _ in range(3):  # each of the pool's connections in turn
            async with pool.connection() as conn:
                cur = await conn.execute("SELECT 1 AS ok")
                row = await cur.fetchone()
                assert row is not None
                assert row["ok"] == 1
    finally:
        await pool.close()


async def test_connections_dropped_while_idle_are_replaced(database_url: str) -> None:
    pool = await pool_whose_backends_were_terminated(database_url, "cairn-dropped-idle")
    # The pool skips its check for recently returned connections; wait that window out.
    await asyncio.sleep(pool_module.CHECK_IDLE_AFTER_S + 0.2)
    try:
        for _ in range(3):
            async with pool.connection() as conn:
                cur = await conn.execute("SELECT 1 AS ok")
                row = await cur.fetchone()
                assert row is not None
                assert row["ok"] == 1
    finally:
        await pool.close()


async def test_a_thread_resumes_after_a_restart_without_duplicated_history(
    persistence: Persistence,
) -> None:
    config: dict[str, Any] = {"configurable": {"thread_id": "resume-after-restart"}}
    context = Context(user_id="u1", thread_id="resume-after-restart")
    before = build_graph(
        checkpointer=persistence.checkpointer, store=persistence.store, model=OfflineChatModel()
    )
    await before.ainvoke({"messages": [HumanMessage("first")]}, config, context=context)
    await before.ainvoke({"messages": [HumanMessage("second")]}, config, context=context)
    assert len((await before.aget_state(config)).values["messages"]) == 4

    # A new process: new graph object, new saver, same database.
    after = build_graph(
        checkpointer=AsyncPostgresSaver(persistence.pool),  # type: ignore[arg-type]
        store=persistence.store,
        model=OfflineChatModel(),
    )
    assert len((await after.aget_state(config)).values["messages"]) == 4
    await after.ainvoke({"messages": [HumanMessage("third")]}, config, context=context)

    messages = (await after.aget_state(config)).values["messages"]
    assert [type(m) for m in messages] == [HumanMessage, AIMessage] * 3
    assert [m.text for m in messages[::2]] == ["first", "second", "third"]
    assert "third" in messages[-1].text
    assert len({m.id for m in messages}) == 6


async def test_a_threads_hot_queries_are_prepared_and_turns_stay_correct(
    persistence: Persistence, database_url: str
) -> None:
    # One connection, so every query below runs on it: the saver's read of the thread and
    # the store's recall reads are prepared server-side once repeated, and answers are unchanged.
    pool = make_pool(database_url, min_size=1, max_size=1)
    await pool.open(wait=True)
    try:
        saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
        graph = build_graph(checkpointer=saver, store=persistence.store, model=OfflineChatModel())
        config: dict[str, Any] = {"configurable": {"thread_id": "prepared-turns"}}
        context = Context(user_id="u1", thread_id="prepared-turns")
        for turn in range(8):
            await graph.ainvoke(
                {"messages": [HumanMessage(f"turn {turn}")]}, config, context=context
            )
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT statement FROM pg_prepared_statements")
            prepared = [row["statement"] for row in await cur.fetchall()]
        messages = (await graph.aget_state(config)).values["messages"]
    finally:
        await pool.close()

    assert any("from checkpoints" in s and "checkpoint_blobs" in s for s in prepared), prepared
    assert [m.text for m in messages[::2]] == [f"turn {n}" for n in range(8)]
    assert all(f"turn {n}" in messages[2 * n + 1].text for n in range(8))
