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
from procrastinate.exceptions import AlreadyEnqueued, ConnectorException, UniqueViolation
from procrastinate.jobs import Status

from graphs.core import fence, metrics
from graphs.core.errors import is_database_outage
from graphs.core.pool import open_lock_pool
from graphs.core.ratelimit import limited
from graphs.core.tracing import job_trace
from graphs.memory.scoped import ScopedMemory
from graphs.memory.writer import InvalidModelOutput, MessageLoader, write_memories

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from langchain_core.language_models import BaseChatModel
    from langgraph.store.base import BaseStore
    from psycopg_pool import AsyncConnectionPool

    from graphs.core.pool import Pool
    from graphs.core.ratelimit import Bucket

log = logging.getLogger("cairn.memory")

# Tables: procrastinate's (migration 0004_procrastinate) and memory_dead_letters (0005), in
# graphs/core/migrations.py.
QUEUE = "memory"
TASK_NAME = "cairn.write_memory"

WORKER_HEARTBEAT_S = 5.0
"""How often the job worker marks itself alive in procrastinate_workers."""
STALLED_AFTER_S = 20.0
"""A job worker silent this long is dead: its `doing` jobs are retried by a live one."""
SWEEP_EVERY_S = 10.0
"""How often every app process looks for stalled jobs (one at a time, across processes)."""
RESTART_BACKOFF_S = (0.5, 5.0)
"""First and longest wait before the job worker is started again after it stopped (Postgres
restarted under it: procrastinate's worker ends when its LISTEN connection fails)."""
HEALTHY_RUN_S = 30.0
"""A worker that ran this long before stopping starts again after the shortest wait."""
OUTAGE_PATIENCE_S = 300.0
"""How long a turn's memory job keeps trying to be queued while Postgres is away."""
_SWEEP_LOCK = "cairn-memory-jobs:stalled-sweep"


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
        heartbeat_s: float = WORKER_HEARTBEAT_S,
        stalled_after_s: float = STALLED_AFTER_S,
        sweep_every_s: float = SWEEP_EVERY_S,
        restart_backoff_s: tuple[float, float] = RESTART_BACKOFF_S,
        model_calls: Bucket | None = None,
    ) -> None:
        self.pool = pool
        self.model_calls = model_calls
        """The provider key's token bucket, taken before each of a job's model calls."""
        self.store = store
        self.model = model
        self.load_messages = load_messages
        self.idle_seconds = idle_seconds
        self.max_attempts = max_attempts
        self.heartbeat_s = heartbeat_s
        self.stalled_after_s = stalled_after_s
        self.sweep_every_s = sweep_every_s
        self.restart_backoff_s = restart_backoff_s
        self.worker_starts = 0
        """How many times this process started its job worker (restarts are starts - 1)."""
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
        self._lock_pool: AsyncConnectionPool[Any] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._worker_up = False
        """procrastinate's worker is running (not between a failure and its restart)."""

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
        """Run jobs in this process; every app worker does, SKIP LOCKED shares them out.

        The worker is supervised (started again whenever it stops, Postgres restarts
        included), and every process sweeps for jobs a dead worker left `doing`."""
        self._worker = asyncio.create_task(self._supervise(concurrency), name="memory-jobs-worker")
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="memory-jobs-stalled")

    async def _supervise(self, concurrency: int) -> None:
        """procrastinate's worker, started again with backoff each time it stops or fails."""
        first, longest = self.restart_backoff_s
        delay = first
        while True:
            started = time.monotonic()
            self.worker_starts += 1
            self._worker_up = True
            try:
                await self.app.run_worker_async(
                    queues=[QUEUE],
                    concurrency=concurrency,
                    wait=True,
                    install_signal_handlers=False,
                    fetch_job_polling_interval=0.5,
                    delete_jobs="successful",
                    update_heartbeat_interval=self.heartbeat_s,
                    stalled_worker_timeout=self.stalled_after_s,
                )
                log.warning("memory job worker stopped; starting it again in %.1f s", delay)
            except Exception as exc:
                log.warning(
                    "memory job worker failed (%s: %s); starting it again in %.1f s",
                    type(exc).__name__,
                    exc,
                    delay,
                )
            self._worker_up = False
            if time.monotonic() - started > HEALTHY_RUN_S:
                delay = first
            await asyncio.sleep(delay)
            delay = min(delay * 2, longest)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_every_s)
            try:
                await self.retry_stalled()
            except Exception as exc:
                log.warning("looking for stalled memory jobs failed: %s", exc)

    async def retry_stalled(self) -> list[int]:
        """Jobs left `doing` by a worker that stopped beating, queued again; the ids retried.

        One process at a time (a Postgres advisory lock), so a job is never retried twice
        from one stale list. A job that used up its attempts is dead-lettered instead, and
        one whose thread has a newer job queued is dropped: that job covers it."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT pg_try_advisory_lock(hashtextextended(%s, 0)) AS ok", (_SWEEP_LOCK,)
            )
            row = await cur.fetchone()
            if not (row and row["ok"]):
                return []
            try:
                return await self._retry_stalled_jobs()
            finally:
                await conn.execute(
                    "SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (_SWEEP_LOCK,)
                )

    async def _retry_stalled_jobs(self) -> list[int]:
        manager = self.app.job_manager
        retried: list[int] = []
        for job in await manager.get_stalled_jobs(
            queue=QUEUE, seconds_since_heartbeat=self.stalled_after_s
        ):
            assert job.id is not None
            args = job.task_kwargs
            try:
                if job.attempts + 1 >= self.max_attempts and job.task_name == TASK_NAME:
                    await manager.finish_job_by_id_async(job.id, Status.FAILED, delete_job=False)
                    await self._dead_letter(
                        str(args.get("user_id")),
                        str(args.get("thread_id")),
                        job.id,
                        job.attempts + 1,
                        RuntimeError("its worker stopped while running it"),
                    )
                    continue
                await manager.retry_job(job)
            except UniqueViolation:  # the thread's newer job is queued
                await manager.finish_job_by_id_async(job.id, Status.ABORTED, delete_job=True)
                continue
            except ConnectorException as exc:  # finished meanwhile: slow, not dead
                log.info("stalled memory job %s not retried: %s", job.id, exc)
                continue
            log.warning("memory job %s was left running by a stopped worker: retried", job.id)
            retried.append(job.id)
        return retried

    @property
    def running(self) -> bool:
        """Whether this process's job worker is up (the readiness check reads it)."""
        return self._worker_up and self._worker is not None and not self._worker.done()

    async def stop(self) -> None:
        for task in (self._sweeper, self._worker):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._worker = self._sweeper = None
        if self._lock_pool is not None:
            await self._lock_pool.close()
            self._lock_pool = None

    async def message_arrived(self, *, user_id: str, thread_id: str) -> None:
        """Called after each turn (off the reply's path) with the user_id resolved from the
        session at request time. Postgres away: tried again each second, for up to
        OUTAGE_PATIENCE_S, so a turn answered just before an outage still reaches memory."""
        deadline = time.monotonic() + OUTAGE_PATIENCE_S
        while True:
            try:
                await self._message_arrived(user_id=user_id, thread_id=thread_id)
                return
            except Exception as exc:
                if not is_database_outage(exc) or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1.0)

    async def _message_arrived(self, *, user_id: str, thread_id: str) -> None:
        """Push the thread's quiet deadline back; queue its job unless one queued from here is
        still waiting. That job re-reads the deadline when it wakes and waits again if it moved,
        so a conversation's later messages only move the deadline: one read and one write a
        message, not also a job insert (and its lock check) every time (issue 13).

        `job_at` is when the job last queued from here wakes (it is written only once the job
        is queued: a failed queueing is queued again). A job that ran has woken, so `job_at` is
        past; a cancelled one has its `job_at` cleared (cancel_user); a dead-lettered one is past
        it too. Either way the next message queues a new one."""
        memory = ScopedMemory(self.store, user_id)
        settings, marker = await memory.settings_and_marker(thread_id)
        if not settings.enabled:
            return
        now = time.time()
        due_at = now + self.idle_seconds
        if float(marker.get("job_at") or 0) > now:
            await memory.set_marker(thread_id, current=marker, due_at=due_at)
            return
        await self._defer(user_id, thread_id, delay_s=self.idle_seconds)
        await memory.set_marker(thread_id, current=marker, due_at=due_at, job_at=due_at)

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
        """Queue the job with the authority it is queued under (graphs.core.fence), checked
        against the user's cut-off while the job is inserted: a wipe's cancel sees it, or it
        is refused. The job's own writes carry the same authority."""
        authority = fence.current()
        if authority is None or authority.user_id != user_id:
            authority = fence.Fence.now(user_id)
        if self._lock_pool is None:
            self._lock_pool = await open_lock_pool(self.pool, max_size=4)
        # Already queued: that job re-checks the deadline when it wakes up.
        async with fence.held(self._lock_pool, authority):
            with contextlib.suppress(AlreadyEnqueued):
                await self._task.configure(
                    queueing_lock=queueing_lock(user_id, thread_id),
                    schedule_at=datetime.now(UTC) + timedelta(seconds=max(delay_s, 0.0)),
                ).defer_async(user_id=user_id, thread_id=thread_id, since=authority.since)

    async def _run(
        self,
        context: procrastinate.JobContext,
        *,
        user_id: str,
        thread_id: str,
        since: float | None = None,
    ) -> None:
        # A job queued before authorities were recorded is authorised from now: a wipe cancels
        # queued jobs, so one that runs was queued before any later cut-off.
        authority = fence.Fence(user_id, since) if since is not None else fence.Fence.now(user_id)
        with fence.acting_for(authority):
            try:
                await self._run_fenced(context, user_id=user_id, thread_id=thread_id)
            except fence.WriteRefused:
                # The user's data was wiped while this job ran: nothing more to do, ever.
                log.warning("memory job dropped: the data of user %s was wiped", user_id)

    async def _run_fenced(
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
            with job_trace(run_id), limited(self.model_calls):
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
            metrics.observe_memory_job("skipped")
            return
        except fence.WriteRefused:
            raise
        except Exception as exc:
            if job.attempts + 1 >= self.max_attempts:
                await self._dead_letter(user_id, thread_id, job.id, job.attempts + 1, exc)
                metrics.observe_memory_job("dead_lettered")
            else:
                metrics.observe_memory_job("retried")
            raise
        metrics.observe_memory_job("done")
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
        A job already running re-checks ownership under the user lock before writing, and
        its writes carry the authority it was queued under (refused after a wipe)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT id, args->>'thread_id' AS thread_id FROM procrastinate_jobs "
                "WHERE task_name = %s AND status = 'todo' AND args->>'user_id' = %s",
                (TASK_NAME, user_id),
            )
            jobs = [(row["id"], row["thread_id"]) for row in await cur.fetchall()]
        memory = ScopedMemory(self.store, user_id)
        for job_id, thread_id in jobs:
            await self.app.job_manager.cancel_job_by_id_async(job_id, delete_job=True)
            marker = await memory.marker(thread_id) if thread_id else {}
            if marker.get("job_at"):
                # No job waits for the thread now: its next message queues one. (A wipe
                # deletes the marker after this; its own session's write is refused.)
                with contextlib.suppress(fence.WriteRefused):
                    await memory.set_marker(thread_id, current=marker, job_at=0)
        return len(jobs)

    async def _dead_letter(
        self, user_id: str, thread_id: str, job_id: int | None, attempts: int, exc: Exception
    ) -> None:
        async with fence.fenced(self.pool) as conn:
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
