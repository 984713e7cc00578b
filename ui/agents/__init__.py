"""The chat profiles: one module per agent here, each declaring its `AgentSpec` as `SPEC`.

Adding an agent is adding a module: it is found by name, ordered by `SPEC.order`.
"""

from __future__ import annotations

import importlib
import pkgutil

from ui.runner import AgentSpec


def _discover() -> tuple[AgentSpec, ...]:
    specs = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        spec = getattr(importlib.import_module(f"{__name__}.{info.name}"), "SPEC", None)
        if isinstance(spec, AgentSpec):
            specs.append(spec)
    return tuple(sorted(specs, key=lambda s: s.order))


AGENTS: tuple[AgentSpec, ...] = _discover()
