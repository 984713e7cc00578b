""" "Delete all my data" on one worker while the same user keeps chatting on another: two real
app processes on one database, the chat driven by hand over socket.io every 0.2 s. Ten
seconds after the wipe nothing of the user is left in any table, and the same person can
sign in again as a fresh account."""

from __future__ import annotations

import asyncio
import secrets
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psycopg
import pytest
import socketio
from psycopg.rows import dict_row

from bench.login import sign_in
from graphs.memory.gallery import TEAM_ROOT
from graphs.memory.privacy import LEFTOVERS_SQL
from graphs.memory.scoped import ROOT, user_label
from tests.conftest import create_database
from tests.e2e.conftest import USERS, AppServer
from tests.e2e.test_hostile_client import ChatSocket
from ui.memory_page import REQUEST_HEADER, WIPE_PHRASE

pytestmark = pytest.mark.e2e

CHAT_EVERY_S = 0.2
CHAT_FOR_S = 8.0
"""The tab keeps sending for this long (the wipe starts ~1.5 s in): 40 messages at most."""
SETTLE_S = 10.0


@pytest.fixture(scope="module")
def workers(pg_server_url: str) -> Iterator[tuple[AppServer, AppServer]]:
    """Two workers on one database, each with its own data folder, sharing the auth secret."""
    url = create_database(pg_server_url)
    secret = secrets.token_urlsafe(48)
    with (
        tempfile.TemporaryDirectory(prefix="cairn-w1-") as one,
        tempfile.TemporaryDirectory(prefix="cairn-w2-") as two,
    ):
        servers = tuple(
            AppServer(
                database_url=url, data_dir=Path(folder), extra_env={"CAIRN_AUTH_SECRET": secret}
            )
            for folder in (one, two)
        )
        try:
            for server in servers:  # one after the other: the first creates the schema
                server.start()
            yield servers  # type: ignore[misc]
        finally:
            for server in servers:
                server.stop()


def leftovers(database_url: str, user: str, threads: list[str]) -> dict[str, int]:
    """Every table that holds user data (graphs.memory.privacy.LEFTOVERS_SQL), plus this
    test's own look at the tables by user and by thread."""
    label = user_label(user)
    params = {"u": user, "t": threads, "roots": [f"{ROOT}.{label}", label], "team": TEAM_ROOT}
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        row = conn.execute(LEFTOVERS_SQL.replace("%%", "%"), params).fetchone()
        found = {key: int(value) for key, value in (row or {}).items()}
        found["any_store_row_naming_user"] = conn.execute(
            "SELECT count(*) AS n FROM store WHERE position(%s in prefix) > 0", (label,)
        ).fetchone()["n"]  # type: ignore[index]
        found["any_step_of_threads"] = conn.execute(
            'SELECT count(*) AS n FROM "Step" WHERE "threadId" = ANY(%s)', (threads,)
        ).fetchone()["n"]  # type: ignore[index]
    return found


def threads_of(database_url: str, user: str) -> list[str]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        return [
            r[0]
            for r in conn.execute(
                "SELECT thread_id FROM cairn_threads WHERE owner_id = %s "
                'UNION SELECT t.id FROM "Thread" t JOIN "User" u ON u.id = t."userId" '
                "WHERE u.identifier = %s",
                (user, user),
            ).fetchall()
        ]


async def keep_chatting(socket: ChatSocket, stop_at: float, sent: list[tuple[float, str]]) -> None:
    """What a tab left open does: a message every 0.2 s, without waiting for replies."""
    while time.monotonic() < stop_at and len(sent) < 60:
        n = len(sent)
        # Both kinds of write: the remember tool (a memory mid-turn) and a plain turn (its
        # checkpoints, Chainlit's steps and, a second later, a memory job).
        text = f"Remember that my lucky number is {n}" if n % 2 else f"Note {n}: I like jazz"
        step = {
            "threadId": "",
            "id": str(uuid.uuid4()),
            "name": "user",
            "type": "user_message",
            "output": text,
            "createdAt": datetime.now(UTC).isoformat(),
            "metadata": {},
        }
        if socket.client.connected:
            await socket.client.emit("client_message", {"message": step, "fileReferences": None})
            sent.append((time.monotonic(), text))
        else:
            sent.append((time.monotonic(), ""))  # the worker ended the connection
        await asyncio.sleep(CHAT_EVERY_S)


async def test_a_wipe_on_one_worker_leaves_nothing_while_another_keeps_chatting(
    workers: tuple[AppServer, AppServer],
) -> None:
    first, second = workers
    cookie = await sign_in(second.url, "alice", USERS["alice"])
    async with httpx.AsyncClient(
        base_url=first.url, headers={"Cookie": cookie, "Origin": first.url}, timeout=60
    ) as w1:
        user = (await w1.get("/api/memory")).json()["user"]

        tab = ChatSocket(second, cookie)
        await tab.start()
        await tab.send("I live in Lisbon and I prefer window seats.")
        await tab.send("My favourite colour is teal.")
        threads_before = threads_of(first.database_url, user)
        assert threads_before
        assert leftovers(first.database_url, user, threads_before)["checkpoints"] > 0

        sent: list[tuple[float, str]] = []
        chatting = asyncio.create_task(keep_chatting(tab, time.monotonic() + CHAT_FOR_S, sent))
        await asyncio.sleep(1.5)
        wipe_started = time.monotonic()
        wiped = await w1.post(
            "/api/account/wipe",
            json={"confirm": WIPE_PHRASE},
            headers={REQUEST_HEADER: "1", "Origin": first.url},
        )
        wiped_at = time.monotonic()
        assert wiped.status_code == 200, wiped.text
        report = wiped.json()
        await chatting

    assert report["verified"], report["leftovers"]
    assert sum(1 for t, text in sent if text and t < wipe_started) >= 5
    # Not one turn is accepted on the other worker once the wipe has answered (usually that
    # worker has ended the tab's connection by then: nothing is sent after it).
    after = [text for t, text in sent if t > wiped_at and text]
    replied = {text for text in (t for _, t in sent if t) if any(
        e in ("new_message", "update_message") and f"You said: {text}" in str(d.get("output"))
        for e, d in tab.events if isinstance(d, dict)
    )}  # fmt: skip
    assert not replied & set(after), sorted(replied & set(after))
    print(
        f"\nwipe took {wiped_at - wipe_started:.2f} s; the tab sent "
        f"{sum(1 for _, t in sent if t)} messages, {len(after)} after the wipe (until its "
        f"connection was ended); {len(replied)} answered, none of those after it"
    )
    # The other worker heard of the cut-off (LISTEN/NOTIFY) and ended the tab's connection;
    # the old session cannot connect again there.
    assert not tab.client.connected
    with pytest.raises(socketio.exceptions.ConnectionError):
        await ChatSocket(second, cookie).connect()

    await asyncio.sleep(SETTLE_S)
    threads = sorted(
        set(threads_before) | set(threads_of(first.database_url, user)) | {tab.thread_id()}
    )
    left = leftovers(first.database_url, user, threads)
    assert left == dict.fromkeys(left, 0), left

    # The same person signs in again (a second later than the cut-off) as a fresh account.
    fresh = await sign_in(second.url, "alice", USERS["alice"])
    again = ChatSocket(first, fresh)
    await again.start()
    reply = await again.send("Hello again")
    await again.close()
    assert "Hello again" in reply
    assert threads_of(first.database_url, user) == [again.thread_id()]
