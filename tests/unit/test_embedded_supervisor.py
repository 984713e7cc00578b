"""The embedded Postgres supervisor: a dead postmaster (a zombie too) is seen as dead, failed starts
back off, another worker's start is waited for, and every restart is logged."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graphs.core.embedded import (
    BACKOFF_S,
    StartBusy,
    backoff,
    postgres_alive,
    supervise_forever,
)


def test_the_wait_grows_with_each_failed_start_up_to_its_cap() -> None:
    assert [backoff(n) for n in range(1, 9)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert backoff(len(BACKOFF_S) + 100) == BACKOFF_S[-1]


def zombie_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="reads /proc")
def test_a_killed_process_not_yet_reaped_and_a_pid_reused_by_another_program_are_not_postgres():
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while zombie_state(exited.pid) != "Z":  # exited, its parent (this test) has not reaped it
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        assert not postgres_alive(exited.pid), "a zombie's pid still answers kill(pid, 0)"
    finally:
        exited.wait()
    other = subprocess.Popen(["sleep", "30"])
    try:
        assert not postgres_alive(other.pid), "a live pid, but not Postgres"
    finally:
        other.kill()
        other.wait()
    assert not postgres_alive(exited.pid)


class Flaky:
    """A dead server that another worker is busy starting once, then fails to start twice
    before it starts."""

    pgdata = Path("/nonexistent/postgres")

    def __init__(self) -> None:
        self.outcomes: list[Exception | None] = [StartBusy(), _failed(), _failed(), None]
        self.up = False
        self.starts = 0

    def running(self) -> bool:
        return self.up

    def start(self) -> None:
        self.starts += 1
        outcome = self.outcomes.pop(0)
        if outcome is not None:
            raise outcome
        self.up = True


def _failed() -> subprocess.CalledProcessError:
    return subprocess.CalledProcessError(1, ["pg_ctl", "start"])


async def test_failed_starts_are_tried_again_after_a_wait_and_each_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="cairn.postgres")
    server = Flaky()
    supervisor = asyncio.create_task(
        supervise_forever(server, every_s=0.01, backoff_s=(0.01, 0.02))
    )
    try:
        deadline = time.monotonic() + 10
        while not server.running():
            assert time.monotonic() < deadline, "never started"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # running now: no more starts
    finally:
        supervisor.cancel()
    assert server.starts == 4
    said = [r.getMessage() for r in caplog.records if r.name == "cairn.postgres"]
    assert sum("is not running: starting it" in s for s in said) == 1, said
    assert [s.split(",")[0] for s in said if "did not start" in s] == [
        "the embedded Postgres did not start (attempt 1",
        "the embedded Postgres did not start (attempt 2",
    ]
    assert "running again" in said[-1]
    assert "2 failed start(s)" in said[-1], "another worker busy starting it is no failure"
