"""Several workers on one database: simultaneous first starts, and the readiness check's probe
(real Postgres, real processes)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from graphs.core.migrations import MIGRATIONS
from graphs.core.persistence import make_pool
from tests.conftest import _with_database
from ui.health import database_answers

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 5

_WORKER = """
import asyncio, json, sys, tempfile, time
from pathlib import Path
from langchain_core.embeddings import DeterministicFakeEmbedding
from graphs.core.embeddings import EmbeddingSpec
from graphs.core.persistence import make_pool, open_persistence
from graphs.core.settings import Settings
from graphs.core.migrations import migrate

async def main(url, start):
    settings = Settings(_env_file=None, data_dir=Path(tempfile.mkdtemp()))
    spec = EmbeddingSpec("test:fake", 384, DeterministicFakeEmbedding(size=384))
    pool = make_pool(url, max_size=3)
    while time.time() < start:
        pass
    import graphs.core.persistence as p
    applied = []
    real_migrate = p.migrate
    async def recording(pool):
        applied.extend(await real_migrate(pool))
        return applied
    p.migrate = recording
    persistence = await open_persistence(settings, pool=pool, embedding=spec)
    async with persistence.pool.connection() as conn:
        await conn.execute("SELECT count(*) FROM store")  # the store's tables are usable
    await persistence.close()
    print(json.dumps(applied))

asyncio.run(main(sys.argv[1], float(sys.argv[2])))
"""


def _empty_database(pg_server_url: str) -> str:
    """A new database with nothing in it, not even pgvector (unlike conftest's)."""
    name = f"cairn_empty_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return _with_database(pg_server_url, name)


def test_workers_starting_at_once_on_an_empty_database_all_become_ready(pg_server_url):
    url = _empty_database(pg_server_url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    start = time.time() + 4  # every interpreter has imported and spins by then
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, url, str(start)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(WORKERS)
    ]
    results = [proc.communicate(timeout=240) for proc in procs]

    errors = [err[-2000:] for proc, (_, err) in zip(procs, results, strict=True) if proc.returncode]
    assert errors == []
    applied = [json.loads(out.strip().splitlines()[-1]) for out, _ in results]
    # One worker applied every migration; the others found them applied and started.
    assert sorted(applied, key=len) == [[]] * (WORKERS - 1) + [[m.id for m in MIGRATIONS]]
    with psycopg.connect(url, autocommit=True) as conn:
        extensions = conn.execute("SELECT extname FROM pg_extension").fetchall()
        recorded = conn.execute("SELECT name FROM cairn_migrations").fetchall()
    assert ("vector",) in extensions
    assert sorted(r[0] for r in recorded) == sorted(m.id for m in MIGRATIONS)


async def test_the_readiness_probe_sees_a_live_database_and_a_dead_one(database_url, tmp_path):
    live = make_pool(database_url, max_size=2)
    await live.open(wait=True, timeout=30)
    try:
        assert await database_answers(live)
    finally:
        await live.close()

    # No server behind this socket folder: the probe answers False within its timeout.
    dead_url = re.sub(r"host=[^&]+", f"host={tmp_path}", database_url)
    dead = make_pool(dead_url, max_size=1)
    await dead.open(wait=False)
    try:
        started = time.monotonic()
        assert not await database_answers(dead, timeout_s=1.0)
        assert time.monotonic() - started < 30  # bounded, not the pool's default wait
    finally:
        await dead.close()
