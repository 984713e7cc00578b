"""The backfill: every item of the current index re-embedded into the new one, resumably."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from graphs.core.persistence import INDEX_FIELDS
from graphs.core.store import vector_texts
from graphs.memory.reembed.coverage import (
    IN_OLD_INDEX,
    STALE_BATCH,
    forget_records,
    is_forgotten,
    select_after,
)
from graphs.memory.reembed.state import Progress, ReembedError, active, set_state

if TYPE_CHECKING:
    from graphs.core.embeddings import EmbeddingSpec
    from graphs.core.pool import Pool

BATCH_SIZE = 64
"""Items per batch: one embedding call and one transaction."""

_COPY_BATCH = (
    "SELECT s.prefix, s.key, s.value, s.updated_at FROM store s"  # noqa: S608 (constants only)
    f" WHERE {IN_OLD_INDEX} AND (%(after_prefix)s::text IS NULL"
    " OR (s.prefix, s.key) > (%(after_prefix)s, %(after_key)s))"
    " ORDER BY s.prefix, s.key LIMIT %(limit)s"
)
# Written only if the item still exists as it was read (locked until commit): a delete, a
# forget or an edit landing meanwhile wins, and one landing later cascades or is mirrored.
_PUT_IF_UNCHANGED = (
    "INSERT INTO {table} (prefix, key, field_name, embedding, created_at, updated_at)"
    " SELECT s.prefix, s.key, b.field_name, b.embedding::vector, clock_timestamp(),"
    " clock_timestamp() FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[],"
    " %s::timestamptz[]) AS b(prefix, key, field_name, embedding, updated_at)"
    " JOIN store s ON s.prefix = b.prefix AND s.key = b.key AND s.updated_at = b.updated_at"
    " FOR SHARE OF s"
    " ON CONFLICT (prefix, key, field_name) DO UPDATE"
    " SET embedding = EXCLUDED.embedding, updated_at = EXCLUDED.updated_at"
    " RETURNING prefix, key"
)
"""One statement per batch, not one per vector (the embedding itself is most of a batch's time)."""

BatchHook = Callable[[Progress], Awaitable[None]]
_BACKFILL_LOCK_ID = 7_246_023


@dataclass(frozen=True)
class _Batch:
    rows: list[dict[str, Any]]
    written: int
    skipped: int


async def backfill(
    pool: Pool,
    target: EmbeddingSpec,
    *,
    batch_size: int = BATCH_SIZE,
    stop: asyncio.Event | None = None,
    after_batch: BatchHook | None = None,
) -> Progress:
    """Copy every item of the current index into the new one, then catch up; resumable.

    Returns when done (state `backfilled`) or when `stop` is set (between batches).
    after_batch runs after each committed batch (progress output; tests land deletes there).
    """
    state = await active(pool)
    if state.target != target.name or state.dims != target.dims:
        msg = f"the re-embedding under way is to {state.target}, not {target.name}"
        raise ReembedError(msg)
    async with _only_one(pool):
        return await _backfill(
            pool, target, state, batch_size, stop or asyncio.Event(), after_batch
        )


@asynccontextmanager
async def _only_one(pool: Pool) -> AsyncIterator[None]:
    """One backfill at a time per database (two would only do the work twice)."""
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT pg_try_advisory_lock(%s) AS ok", (_BACKFILL_LOCK_ID,))
        row = await cur.fetchone()
        if not (row and row["ok"]):
            msg = "another re-embedding backfill is running on this database"
            raise ReembedError(msg)
        try:
            yield
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (_BACKFILL_LOCK_ID,))


async def _backfill(
    pool: Pool,
    target: EmbeddingSpec,
    state: Progress,
    batch_size: int,
    stop: asyncio.Event,
    after_batch: BatchHook | None,
) -> Progress:
    if state.state == "copying":
        await _count(pool)
        if not await _pass(pool, target, state.table, "copy", batch_size, stop, after_batch):
            return await active(pool)
        await _copied_all(pool)
        await set_state(pool, "catching_up")
    # Rounds until one finds nothing left to redo (forgotten facts stay skipped). Run again
    # later (a second `run`, or before `retire`) it redoes whatever a worker missed since.
    while True:
        before = (await active(pool)).caught_up
        if not await _pass(pool, target, state.table, "catch_up", batch_size, stop, after_batch):
            return await active(pool)
        if (await active(pool)).caught_up == before:
            break
    if state.state in ("copying", "catching_up"):
        await set_state(pool, "backfilled")
    return await active(pool)


_ACTIVE = "target = (SELECT value->'next'->>'name' FROM cairn_meta WHERE key = 'embedding')"


async def _count(pool: Pool) -> None:
    """The copy pass's total: the items it went through, and the live ones still ahead of its
    cursor (an item deleted since it was counted is not waited for)."""
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE cairn_reembed r SET total = r.copied + r.skipped + (SELECT count(*)"  # noqa: S608 (constants only)
            f" FROM store s WHERE {IN_OLD_INDEX} AND (r.cursor_prefix IS NULL"
            " OR (s.prefix, s.key) > (r.cursor_prefix, r.cursor_key)))"
            f" WHERE state = 'copying' AND {_ACTIVE}"
        )


async def _copied_all(pool: Pool) -> None:
    """The copy pass reached the end: every live item is behind it, so its total is what it
    went through (items deleted before it got to them are not counted; new ones are)."""
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE cairn_reembed SET total = copied + skipped, updated_at = now()"  # noqa: S608 (constants only)
            f" WHERE state = 'copying' AND {_ACTIVE}"
        )


async def _pass(
    pool: Pool,
    target: EmbeddingSpec,
    table: str,
    kind: str,
    batch_size: int,
    stop: asyncio.Event,
    after_batch: BatchHook | None,
) -> bool:
    """One pass in key order; False if stopped before the end. The copy pass starts from its
    checkpoint; a catch-up pass from the first key."""
    state = await active(pool)
    after: tuple[str, str] | None = None
    if kind == "copy" and state.copied + state.skipped:
        after = await _cursor(pool)
    select = (_COPY_BATCH if kind == "copy" else STALE_BATCH).replace("{table}", table)
    while not stop.is_set():
        batch = await _run_batch(pool, target, table, select, after, batch_size, kind)
        if not batch.rows:
            return True
        after = (batch.rows[-1]["prefix"], batch.rows[-1]["key"])
        if after_batch is not None:
            await after_batch(await active(pool))
    return False


async def _cursor(pool: Pool) -> tuple[str, str] | None:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT cursor_prefix, cursor_key FROM cairn_reembed WHERE target = (SELECT"
            " value->'next'->>'name' FROM cairn_meta WHERE key = 'embedding')"
        )
        row = await cur.fetchone()
    if row is None or row["cursor_prefix"] is None:
        return None
    return row["cursor_prefix"], row["cursor_key"]


async def _run_batch(
    pool: Pool,
    target: EmbeddingSpec,
    table: str,
    select: str,
    after: tuple[str, str] | None,
    batch_size: int,
    kind: str,
) -> _Batch:
    rows = await select_after(pool, select, after, batch_size)
    if not rows:
        return _Batch(rows, 0, 0)
    forgotten = await forget_records(pool, rows)
    keep = [r for r in rows if not is_forgotten(r, forgotten)]
    texts = [(r, name, text) for r in keep for name, text in vector_texts(INDEX_FIELDS, r["value"])]
    vectors = await target.embeddings.aembed_documents([t for *_, t in texts]) if texts else []
    put = _PUT_IF_UNCHANGED.replace("{table}", table)
    last = rows[-1]
    async with pool.connection() as conn, conn.transaction():
        cur = await conn.execute(
            put,
            (
                [row["prefix"] for row, _, _ in texts],
                [row["key"] for row, _, _ in texts],
                [name for _, name, _ in texts],
                [_vector_text(vector) for vector in vectors],
                [row["updated_at"] for row, _, _ in texts],
            ),
        )
        written = {(r["prefix"], r["key"]) for r in await cur.fetchall()}
        counted = "copied" if kind == "copy" else "caught_up"
        await conn.execute(
            f"UPDATE cairn_reembed SET {counted} = {counted} + %s,"  # noqa: S608 (a column name of ours)
            " skipped = skipped + %s, total = total - %s, updated_at = now(),"
            " cursor_prefix = CASE WHEN %s THEN %s ELSE cursor_prefix END,"
            " cursor_key = CASE WHEN %s THEN %s ELSE cursor_key END"
            " WHERE target = %s",
            (
                len(written),
                (len(rows) - len(keep)) if kind == "copy" else 0,
                # Read but not written: deleted (or edited, and then caught up) meanwhile.
                (len(keep) - len(written)) if kind == "copy" else 0,
                kind == "copy",
                last["prefix"],
                kind == "copy",
                last["key"],
                target.name,
            ),
        )
    return _Batch(rows, len(written), len(rows) - len(keep))


def _vector_text(vector: list[float]) -> str:
    """pgvector's text form; the batch travels as arrays of these, cast in the statement."""
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"
