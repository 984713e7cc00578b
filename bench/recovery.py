"""Recovery after a Postgres restart: how long from Postgres being back until the pool serves,
a chat turn is answered, and a memory job deferred after the restart has run.

    .venv/bin/python -m bench.recovery [DOWN_SECONDS ...]     (default: 10 40)

On its own throwaway embedded Postgres (stopped and started with pg_ctl); one Assistant thread
with the offline model sends a message every 0.3 s throughout. For comparison the pool figure
is also taken with psycopg_pool's own reconnect backoff (uncapped doubling: 1, 2, 4 … s).
Figures go to stdout and bench/results/recovery.json.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from graphs.assistant.offline import offline_assistant
from graphs.core import pool as pool_module
from graphs.core.embeddings import LOCAL_MODEL_DIMS, EmbeddingSpec
from graphs.core.persistence import Persistence, make_pool, open_persistence
from graphs.core.runlock import ThreadRunLocks
from graphs.core.runs import RunJournal
from graphs.core.settings import Settings
from graphs.memory.jobs import MemoryJobs
from graphs.memory.scoped import ScopedMemory
from tests.conftest import create_database
from tests.integration.test_durable_runs import FixedEmbeddings
from tests.pg_restart import RestartablePostgres
from ui.agents import assistant as assistant_agent
from ui.runner import PostgresThreads, Runner
from ui.surface import HeadlessSurface

RESULTS = Path(__file__).parent / "results" / "recovery.json"
POOL_TIMEOUT_S = 10.0  # the app's default (CAIRN_POOL_TIMEOUT_S)
GIVE_UP_S = 120.0


async def until(check: Any, *, what: str) -> float:
    """Seconds until check() first succeeds (exceptions count as not yet)."""
    started = time.monotonic()
    while time.monotonic() - started < GIVE_UP_S:
        try:
            if await check():
                return time.monotonic()
        except Exception:  # Postgres still away
            pass
        await asyncio.sleep(0.05)
    msg = f"{what} never happened"
    raise RuntimeError(msg)


async def select_one(db: Persistence) -> bool:
    async with db.pool.connection(timeout=1) as conn:
        await conn.execute("SELECT 1")
    return True


async def pool_only(pg: RestartablePostgres, url: str, down_s: float) -> float:
    """A bare pool that had connections before the restart and is used again after it."""
    pool = make_pool(url, max_size=4, timeout=POOL_TIMEOUT_S)
    await pool.open(wait=True)
    try:
        async with pool.connection() as conn:
            await conn.execute("SELECT 1")
        await asyncio.to_thread(pg.stop)
        failing = asyncio.create_task(_keep_trying(pool))
        await asyncio.sleep(down_s)
        await asyncio.to_thread(pg.start)
        assert pg.started_at is not None
        await failing
        return time.monotonic() - pg.started_at
    finally:
        await pool.close()


async def _keep_trying(pool: Any) -> None:
    while True:
        try:
            async with pool.connection(timeout=POOL_TIMEOUT_S) as conn:
                await conn.execute("SELECT 1")
            return
        except Exception:
            await asyncio.sleep(0.05)


async def app_recovery(pg: RestartablePostgres, db: Persistence, down_s: float) -> dict[str, float]:
    graph = assistant_agent.SPEC.build(
        checkpointer=db.checkpointer, store=db.store, model=offline_assistant()
    )

    async def load_messages(thread_id: str) -> list[Any]:
        state = await graph.aget_state({"configurable": {"thread_id": thread_id}})
        return list(state.values.get("messages", []))

    jobs = MemoryJobs(
        pool=db.pool,
        store=db.store,
        model=offline_assistant(),
        load_messages=load_messages,
        idle_seconds=0.0,
    )
    await jobs.open()
    jobs.start_worker()
    locks = ThreadRunLocks(db.pool)
    runner = Runner(
        agents=[assistant_agent.SPEC],
        graphs={"assistant": graph},
        threads=PostgresThreads(db.pool),
        locks=locks,
        services=SimpleNamespace(memory_jobs=None),
        journal=RunJournal(db.pool),
    )
    user, thread = f"user-{uuid.uuid4()}", f"thread-{uuid.uuid4()}"
    replies: list[float] = []
    stop = asyncio.Event()

    async def chat() -> None:
        for i in range(2000):
            if stop.is_set():
                return
            outcome = await runner.message(
                HeadlessSurface(),
                user_id=user,
                thread_id=thread,
                profile="Assistant",
                text=f"message {i}",
                message_id=str(uuid.uuid4()),
                temporary=False,
            )
            if outcome.status == "done":
                replies.append(time.monotonic())
            await asyncio.sleep(0.3)

    chatting = asyncio.create_task(chat())
    try:
        await asyncio.sleep(2.0)
        await asyncio.to_thread(pg.stop)
        await asyncio.sleep(down_s)
        await asyncio.to_thread(pg.start)
        assert pg.started_at is not None
        back = pg.started_at
        pool_at = await until(lambda: select_one(db), what="the pool serving")

        async def answered() -> bool:
            return any(at > back for at in replies)

        reply_at = await until(answered, what="a reply")
        writer, writer_thread = f"user-{uuid.uuid4()}", f"thread-{uuid.uuid4()}"
        await runner.message(
            HeadlessSurface(),
            user_id=writer,
            thread_id=writer_thread,
            profile="Assistant",
            text="I live in Lisbon",
            message_id=str(uuid.uuid4()),
            temporary=False,
        )
        deferred_at = time.monotonic()
        await jobs.message_arrived(user_id=writer, thread_id=writer_thread)

        async def remembered() -> bool:
            return bool(await ScopedMemory(db.store, writer).all_memories())

        job_at = await until(remembered, what="the memory job")
        return {
            "pool_s": pool_at - back,
            "first_reply_s": reply_at - back,
            "job_after_defer_s": job_at - deferred_at,
            "job_worker_starts": float(jobs.worker_starts),
        }
    finally:
        stop.set()
        await chatting
        await jobs.stop()
        await locks.close()


async def main(downs: list[float]) -> None:
    pg = RestartablePostgres()
    results: dict[str, Any] = {}
    try:
        url = create_database(pg.url)
        db = await open_persistence(
            Settings(data_dir=Path(tempfile.mkdtemp())),
            pool=make_pool(url, max_size=10, timeout=POOL_TIMEOUT_S),
            embedding=EmbeddingSpec("test:fixed", LOCAL_MODEL_DIMS, FixedEmbeddings()),
        )
        try:
            for down in downs:
                app = await app_recovery(pg, db, down)
                capped = await pool_only(pg, url, down)
                pool_module.RECONNECT_EVERY_S = float("inf")  # psycopg_pool's own backoff
                try:
                    uncapped = await pool_only(pg, url, down)
                finally:
                    pool_module.RECONNECT_EVERY_S = 1.0
                results[f"down_{down:g}s"] = {
                    **app,
                    "bare_pool_s": capped,
                    "bare_pool_uncapped_backoff_s": uncapped,
                }
                print(
                    f"Postgres down {down:g} s, then back: pool serving after {app['pool_s']:.2f} s, "
                    f"first chat reply after {app['first_reply_s']:.2f} s, a memory job deferred "
                    f"then ran in {app['job_after_defer_s']:.2f} s (job worker started "
                    f"{app['job_worker_starts']:.0f}x); a bare pool served after {capped:.2f} s "
                    f"(psycopg_pool's own backoff: {uncapped:.2f} s)",
                    flush=True,
                )
        finally:
            await db.close()
    finally:
        pg.close()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main([float(a) for a in sys.argv[1:]] or [10.0, 40.0]))
