"""How each agent looks in the chat: one module per agent with widgets, declaring `PRESENTATION`.

An agent whose runs need no widgets of their own needs no module here: its view is the plain
streamed reply (`PlainView`). Found by name like the specs in ui/agents/.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ui.chainlit.surface import PlainView

if TYPE_CHECKING:
    from langgraph.types import Interrupt, StateSnapshot

    from graphs.core.context import Context
    from ui.runner import AgentSpec, View

Render = Callable[["Interrupt", str], Awaitable[None]]
"""Show a question with its buttons (given the interrupt and the thread id)."""


@dataclass(frozen=True)
class Presentation:
    """The chat side of one agent (its headless spec is ui/agents/<key>.py)."""

    key: str
    """The agent's `AgentSpec.key`."""
    view: Callable[[Context], View]
    """A fresh view of one run in the chat."""
    questions: Mapping[str, Render] = field(default_factory=dict)
    """How each of the agent's interrupt kinds (by name) is asked."""
    restore: Callable[[StateSnapshot], Awaitable[None]] | None = None
    """Show a reopened conversation's panels (task list, final status) from its state."""


class Presentations:
    """Every agent's presentation, by agent key; an agent without one gets `PlainView`."""

    def __init__(self, specs: tuple[AgentSpec, ...], found: tuple[Presentation, ...]) -> None:
        self._specs = {spec.key: spec for spec in specs}
        # A worker may serve some agents only: the others' presentations are not needed.
        found = tuple(p for p in found if p.key in self._specs)
        self._by_key = {p.key: p for p in found}
        self._questions: dict[str, Render] = {}
        for presentation in found:
            for name, render in presentation.questions.items():
                if name in self._questions:
                    msg = f"two agents ask a question named {name!r}"
                    raise ValueError(msg)
                self._questions[name] = render

    def of(self, key: str) -> Presentation:
        found = self._by_key.get(key)
        if found is not None:
            return found
        spec = self._specs[key]
        return Presentation(key=key, view=lambda _context: PlainView(spec))

    def question(self, kind: str) -> Render | None:
        return self._questions.get(kind)


def discover(specs: tuple[AgentSpec, ...]) -> Presentations:
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        presentation = getattr(module, "PRESENTATION", None)
        if isinstance(presentation, Presentation):
            found.append(presentation)
    return Presentations(specs, tuple(found))
