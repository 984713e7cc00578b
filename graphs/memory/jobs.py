"""Durable, debounced memory jobs on the shared Postgres (procrastinate), retried then dead-lettered."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import procrastinate
import psycopg
from procrastinate.exceptions import AlreadyEnqueued

from graphs.memory.scoped import ScopedMemory
from graphs.memory.writer import InvalidModelOutput, MessageLoader, write_memories

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from langchain_core.language_models import BaseChatModel
    from langgraph.store.base import BaseStore

    from graphs.core.pool import Pool

log = logging.getLogger("cairn.memory")

# Tables: procrastinate's (migration 0004_procrastinate) and memory_dead_letters (0005), in
# graphs/core/migrations.py.
QUEUE = "memory"
TASK_NAME = "cairn.write_memory"


class SharedPoolConnector(procrastinate.PsycopgConnector):
    """Procrastinate on the app's pool, whose connections are already autocommit.

    Its LISTEN connection is opened with the pool's kwargs plus `autocommit=True`, which
    psycopg rejects as a duplicate; the standalone connection drops the pool's copy.
    """

    @contextlib.asynccontextmanager
    async def _get_standalone_connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        conninfo: str = await self.pool._resolve_conninfo()
        kwargs: dict[str, Any] = dict(await self.pool._resolve_kwargs())
        kwargs.pop("autocommit", None)
        async with await self.pool.connection_class.connect(
            conninfo, **kwargs, autocommit=True
        ) as connection:
            yield connection


def queueing_lock(user_id: str, thread_id: str) -> str:
    return f"memory:{user_id}:{thread_id}"


class MemoryJobs:
    """Each new message pushes the (user, thread) job's deadline back; the job runs when idle."""

    def __init__(
        self,
        *,
        pool: Pool,
        store: BaseStore,
        model: BaseChatModel,
        load_messages: MessageLoader,
        idle_seconds: float,
        max_attempts: int = 4,
        retry_wait_s: int = 2,
    ) -> None:
        self.pool = pool
        self.store = store
        self.model = model
        self.load_messages = load_messages
        self.idle_seconds = idle_seconds
        self.max_attempts = max_attempts
        self.app = procrastinate.App(connector=SharedPoolConnector())
        self._task = self.app.task(
            name=TASK_NAME,
            queue=QUEUE,
            pass_context=True,
            retry=procrastinate.RetryStrategy(
                max_attempts=max_attempts - 1,
                exponential_wait=retry_wait_s,
                # A model that cannot produce valid output twice will not on a third try.
                retry_exceptions={Exception},
            ),
        )(self._run)
        self._worker: asyncio.Task[None] | None = None

    def add_periodic(self, name: str, *, cron: str, run: Callable[[], Awaitable[object]]) -> None:
        """A housekeeping task on the same queue, deferred once per cron tick across all
        workers (procrastinate's periodic tasks lock each tick in Postgres)."""

        async def periodic_task(timestamp: int) -> None:
            await run()

        task = self.app.task(name=f"cairn.{name}", queue=QUEUE)(periodic_task)
        self.app.periodic(cron=cron, periodic_id=name)(task)

    async def open(self) -> None:
        await self.app.open_async(pool=self.pool)  # type: ignore[arg-type]

    def start_worker(self, *, concurrency: int = 2) -> None:
        """Run jobs in this process; every app worker does, SKIP LOCKED shares them out."""
        self._worker = asyncio.create_task(
            self.app.run_worker_async(
                queues=[QUEUE],
                concurrency=concurrency,
                wait=True,
                install_signal_handlers=False,
                fetch_job_polling_interval=0.5,
                delete_jobs="successful",
            ),
            name="memory-jobs-worker",
        )

    @property
    def running(self) -> bool:
        """Whether this process's job worker is up (the readiness check reads it)."""
        return self._worker is not None and not self._worker.done()

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            self._worker = None

    async def message_arrived(self, *, user_id: str, thread_id: str) -> None:
        """Called after each turn with the user_id resolved from the session at request time."""
        memory = ScopedMemory(self.store, user_id)
        settings, marker = await memory.settings_and_marker(thread_id)
        if not settings.enabled:
            return
        await memory.set_marker(thread_id, current=marker, due_at=time.time() + self.idle_seconds)
        await self._defer(user_id, thread_id, delay_s=self.idle_seconds)

    async def forget_thread(self, *, user_id: str, thread_id: str) -> None:
        """A deleted conversation: cancel its queued job and drop its marker."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT id FROM procrastinate_jobs WHERE queueing_lock = %s AND status = 'todo'",
                (queueing_lock(user_id, thread_id),),
            )
            job_ids = [row["id"] for row in await cur.fetchall()]
        for job_id in job_ids:
            await self.app.job_manager.cancel_job_by_id_async(job_id, delete_job=True)
        await ScopedMemory(self.store, user_id).drop_marker(thread_id)

    async def _defer(self, user_id: str, thread_id: str, *, delay_s: float) -> None:
        # Already queued: that job re-checks the deadline when it wakes up.
        with contextlib.suppress(AlreadyEnqueued):
            await self._task.configure(
                queueing_lock=queueing_lock(user_id, thread_id),
                schedule_at=datetime.now(UTC) + timedelta(seconds=max(delay_s, 0.0)),
            ).defer_async(user_id=user_id, thread_id=thread_id)

    async def _run(
        self, context: procrastinate.JobContext, *, user_id: str, thread_id: str
    ) -> None:
        memory = ScopedMemory(self.store, user_id)
        first = await memory.snapshot(marker_for=thread_id)
        due_at = float(first.marker.get("due_at") or 0)
        if due_at - time.time() > 0.05:
            # The user wrote again since this job was queued: wait for the new idle deadline.
            await self._defer(user_id, thread_id, delay_s=due_at - time.time())
            return
        if not await self._owns(user_id, thread_id):
            log.warning("memory job dropped: thread %s is not owned by %s", thread_id, user_id)
            return
        job = context.job
        run_id = f"job-{job.id}-attempt-{job.attempts + 1}"
        try:
            report = await write_memories(
                store=self.store,
                model=self.model,
                load_messages=self.load_messages,
                user_id=user_id,
                thread_id=thread_id,
                run_id=run_id,
                still_wanted=lambda: self._owns(user_id, thread_id),
                first=first,
            )
        except InvalidModelOutput as exc:
            log.warning("memory job skipped (invalid model output) user=%s: %s", user_id, exc)
            return
        except Exception as exc:
            if job.attempts + 1 >= self.max_attempts:
                await self._dead_letter(user_id, thread_id, job.id, job.attempts + 1, exc)
            raise
        log.info(
            "memory job done user=%s thread=%s written=%s suggested=%s rejected=%s skipped=%s",
            user_id,
            thread_id,
            report.written,
            report.suggested,
            dict(report.rejected),
            report.skipped,
        )

    async def _owns(self, user_id: str, thread_id: str) -> bool:
        """The thread still exists, is this user's, and is not a temporary chat."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT owner_id, temporary FROM cairn_threads WHERE thread_id = %s",
                (thread_id,),
            )
            row = await cur.fetchone()
        return row is not None and row["owner_id"] == user_id and not row["temporary"]

    async def cancel_user(self, *, user_id: str) -> int:
        """Cancel every queued memory job of a user (memory switched off, account wiped).
        A job already running re-checks ownership under the user lock before writing."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT id FROM procrastinate_jobs WHERE task_name = %s AND status = 'todo' "
                "AND args->>'user_id' = %s",
                (TASK_NAME, user_id),
            )
            job_ids = [row["id"] for row in await cur.fetchall()]
        for job_id in job_ids:
            await self.app.job_manager.cancel_job_by_id_async(job_id, delete_job=True)
        return len(job_ids)

    async def _dead_letter(
        self, user_id: str, thread_id: str, job_id: int | None, attempts: int, exc: Exception
    ) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(
                "INSERT INTO memory_dead_letters (user_id, thread_id, job_id, attempts, error) "
                "VALUES (%s, %s, %s, %s, %s)",
                (user_id, thread_id, job_id, attempts, f"{type(exc).__name__}: {exc}"[:2000]),
            )
        log.error(
            "memory job dead-lettered user=%s thread=%s after %d attempts",
            user_id,
            thread_id,
            attempts,
        )

    async def pending(self, *, user_id: str) -> list[dict[str, Any]]:
        """Queued or running memory jobs of one user (for settings pages and wipes)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT id, status, queueing_lock, scheduled_at, args FROM procrastinate_jobs "
                "WHERE task_name = %s AND status IN ('todo', 'doing') AND args->>'user_id' = %s",
                (TASK_NAME, user_id),
            )
            return [dict(r) for r in await cur.fetchall()]
