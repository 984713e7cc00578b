"""A running Cairn server (real Chainlit, real Postgres, bundled login) and real Chromium."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.conftest import create_database

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("CAIRN_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
USERS = {"alice": "alice-password-1", "bob": "bob-password-22", "carol": "carol-password-333"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class AppServer:
    """`python -m app` as users start it (`make run`), on a private port and database."""

    database_url: str
    data_dir: Path
    port: int = field(default_factory=_free_port)
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    """Set last (e.g. OPENAI_BASE_URL/OPENAI_API_KEY for a test model server)."""

    @property
    def url(self) -> str:
        return f"http://localhost:{self.port}"

    def start(self) -> None:
        env = {
            **os.environ,
            "CAIRN_DATABASE_URL": self.database_url,
            "CAIRN_DATA_DIR": str(self.data_dir),
            "CAIRN_LOCAL_USERS": ",".join(f"{u}:{p}" for u, p in USERS.items()),
            "CAIRN_PUBLIC_URL": self.url,
            "CAIRN_MEMORY_IDLE_SECONDS": "1",
        }
        env.pop("OPENAI_API_KEY", None)
        # Chainlit's CI mode exports a fake OpenAI key; the app must still pick the offline model.
        env["CI"] = "true"
        env.update(self.extra_env)
        self.log_path = self.data_dir / f"server-{int(time.time() * 1000)}.log"
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "app", "--port", str(self.port)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"app exited early:\n{self.log_path.read_text()[-4000:]}")
            try:
                if httpx.get(f"{self.url}/auth/config", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        pytest.fail(f"app did not start:\n{self.log_path.read_text()[-4000:]}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        self.process = None

    def log_tail(self, chars: int = 6000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return self.log_path.read_text(errors="replace")[-chars:]

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture(scope="module")
def app_server(pg_server_url: str) -> Iterator[AppServer]:
    with tempfile.TemporaryDirectory(prefix="cairn-e2e-") as folder:
        server = AppServer(database_url=create_database(pg_server_url), data_dir=Path(folder))
        server.start()
        try:
            yield server
        finally:
            server.stop()
            keep_logs(Path(folder))


def keep_logs(folder: Path) -> None:
    """CAIRN_E2E_LOGS=DIR keeps each server's log (they go with the temporary folder)."""
    if target := os.environ.get("CAIRN_E2E_LOGS"):
        Path(target).mkdir(parents=True, exist_ok=True)
        for log in folder.glob("server-*.log"):
            shutil.copy(log, Path(target) / log.name)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"Chromium not found at {CHROMIUM}: run `make browser` (apt-get install chromium)"
        )
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def login(browser, server: AppServer, username: str):
    """Sign in through the bundled OpenID Connect provider; returns a page on the chat."""
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(20_000)
    page.goto(server.url)
    page.get_by_role("button", name="Continue with").click()
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(USERS[username])
    page.get_by_role("button", name="Sign in").click()
    page.locator("#chat-input").wait_for()
    try:
        wait_until_connected(page)
    except Exception as exc:
        # What the server was doing when the chat did not connect (it is rare and load-bound).
        raise AssertionError(f"{exc}\nserver log (tail):\n{server.log_tail()}") from exc
    return page


def wait_until_connected(page) -> None:
    """The session is live once on_chat_start has spoken (the app runs the offline model here)."""
    page.get_by_text("offline stand-in model").last.wait_for()
