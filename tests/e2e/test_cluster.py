"""Two workers in one data folder behind Debian's nginx (`make cluster`), started at once on an
empty database: one stopping breaks nothing for the other; in real Chromium a chat and a paused
plan carry on after kill -9 of the worker serving them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from playwright.sync_api import expect

from app import STARTUP_FAILED
from bench.login import sign_in
from deploy.cluster import Cluster, Worker, route_name
from tests.conftest import _with_database
from tests.e2e.conftest import ROOT, USERS, _free_port, login
from tests.e2e.test_hostile_client import ChatSocket
from tests.e2e.test_planner import GOAL, choose_planner, send

pytestmark = pytest.mark.e2e

THREAD_URL = re.compile(r".*/thread/([0-9a-f-]{36})$")


@pytest.fixture(scope="module")
def cluster(pg_server_url: str) -> Iterator[Cluster]:
    # An empty database (not even pgvector): both workers start on it at the same moment.
    name = f"cairn_cluster_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    with tempfile.TemporaryDirectory(prefix="cairn-cluster-") as folder:
        cluster = Cluster(
            folder=Path(folder),
            workers=2,
            port=_free_port(),
            worker_ports=[_free_port(), _free_port()],
            database_url=_with_database(pg_server_url, name),
            extra_env={
                "CAIRN_LOCAL_USERS": ",".join(f"{u}:{p}" for u, p in USERS.items()),
                "CAIRN_MEMORY_IDLE_SECONDS": "1",
                "CI": "true",  # Chainlit's CI mode; the app still picks the offline model
                "OPENAI_API_KEY": "",
            },
        )
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.stop()


def _both_up(cluster: Cluster) -> None:
    for worker in cluster.members:
        if not worker.alive:
            cluster.restart_worker(worker)


class _Direct:
    """One worker's own address, for ChatSocket (which talks to `server.url`), sending the
    Origin a browser on the cluster's public address sends."""

    def __init__(self, worker: Worker, public_url: str) -> None:
        self.url = worker.url
        self.origin = public_url


def _instance_folders(cluster: Cluster) -> list[Path]:
    return [p for p in (cluster.folder / "files").glob("instance-*") if p.is_dir()]


async def test_one_worker_stopping_breaks_nothing_for_its_sibling_in_the_folder(cluster):
    _both_up(cluster)
    first, second = cluster.members
    assert len(_instance_folders(cluster)) == 2  # one uploads folder each, side by side
    # Signed in through nginx; the session cookie holds on every worker (one shared secret).
    cookie = await sign_in(cluster.url, "bob", USERS["bob"])
    socket = ChatSocket(_Direct(second, cluster.url), cookie)  # type: ignore[arg-type]
    await socket.start()
    async with httpx.AsyncClient(
        base_url=second.url, headers={"Cookie": cookie, "Origin": cluster.url}
    ) as http:
        before = await http.post(
            "/project/file",
            params={"session_id": socket.session_id},
            files={"file": ("before.txt", b"uploaded before", "text/plain")},
        )
        assert before.status_code == 200, before.text
        assert "You said: one" in await socket.send("one")

        cluster.stop_worker(first)  # a clean stop: Chainlit's shutdown clean-up runs

        [folder] = _instance_folders(cluster)
        stored = {p.read_bytes() for p in (folder / socket.session_id).iterdir()}
        assert stored == {b"uploaded before"}
        after = await http.post(
            "/project/file",
            params={"session_id": socket.session_id},
            files={"file": ("after.txt", b"uploaded after", "text/plain")},
        )
        assert after.status_code == 200, after.text
        assert "You said: two" in await socket.send("two")
        stored = {p.read_bytes() for p in (folder / socket.session_id).iterdir()}
        assert stored == {b"uploaded before", b"uploaded after"}
        assert (await http.get("/readyz")).json() == {"status": "ready"}
    await socket.close()

    # The stopped worker comes back: its old folder is gone, the sibling's is untouched.
    await asyncio.to_thread(cluster.restart_worker, first)
    folders = _instance_folders(cluster)
    assert len(folders) == 2
    assert folder in folders


def test_health_endpoints_answer_through_nginx_without_a_session(cluster):
    _both_up(cluster)
    with httpx.Client(base_url=cluster.url, timeout=10) as http:
        health = http.get("/healthz")
        ready = http.get("/readyz")
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
    assert re.fullmatch(r"cairn_route=w[12]; .*", ready.headers["set-cookie"])


def _serving(page, cluster: Cluster) -> Worker:
    """The worker nginx pins this browser to (its `cairn_route` cookie)."""
    [route] = [c["value"] for c in page.context.cookies() if c["name"] == "cairn_route"]
    return next(w for i, w in enumerate(cluster.members, 1) if route_name(i) == route)


def _reply(page, text: str) -> None:
    send(page, text)
    expect(page.get_by_text(f"You said: {text}").last).to_be_visible(timeout=30_000)


def _watch_sockets(page) -> list[object]:
    """The websockets the page opens from now on (Chainlit's socket.io transport)."""
    opened: list[object] = []
    page.on("websocket", lambda ws: opened.append(ws))
    return opened


def _reconnected(page, cluster: Cluster, dead: Worker, opened: list[object]) -> Worker:
    """The page's socket.io client reconnects on its own (after its back-off) through nginx,
    whose cookie then names the worker that answered."""
    started = time.monotonic()
    for _ in range(240):
        serving = _serving(page, cluster)
        live = [ws for ws in opened if not ws.is_closed()]  # type: ignore[attr-defined]
        if serving is not dead and live:
            print(f"reconnected to worker {serving.index} {time.monotonic() - started:.1f} s after")
            page.wait_for_timeout(1500)  # connection_successful, then the chat is resumed
            return serving
        page.wait_for_timeout(250)
    pytest.fail("the page did not reconnect to the live worker")


def test_a_chat_and_a_paused_plan_carry_on_after_their_worker_is_killed(cluster, browser):
    _both_up(cluster)
    page = login(browser, cluster, "alice")
    _reply(page, "before the crash")
    page.wait_for_url(THREAD_URL)
    doomed = _serving(page, cluster)
    opened = _watch_sockets(page)

    cluster.kill_worker(doomed)
    killed = time.monotonic()

    # The page reconnects through nginx to the other worker and the chat goes on.
    _reconnected(page, cluster, doomed, opened)
    _reply(page, "after the crash")
    print(f"first reply after the kill: {time.monotonic() - killed:.1f} s")
    page.reload()
    page.locator("#chat-input").wait_for()
    expect(page.get_by_text("You said: before the crash").last).to_be_visible()
    expect(page.get_by_text("You said: after the crash").last).to_be_visible()

    # A plan waits for approval on one worker; that worker dies; it is approved on the other.
    cluster.restart_worker(doomed)
    page.context.close()
    page = login(browser, cluster, "alice")
    choose_planner(page)
    send(page, GOAL)
    expect(page.get_by_text("Proposed plan").last).to_be_visible()
    page.wait_for_url(THREAD_URL)
    holder = _serving(page, cluster)

    cluster.kill_worker(holder)

    page.reload()  # the page as the user finds it: reconnected to the live worker
    try:
        expect(page.get_by_text("Proposed plan").last).to_be_visible(timeout=30_000)
    except AssertionError:
        print((cluster.folder / "nginx" / "error.log").read_text()[-3000:])
        print((cluster.folder / "nginx" / "access.log").read_text()[-4000:])
        raise
    page.get_by_role("button", name="Approve").click()
    expect(page.get_by_text("Here is what the plan found").last).to_be_visible(timeout=60_000)
    assert _serving(page, cluster) is not holder
    page.context.close()


def test_a_worker_that_cannot_reach_its_database_exits_instead_of_serving(tmp_path):
    """Chainlit logs a failed start-up and serves anyway; Cairn's worker exits (status 3), so
    its port refuses and nginx and the supervisor see it, instead of 500s on every sign-in."""
    port = _free_port()
    log_path = tmp_path / "worker.log"
    env = {
        **os.environ,
        # No server behind this socket folder.
        "CAIRN_DATABASE_URL": f"postgresql://postgres:@/postgres?host={tmp_path}",
        "CAIRN_DATA_DIR": str(tmp_path / "data"),
        "CI": "true",
    }
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "app", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    answered = []
    deadline = time.monotonic() + 180
    try:
        while worker.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                answered.append(
                    httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code
                )
            time.sleep(0.5)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)

    assert worker.returncode == STARTUP_FAILED, log_path.read_text()[-3000:]
    assert answered == []
    assert "Cairn could not start" in log_path.read_text()
