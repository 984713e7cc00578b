"""Shared fixtures: a throwaway embedded Postgres (pgvector) and a fresh database per test module."""

from __future__ import annotations

import os
import re
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest

os.environ.setdefault("LANGGRAPH_STRICT_MSGPACK", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """One Postgres server for the session: CAIRN_TEST_DATABASE_URL, or an embedded throwaway one."""
    if url := os.environ.get("CAIRN_TEST_DATABASE_URL"):
        yield url
        return
    from graphs.core.persistence import start_embedded_postgres

    with tempfile.TemporaryDirectory(prefix="cairn-test-pg-") as folder:
        os.chmod(folder, 0o755)
        yield start_embedded_postgres(Path(folder), throwaway=True)


def _with_database(url: str, name: str) -> str:
    # Embedded URLs look like postgresql://postgres:@/postgres?host=/path
    return re.sub(r"/[^/?]*(\?|$)", f"/{name}\\1", url, count=1)


def create_database(server_url: str) -> str:
    name = f"cairn_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = _with_database(server_url, name)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    return url


@pytest.fixture(scope="module")
def database_url(pg_server_url: str) -> str:
    """A fresh, empty database for each test module."""
    return create_database(pg_server_url)


@pytest.fixture(scope="session")
def embedding():
    """The real local MiniLM embedding spec, loaded once per session."""
    from graphs.core.embeddings import (
        LOCAL_MODEL_DIMS,
        LOCAL_MODEL_NAME,
        EmbeddingSpec,
        LocalMiniLM,
    )

    return EmbeddingSpec(f"local:{LOCAL_MODEL_NAME}", LOCAL_MODEL_DIMS, LocalMiniLM())


@pytest.fixture(scope="module")
async def persistence(database_url: str, embedding) -> AsyncIterator:
    """Pool, checkpointer and store on a fresh database, set up exactly as the app does."""
    from graphs.core.persistence import make_pool, open_persistence
    from graphs.core.settings import Settings

    settings = Settings(data_dir=Path(tempfile.mkdtemp()))
    p = await open_persistence(
        settings,
        pool=make_pool(database_url, max_size=5),
        embedding=embedding,
    )
    yield p
    await p.close()
