"""Surfaces for runs nobody watches live: an HTTP page's answer, a run resumed for a user who is
not connected. The live chat's surface is the Chainlit adapter's (ui/chainlit/surface.py)."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from langgraph.types import StateSnapshot

    from graphs.core.context import Context
    from graphs.core.usage import RunUsage
    from ui.runner import AgentSpec, InterruptKind, LoadState, Status, View


class HeadlessView:
    """A run nobody watches live (answered from an HTTP page, resumed for a user who is not
    connected): only its reply counts, read from the finished state."""

    def __init__(self, spec: AgentSpec) -> None:
        self.spec = spec

    async def begin(self, load_state: LoadState) -> None:
        return None

    async def token(self, namespace: tuple[str, ...], token: Any, meta: dict[str, Any]) -> None:
        return None

    async def update(self, namespace: tuple[str, ...], node: str, delta: Any) -> None:
        return None

    async def task(self, namespace: tuple[str, ...], event: dict[str, Any]) -> None:
        return None

    async def end(self, status: Status, load_state: LoadState) -> str | None:
        if status != "done":
            return None
        return self.spec.reply_text((await load_state()).values)


class HeadlessSurface:
    """Errors are kept for the caller to turn into an HTTP answer."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.used: RunUsage | None = None
        """What the run used (when the runner records usage), for the caller's answer."""

    def view(self, spec: AgentSpec, context: Context) -> View:
        return HeadlessView(spec)

    async def notice(self, text: str) -> None:
        self.errors.append(text)

    async def refuse(self, text: str) -> None:
        self.errors.append(text)

    async def usage(self, usage: RunUsage) -> None:
        self.used = usage

    async def failed(self, text: str, *, thread_id: str, message_id: str | None = None) -> None:
        self.errors.append(text)

    async def show_interrupt(
        self, kind: InterruptKind | None, interrupt: Any, thread_id: str
    ) -> None:
        return None

    async def clear_prompt(self, interrupt_id: str) -> None:
        return None

    async def restore(self, spec: AgentSpec, state: StateSnapshot) -> None:
        return None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        yield
