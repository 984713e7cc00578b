"""One home for Postgres: the embedded server, the shared pool, the checkpointer and the store."""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import langgraph.checkpoint.postgres.aio as _saver_module
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.store.postgres.aio import AsyncPostgresStore
from psycopg import AsyncConnection
from psycopg.adapt import Dumper
from psycopg.pq import Format
from psycopg.rows import DictRow, dict_row

from graphs.core.embedded import open_embedded
from graphs.core.embeddings import (
    EmbeddingSpec,
    Vector,
    VectorPlan,
    build_embeddings,
    check_embedding_record,
    embeddings_named,
)
from graphs.core.migrations import migrate
from graphs.core.pool import POOL_TIMEOUT_S, Pool, StampingPool, check_if_idle
from graphs.core.saver import CairnSaver
from graphs.core.store import PipelinedStore

if TYPE_CHECKING:
    from graphs.core.settings import Settings

# Checkpoints must round-trip through msgpack without pickle fallbacks.
os.environ.setdefault("LANGGRAPH_STRICT_MSGPACK", "true")

log = logging.getLogger(__name__)


def start_embedded_postgres(data_dir: Path, *, throwaway: bool = False) -> str:
    """Start (or reuse) a private Postgres with pgvector in data_dir; returns its URI.

    Blocking (initdb on first start): call it from a worker thread. The app keeps it running
    with graphs.core.embedded.supervise_forever.
    """
    return open_embedded(data_dir, throwaway=throwaway).url


async def database_url(settings: Settings) -> str:
    if settings.database_url is not None:
        return settings.database_url.get_secret_value()
    return await asyncio.to_thread(start_embedded_postgres, settings.data_dir)


class _VectorDumper(Dumper):
    """An embedding in pgvector's binary format (dims, 0, big-endian float4s), ~5 µs.

    The type is left unknown: the SQL casts the parameter (`%s::vector`), so Postgres reads
    it with vector's receive function.
    """

    format = Format.BINARY
    oid = 0

    def dump(self, obj: Vector) -> bytes:
        return struct.pack(f">HH{len(obj)}f", len(obj), 0, *obj)


INDEX_FIELDS = ("content",)
"""The value fields the store embeds (an item's "content")."""

DELTA_HISTORY_PAGE = 16
"""Checkpoints read per query when rebuilding a DeltaChannel (the messages) at the start of a
run. The saver's default page is 1,024 rows, although the walk stops at the channel's last
snapshot (graphs.assistant.state.SNAPSHOT_EVERY updates back; two updates a turn, so at most
six checkpoints): in a 500-turn thread every turn read 1,024 rows, ~17 ms; 64 rows 1.2 ms,
16 rows 0.6 ms. A deeper walk (a run with many tool calls) just reads another page."""
_saver_module._DELTA_PAGE_SIZE = DELTA_HISTORY_PAGE  # type: ignore[attr-defined]


async def _configure(conn: AsyncConnection[DictRow]) -> None:
    conn.adapters.register_dumper(Vector, _VectorDumper)


PREPARE_THRESHOLD = 5
"""Runs of the same query on one connection before psycopg prepares it server-side."""


def make_pool(
    url: str, *, min_size: int = 1, max_size: int = 10, timeout: float = POOL_TIMEOUT_S
) -> Pool:
    """A pool whose connections suit the saver and the store (autocommit, dict rows).

    Connections that sat idle are checked before they are lent, so a Postgres restart costs
    a reconnect instead of failing the next request; lost connections are replaced at least
    once a second (graphs.core.pool.RECONNECT_EVERY_S), so the pool serves again within a
    second or two of Postgres coming back; a request fails after `timeout` s without one.
    """
    return StampingPool(
        url,
        connection_class=AsyncConnection[DictRow],
        min_size=min_size,
        max_size=max_size,
        open=False,
        configure=_configure,
        check=check_if_idle,
        timeout=timeout,
        # psycopg prepares a statement on its fifth run on a connection: the saver's, the
        # store's and the data layer's hot queries then skip parsing and planning, ~7 ms a
        # turn (`make bench`). Multi-statement scripts (migrations) opt out with prepare=False.
        kwargs={
            "autocommit": True,
            "prepare_threshold": PREPARE_THRESHOLD,
            "row_factory": dict_row,
        },
    )


_SETUP_LOCK_ID = 7_246_022


@asynccontextmanager
async def _setup_lock(pool: Pool, *, timeout_s: float = 120.0) -> AsyncIterator[None]:
    """One worker at a time runs the libraries' setup(); they are not safe to run concurrently.

    Polled, not a blocking lock: the store's CREATE INDEX CONCURRENTLY waits for every other
    transaction, including one blocked on the lock, and would deadlock with it.
    """
    async with pool.connection() as conn:
        deadline = time.monotonic() + timeout_s
        while True:
            cur = await conn.execute("SELECT pg_try_advisory_lock(%s) AS ok", (_SETUP_LOCK_ID,))
            row = await cur.fetchone()
            if row and row["ok"]:
                break
            if time.monotonic() > deadline:
                msg = "timed out waiting for another worker to finish database setup"
                raise TimeoutError(msg)
            await asyncio.sleep(0.2)
        try:
            yield
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (_SETUP_LOCK_ID,))


@dataclass
class Persistence:
    """Everything durable, shared by the graphs, the UI's data layer and background jobs."""

    pool: Pool
    checkpointer: AsyncPostgresSaver
    store: AsyncPostgresStore
    embedding: EmbeddingSpec
    vectors: VectorPlan | None = None
    """Which vector index the store reads, and the other one it also writes (re-embedding)."""

    async def close(self) -> None:
        await self.pool.close()


async def open_persistence(
    settings: Settings,
    *,
    pool: Pool | None = None,
    embedding: EmbeddingSpec | None = None,
    other_embedding: Callable[[str, int], EmbeddingSpec] | None = None,
) -> Persistence:
    """Open the pool (made here unless given), apply the app's migrations (all of them, in
    graphs.core.migrations' order), run every setup() once, check the embeddings.

    other_embedding builds the other model of a re-embedding under way (default: from the
    settings); it is only called then."""
    if pool is None:
        url = await database_url(settings)
        pool = make_pool(
            url,
            min_size=settings.pool_min_size,
            max_size=settings.pool_max_size,
            timeout=settings.pool_timeout_s,
        )
    await pool.open(wait=True, timeout=30)
    try:
        applied = await migrate(pool)
        if applied:
            log.info("applied migrations: %s", ", ".join(applied))
        embedding = embedding or build_embeddings(settings)
        vectors = await check_embedding_record(
            pool, embedding, other=other_embedding or partial(embeddings_named, settings=settings)
        )
        checkpointer = CairnSaver(pool)  # type: ignore[arg-type]
        store = open_store(pool, vectors)
        async with _setup_lock(pool):
            await checkpointer.setup()
            await store.setup()
    except BaseException:
        await pool.close()
        raise
    return Persistence(
        pool=pool, checkpointer=checkpointer, store=store, embedding=embedding, vectors=vectors
    )


def open_store(pool: Pool, vectors: VectorPlan) -> PipelinedStore:
    """The store on `vectors.read`'s index (writing `vectors.mirror` too, if any); no setup()."""
    store = PipelinedStore(
        pool,  # type: ignore[arg-type]
        # No item here expires; without this every read also runs an UPDATE of expires_at.
        ttl={"refresh_on_read": False},
        index={
            "dims": vectors.read.spec.dims,
            "embed": vectors.read.spec.embeddings,
            "fields": list(INDEX_FIELDS),
            "distance_type": "cosine",
        },
    )
    store.vectors_table = vectors.read.table
    store.mirror = vectors.mirror
    return store
