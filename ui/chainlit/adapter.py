"""Chainlit as one mounted adapter: configured from Cairn's settings, patched, its hooks wired to
this worker's handlers, and mounted into the app (chainlit.utils.mount_chainlit, Chainlit's
documented FastAPI integration). Also the chat port (ui/port.py) the rest of the app uses."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from chainlit.context import context as chainlit_context
from fastapi import HTTPException

from graphs.core.runlock import ThreadBusy
from ui.agents import AGENTS
from ui.chainlit import config, hooks, patches, sign_in
from ui.chainlit.agents import discover
from ui.chainlit.chat import ChatHandlers
from ui.chainlit.data_layer import (
    PostgresDataLayer,
    add_outside_turn,
    append_message,
    store_edit,
)
from ui.chainlit.elements import MAX_ELEMENT_BYTES, PostgresStorageClient
from ui.chainlit.elements import build_router as build_element_router
from ui.chainlit.identity import clear_session_cookie
from ui.chainlit.oauth import LocalOIDCProvider, register_local_provider
from ui.chainlit.patches.sessions import (
    close_all_transports,
    disconnect_session_sockets,
    disconnect_user_sockets,
    enter_live_session,
)
from ui.chainlit.request_guard import RequestGuard

__all__ = [
    "ChainlitChat",
    "RequestGuard",
    "build_element_router",
    "bundled_sign_in",
    "element_storage",
    "mount",
]
from ui.chainlit.surface import ChatSurface
from ui.memory_page import STILL_RUNNING

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from fastapi import FastAPI
    from starlette.requests import Request
    from starlette.responses import Response

    from graphs.core.persistence import Pool
    from graphs.core.settings import Settings
    from ui.chainlit.agents import Presentations
    from ui.runner import Surface
    from ui.runtime import AppRuntime

log = logging.getLogger("cairn")

CHAINLIT_PATH = "/"
"""Chainlit is mounted at the root: its UI, socket and thread routes keep the URLs users and
tests know. Every route of Cairn's own is matched before it."""


ADAPTER_PINS = {
    "chainlit.utils.mount_chainlit": "0cf59a9d3aabeac1",
}
"""Mounted as documented: Chainlit's own lifespan (on_app_startup, the `.files` clean-up and its
`os._exit`) does not run under a parent app, whose lifespan is Cairn's (app.py)."""


class ChainlitChat:
    """The chat port (ui/port.py `ChatPort`) on Chainlit."""

    def __init__(
        self, pool: Pool, presentations: Presentations, *, uploads: Path | None = None
    ) -> None:
        self.pool = pool
        self.presentations = presentations
        self.uploads = uploads
        """This process's uploads folder (ui/chainlit/patches/uploads.py)."""

    def close(self) -> None:
        """At shutdown: this process's uploads folder goes (its siblings' stay). Chainlit's own
        lifespan did this, and does not run under a parent app."""
        if self.uploads is not None:
            shutil.rmtree(self.uploads, ignore_errors=True)

    async def append_reply(
        self, thread_id: str, text: str, *, author: str = "Cairn", once: bool = False
    ) -> None:
        await append_message(self.pool, thread_id, text, author=author, once=once)

    async def add_outside_turn(
        self, *, thread_id: str, user_id: str, profile: str, text: str
    ) -> None:
        await add_outside_turn(
            self.pool, thread_id=thread_id, user_id=user_id, profile=profile, text=text
        )

    async def store_edit(self, thread_id: str, message_id: str, text: str) -> None:
        await store_edit(self.pool, thread_id, message_id, text)

    async def end_sessions(self, user_id: str) -> int:
        return await disconnect_user_sockets(user_id)

    async def end_session(self, key: bytes) -> int:
        return await disconnect_session_sockets(key)

    async def reconnect_elsewhere(self) -> int:
        return await close_all_transports()

    async def tell_live(self, *, thread_id: str, user_id: str, text: str) -> bool:
        if not enter_live_session(thread_id=thread_id, user_id=user_id):
            return False
        await chainlit_context.emitter.send_toast(text, "info")
        return True

    def live_surface(self, *, thread_id: str, user_id: str) -> Surface | None:
        if not enter_live_session(thread_id=thread_id, user_id=user_id):
            return None
        return ChatSurface(self.presentations, signals_task=True)

    def sign_out(self, request: Request, response: Response) -> None:
        clear_session_cookie(request, response)


def bundled_sign_in(
    settings: Settings, *, public_url: str, internal_url: str, auth_secret: str
) -> LocalOIDCProvider | None:
    """Offer the bundled sign-in (auth/local_oidc.py) when no real OAuth provider is set."""
    return register_local_provider(
        settings, public_url=public_url, internal_url=internal_url, auth_secret=auth_secret
    )


def element_storage(settings: Settings, pool: Pool) -> PostgresStorageClient:
    """Where elements' bytes are kept: what Cairn attaches, and the uploads users may attach
    (any upload the settings accept is small enough to keep)."""
    return PostgresStorageClient(
        pool,
        mime_types=settings.upload_mime_types,
        max_element_bytes=max(MAX_ELEMENT_BYTES, settings.max_upload_mb * 1024 * 1024),
    )


def mount(
    app: FastAPI,
    *,
    settings: Settings,
    public_url: str,
    auth_secret: str,
    origins: Sequence[str],
    runtime: Callable[[], AppRuntime],
    pool: Pool,
    storage: PostgresStorageClient,
) -> ChainlitChat:
    """Configure, patch and mount Chainlit; returns the chat port. Call once per app, after
    the bundled sign-in (if any) is registered and before the app serves."""
    from chainlit.utils import mount_chainlit

    config.configure(settings, public_url=public_url, auth_secret=auth_secret, origins=origins)
    uploads = patches.install(
        files_parent=settings.data_dir / "files",
        origins=origins,
        max_message_chars=settings.max_message_chars,
    )
    presentations = discover(AGENTS)

    async def delete_thread_data(thread_id: str) -> None:
        await _delete_thread_data(runtime(), thread_id)

    hooks.register(
        ChatHandlers(runtime, AGENTS, presentations),
        data_layer=lambda: PostgresDataLayer(pool, on_delete=delete_thread_data, storage=storage),
    )
    app.include_router(sign_in.build_router(AGENTS))
    mount_chainlit(app, target=str(Path(hooks.__file__).resolve()), path=CHAINLIT_PATH)
    _drop_path_filter()
    return ChainlitChat(pool, presentations, uploads=uploads)


def _drop_path_filter() -> None:
    """mount_chainlit adds a BaseHTTPMiddleware answering 404 outside its sub-path. Mounted at
    the root it lets everything through, yet it costs every request a task of its own and turns
    each one the browser aborts (a logo fetch under a redirect) into "No response returned"."""
    from chainlit.server import app as chainlit_app

    kept = [
        m
        for m in chainlit_app.user_middleware
        if getattr(m.cls, "__name__", "") != "ChainlitMiddleware"
    ]
    if len(kept) != len(chainlit_app.user_middleware) - 1:
        msg = "mount_chainlit's middleware changed: review ui/chainlit/adapter.py"
        raise RuntimeError(msg)
    chainlit_app.user_middleware[:] = kept


async def _delete_thread_data(runtime: AppRuntime, thread_id: str) -> None:
    """Chainlit's sidebar delete (after its author check): everything a conversation left
    outside Chainlit's rows, which Chainlit deletes itself. Memories learned from it stay;
    the memory page's delete can forget them too."""
    owner = await runtime.privacy.owner_of(thread_id)
    if owner is not None:
        try:
            await runtime.privacy.purge_thread(owner, thread_id, forget=False, chainlit=False)
        except ThreadBusy:
            # Raised before Chainlit deletes its rows: the conversation stays whole.
            raise HTTPException(status_code=409, detail=STILL_RUNNING) from None
    log.info("deleted conversation %s", thread_id)
