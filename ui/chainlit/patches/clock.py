"""Clock: Chainlit's blocking 1 ms sleep in every Step and Message, only when it is needed."""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("cairn.security")

CLOCK_PINS = {
    "chainlit.step.Step.__init__": "7ca45b864880c2c5",
    "chainlit.message.Message.__init__": "c6a39c3ae85d8df3",
}
"""The Chainlit code this module relies on (qualified name: digest of its source as checked),
tripped by tests/unit/test_chainlit_patches.py when an upgrade changes it."""


class SpacedClock:
    """Stands in for the `time` module inside chainlit.step and chainlit.message.

    Chainlit sleeps 1 ms in every `Step()` and `Message()` (step.py `Step.__init__`,
    message.py `Message.__init__`) so that consecutive ones get distinct millisecond
    timestamps (conversations are ordered by them when reopened). That is a blocking sleep on
    the event loop: every step of every user stalls all sessions for a millisecond. This keeps
    the guarantee (at least `seconds` between two constructions) and only waits when the
    previous construction was less than that long ago, which a turn's steps, tens of
    milliseconds apart, never are.
    """

    def __init__(
        self,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wait: Callable[[float], None] = time.sleep,
    ) -> None:
        self._monotonic = monotonic
        self._wait = wait
        self._last = float("-inf")
        self._lock = threading.Lock()

    def sleep(self, seconds: float) -> None:
        with self._lock:
            now = self._monotonic()
            remaining = self._last + seconds - now
            if remaining > 0:
                self._wait(remaining)
                now += remaining
            self._last = now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def space_out_steps() -> None:
    """One SpacedClock for both modules, so a Step and a Message are spaced too."""
    clock = SpacedClock()
    for name in ("chainlit.step", "chainlit.message"):
        # importlib: `chainlit.step` as an attribute is the @step decorator, not the module.
        module = importlib.import_module(name)
        assert module.time is time or isinstance(module.time, SpacedClock), name
        module.time = clock  # type: ignore[attr-defined]
