"""Cairn's ASGI app: `create_app(settings)` owns start-up, routes and middleware, and mounts
Chainlit (ui/chainlit/). Serve it with `python -m app` (uvicorn on uvloop)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI

from auth.local_accounts import LocalAccounts
from auth.local_oidc import build_local_oidc_router, local_groups
from auth.sessions import EndedSessionGuard, SessionTokens
from graphs.core.settings import Settings, get_settings
from ui import output_guard, runtime
from ui.agents import AGENTS
from ui.chainlit import adapter
from ui.chainlit.config import ui_policy
from ui.chainlit.identity import SessionCookieFlags, clear_session_cookie, session_token
from ui.drain import DrainGuard
from ui.health import build_router as build_health_router
from ui.limits import UploadSizeLimit
from ui.mcp_server import McpEndpoint
from ui.memory_page import build_router as build_memory_router
from ui.metrics import build_router as build_metrics_router
from ui.origin_guard import OriginGuard
from ui.proxies import trust_proxies
from ui.review_page import build_router as build_review_router
from ui.security_headers import SecurityHeaders
from ui.share_page import build_router as build_share_router
from ui.support_page import build_router as build_support_router
from ui.tokens_page import build_router as build_tokens_router
from ui.workspace_page import build_router as build_workspace_router

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from types import FrameType

    import uvicorn

    from auth.tokens import AccessTokens
    from ui.runtime import AppRuntime

log = logging.getLogger("cairn")

STARTUP_FAILED = 3
"""The exit status of a worker whose start-up failed (uvicorn's), for a supervisor to restart it."""


def create_app(settings: Settings | None = None) -> FastAPI:
    """One worker's app. Nothing starts until its lifespan: the pool opens, the schema is set
    up, the graphs are compiled and background work begins."""
    settings = settings or get_settings()
    public_url = settings.base_url(settings.port)
    auth_secret = settings.ensure_auth_secret()
    origins = settings.origins(settings.port)
    state = runtime.open_runtime(settings, public_url=public_url, auth_secret=auth_secret)
    mcp = McpEndpoint(
        settings=settings,
        public_url=public_url,
        pool=state.pool,
        agents=AGENTS,
        runner=lambda: state.runner,
        tokens=lambda: _tokens(state),
        chat=lambda: state.port,
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            await runtime.start(state)
            await mcp.start()
        except Exception:
            # uvicorn then exits with STARTUP_FAILED before it opens the port.
            log.critical(
                "Cairn could not start and exits (status %d)", STARTUP_FAILED, exc_info=True
            )
            await runtime.stop(state)
            raise
        try:
            yield
        finally:
            await mcp.stop()
            await runtime.stop(state)
            if isinstance(state.chat, adapter.ChainlitChat):
                state.chat.close()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.runtime = state
    app.state.workspaces = state.workspaces
    app.state.session_tokens = SessionTokens(secret=auth_secret, from_cookies=session_token)
    output_guard.configure(public_url=public_url, image_origins=settings.image_allowed_origins)
    storage = adapter.element_storage(settings, state.pool)
    _include_routers(app, state, mcp)
    # Before Chainlit's mount at the root, which would answer for this path.
    app.include_router(adapter.build_element_router(storage))
    state.chat = adapter.mount(
        app,
        settings=settings,
        public_url=public_url,
        auth_secret=auth_secret,
        origins=origins,
        runtime=lambda: _started(state),
        pool=state.pool,
        storage=storage,
    )
    _add_middleware(app, state, origins)
    return app


def _include_routers(app: FastAPI, state: AppRuntime, mcp: McpEndpoint) -> None:
    """Cairn's routes, all matched before Chainlit's (mounted last, at the root)."""
    settings = state.settings
    provider = adapter.bundled_sign_in(
        settings,
        public_url=state.public_url,
        internal_url=f"http://127.0.0.1:{settings.port}",
        auth_secret=state.auth_secret,
    )
    if provider is not None:
        state.accounts = LocalAccounts(state.pool)
        app.include_router(
            build_local_oidc_router(
                accounts=state.accounts,
                pool=state.pool,
                issuer=f"{state.public_url}/local-oidc",
                client_id=provider.client_id,
                client_secret=provider.client_secret,
                signing_key_path=settings.data_dir / "local_oidc_key.json",
                allow_signup=settings.local_signup,
                groups=local_groups(settings.local_groups),
            )
        )
    app.include_router(build_health_router(lambda: state))
    app.include_router(build_memory_router())
    app.include_router(build_support_router())
    app.include_router(build_share_router())
    for agent in AGENTS:
        if agent.routes is not None:
            app.include_router(agent.routes(settings))
    metrics_token = settings.metrics_token
    app.include_router(
        build_metrics_router(
            metrics_token.get_secret_value() if metrics_token is not None else None,
            lambda: state.pool,
        )
    )
    app.include_router(build_tokens_router(AGENTS))
    app.include_router(build_workspace_router())
    app.include_router(build_review_router())
    # In front of Chainlit's own /mcp routes (its MCP client feature, switched off here).
    app.include_router(mcp.router())


def _add_middleware(app: FastAPI, state: AppRuntime, origins: list[str]) -> None:
    """Outermost last: security headers on every answer, the drain, the origin check (before
    anything acts on the request: the ended-session check records a sign-out), Chainlit's
    request guard, the ended-session check and the upload limit."""
    settings = state.settings
    app.add_middleware(UploadSizeLimit, max_bytes=settings.max_upload_mb * 1024 * 1024)
    app.add_middleware(
        EndedSessionGuard,
        tokens=app.state.session_tokens,
        revocations=lambda: state.revocations,
        clear_cookie=clear_session_cookie,
    )
    # A malformed body to a Chainlit route is refused before anything else reads it.
    app.add_middleware(adapter.RequestGuard)
    app.add_middleware(OriginGuard, origins=origins)
    app.add_middleware(SessionCookieFlags, secure=state.public_url.startswith("https://"))
    app.add_middleware(DrainGuard, draining=lambda: state.draining)
    app.add_middleware(
        SecurityHeaders, policy=ui_policy(state.public_url, settings.image_allowed_origins)
    )
    trust_proxies(app, trusted=settings.forwarded_allow_ips)


def _started(state: AppRuntime) -> AppRuntime:
    if not state.started:
        raise RuntimeError(runtime.STARTING)
    return state


def _tokens(state: AppRuntime) -> AccessTokens:
    tokens = state.tokens
    if tokens is None:
        raise RuntimeError(runtime.STARTING)
    return tokens


def draining_server(config: uvicorn.Config, state: AppRuntime) -> uvicorn.Server:
    """uvicorn's server, whose first SIGTERM (or Ctrl-C) drains the worker (runtime.drain)
    before the usual graceful shutdown; a second one stops at once as uvicorn does."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        drain: asyncio.Task[None] | None = None

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self.drain is not None or sig not in (signal.SIGTERM, signal.SIGINT):
                super().handle_exit(sig, frame)
                return
            # A signal handler: the drain starts from the loop, not from inside it.
            asyncio.get_running_loop().call_soon_threadsafe(self._start_drain, sig, frame)

        def _start_drain(self, sig: int, frame: FrameType | None) -> None:
            if self.drain is not None:
                return
            self.drain = asyncio.ensure_future(runtime.drain(state))
            self.drain.add_done_callback(lambda _done: uvicorn.Server.handle_exit(self, sig, frame))

    return DrainingServer(config)


def main(argv: list[str] | None = None) -> None:
    """Serve one worker with uvicorn on uvloop (`make run`)."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in {"host": args.host, "port": args.port}.items() if v is not None}
    settings = get_settings().model_copy(update=overrides) if overrides else get_settings()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        ws="websockets",
        proxy_headers=False,  # X-Forwarded-For only from CAIRN_FORWARDED_ALLOW_IPS (ui/proxies.py)
        log_level="info",
        timeout_graceful_shutdown=10,
    )
    draining_server(config, app.state.runtime).run()


if __name__ == "__main__":
    main()
