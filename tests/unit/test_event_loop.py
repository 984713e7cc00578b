"""Chainlit's 1 ms sleep per Step/Message only happens when two are made within 1 ms."""

from __future__ import annotations

import importlib

import pytest

from ui.chainlit.patches import clock as chainlit_patches
from ui.chainlit.patches.clock import SpacedClock


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0
        self.waits: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def wait(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


def test_constructions_far_apart_never_wait() -> None:
    fake = FakeTime()
    clock = SpacedClock(monotonic=fake.monotonic, wait=fake.wait)
    clock.sleep(0.001)
    fake.now += 0.020
    clock.sleep(0.001)
    assert fake.waits == []


def test_constructions_within_a_millisecond_are_spaced_out() -> None:
    fake = FakeTime()
    clock = SpacedClock(monotonic=fake.monotonic, wait=fake.wait)
    clock.sleep(0.001)
    fake.now += 0.0004
    clock.sleep(0.001)
    clock.sleep(0.001)  # straight after: a full millisecond again
    assert fake.waits == [pytest.approx(0.0006), pytest.approx(0.001)]


def test_install_swaps_the_clock_in_chainlits_step_and_message_modules() -> None:
    chainlit_patches.space_out_steps()
    chainlit_patches.space_out_steps()  # twice: still one clock, still the real time behind it
    step, message = (importlib.import_module(m) for m in ("chainlit.step", "chainlit.message"))
    assert isinstance(step.time, SpacedClock)
    assert step.time is message.time  # one clock: a Step and a Message are spaced too
    assert step.time.monotonic() > 0  # everything else is the real time module
