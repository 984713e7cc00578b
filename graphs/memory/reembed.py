"""Re-embed the store with another embedding model, losing nothing: `python -m graphs.memory.reembed`.

Vectors from different models cannot be compared, so the new model gets its own index: a
vectors table keyed by the model (`store_vectors_<hash>`, the same shape as langgraph's
`store_vectors`, its rows deleted with their item by the same foreign key). Then:

1. `begin` records the new model beside the current one in `cairn_meta`; workers started from
   then on write every indexed put to both indexes (graphs.core.store's mirror).
2. `backfill` re-embeds every item of the current index under the same keys, in batches in
   key order, each batch committed together with its progress row (`cairn_reembed`), so a
   stop or a kill loses at most one batch and running it again resumes. A catch-up pass then
   redoes any item written since its vector was made (a worker not yet restarted).
   Forgetting wins: an item's new vector is written only if the item still exists unchanged
   (a delete or a forget landing mid-batch leaves nothing, and one landing later cascades),
   and facts matching the user's forget records are never carried over.
3. `evaluate` runs the recall eval (evals/) with the current model and on the new index; the
   new index is marked ready only if it scores at least as well (precision and recall at
   recall's defaults).
4. Reads switch by the setting: a worker configured with the new model reads the new index
   (writing the old one too, so switching back is a restart) once it is ready, and refuses to
   start before.
5. `retire` drops the old index: the new table becomes `store_vectors` and the new model the
   recorded one, so start-up is then exactly that of a fresh install with the new model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from graphs.core.embeddings import (
    DEFAULT_TABLE,
    EmbeddingModelChanged,
    EmbeddingSpec,
    build_embeddings,
    local_embeddings,
    openai_embeddings,
    vectors_table_for,
)
from graphs.core.persistence import INDEX_FIELDS, database_url, make_pool, open_persistence
from graphs.core.store import vector_texts
from graphs.memory.policy import Tombstone, is_tombstoned
from graphs.memory.scoped import MEMORY_KINDS, ROOT, TOMBSTONES

if TYPE_CHECKING:
    from pathlib import Path

    from graphs.core.pool import Pool
    from graphs.core.settings import Settings

BATCH_SIZE = 64
"""Items per batch: one embedding call and one transaction (MiniLM: ~0.1 s on 2 cores)."""
# Table names in this module's SQL are langgraph's or `vectors_table_for`'s (hex digits of a
# hash), never text from outside, so they are formatted into the statements.
HNSW_MAX_DIMS = 2000
"""pgvector's HNSW index takes vectors up to this size; larger ones are searched exactly."""

_MEMORY_PREFIX = re.compile(rf"^{ROOT}\.([^.]+)\.({'|'.join(MEMORY_KINDS)})$")


class ReembedError(RuntimeError):
    """A re-embedding step refused: the message says why and what to do."""


@dataclass(frozen=True)
class Progress:
    """One re-embedding, as its row in cairn_reembed records it."""

    target: str
    dims: int
    source: dict[str, Any]
    table: str
    state: str
    """copying -> catching_up -> backfilled -> ready | refused -> retired (or abandoned)."""
    total: int
    copied: int
    skipped: int
    caught_up: int
    eval: dict[str, Any] | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Progress:
        return cls(
            target=row["target"],
            dims=row["dims"],
            source=row["source"],
            table=row["vectors_table"],
            state=row["state"],
            total=row["total"],
            copied=row["copied"],
            skipped=row["skipped"],
            caught_up=row["caught_up"],
            eval=row["eval"],
        )

    def line(self) -> str:
        done = self.copied + self.skipped
        share = f" ({100 * done / self.total:.0f}%)" if self.total else ""
        return (
            f"{self.state}: {done}/{self.total} items{share}: {self.copied} re-embedded, "
            f"{self.skipped} forgotten facts not carried over, {self.caught_up} caught up"
        )


# --- state -----------------------------------------------------------------------------------


async def _record(pool: Pool) -> dict[str, Any] | None:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT value FROM cairn_meta WHERE key = 'embedding'")
        row = await cur.fetchone()
    return dict(row["value"]) if row else None


async def progress(pool: Pool) -> Progress | None:
    """The re-embedding under way (or the last one), if any."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT * FROM cairn_reembed ORDER BY (state IN ('retired', 'abandoned')),"
            " updated_at DESC LIMIT 1"
        )
        row = await cur.fetchone()
    return Progress.from_row(row) if row else None


async def _active(pool: Pool) -> Progress:
    record = await _record(pool)
    following = (record or {}).get("next")
    if not following:
        msg = "no re-embedding is under way: start one with `python -m graphs.memory.reembed run`"
        raise ReembedError(msg)
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT * FROM cairn_reembed WHERE target = %s", (following["name"],)
        )
        row = await cur.fetchone()
    if row is None:
        msg = f"the progress of the re-embedding to {following['name']} is missing"
        raise ReembedError(msg)
    return Progress.from_row(row)


async def begin(pool: Pool, current: EmbeddingSpec, target: EmbeddingSpec) -> Progress:
    """Create the new index and record it beside the current one (idempotent: resumes)."""
    record = await _record(pool)
    if record is None:
        msg = "this database has no store yet: start the app once before re-embedding it"
        raise ReembedError(msg)
    if (record["name"], record["dims"]) != (current.name, current.dims):
        msg = (
            f"the store's index is {record['name']} ({record['dims']} dims) but the configured "
            f"model is {current.name}: run this with the settings the app runs with"
        )
        raise ReembedError(msg)
    if (target.name, target.dims) == (current.name, current.dims):
        msg = f"the store is already embedded with {target.name}"
        raise ReembedError(msg)
    following = record.get("next")
    if following and (following["name"], following["dims"]) != (target.name, target.dims):
        msg = (
            f"a re-embedding to {following['name']} is under way: finish it (`retire`) or "
            "drop it (`abandon`) first"
        )
        raise ReembedError(msg)
    await _probe(target)
    table = vectors_table_for(target.name, target.dims)
    await _create_index(pool, table, target.dims)
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(
            "INSERT INTO cairn_reembed (target, dims, source, vectors_table) VALUES"
            " (%s, %s, %s::jsonb, %s) ON CONFLICT (target) DO UPDATE SET dims = EXCLUDED.dims,"
            " source = EXCLUDED.source, vectors_table = EXCLUDED.vectors_table,"
            " state = 'copying', cursor_prefix = NULL, cursor_key = NULL, total = 0, copied = 0,"
            " skipped = 0, caught_up = 0, eval = NULL, started_at = now(), updated_at = now()"
            " WHERE cairn_reembed.state IN ('retired', 'abandoned')",
            (target.name, target.dims, json.dumps(_named(current)), table),
        )
        if not following:
            following = {**_named(target), "table": table, "ready": False}
            await _set_next(conn, following)
    return await _active(pool)


async def _probe(target: EmbeddingSpec) -> None:
    """Fail now, not after the first batch, if the new model is unreachable or the wrong size."""
    vector = (await target.embeddings.aembed_documents(["Cairn checks the embedding model."]))[0]
    if len(vector) != target.dims:
        msg = f"{target.name} returned {len(vector)}-dimension vectors, not {target.dims}"
        raise ReembedError(msg)


async def _create_index(pool: Pool, table: str, dims: int) -> None:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT relkind FROM pg_class WHERE relname = %s", (table,))
        row = await cur.fetchone()
        if row is not None and row["relkind"] == "v":
            # The compatibility view an earlier retire left under this name.
            await conn.execute(f"DROP VIEW {table}")
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {table} ("
            " prefix text NOT NULL, key text NOT NULL, field_name text NOT NULL,"
            f" embedding vector({int(dims)}),"
            " created_at timestamptz DEFAULT CURRENT_TIMESTAMP,"
            " updated_at timestamptz DEFAULT CURRENT_TIMESTAMP,"
            " PRIMARY KEY (prefix, key, field_name),"
            " FOREIGN KEY (prefix, key) REFERENCES store(prefix, key) ON DELETE CASCADE)"
        )
        if dims <= HNSW_MAX_DIMS:
            await conn.execute(
                f"CREATE INDEX IF NOT EXISTS {table}_embedding_idx ON {table}"
                " USING hnsw (embedding vector_cosine_ops)"
            )


async def _set_next(conn: Any, following: dict[str, Any] | None) -> None:
    if following is None:
        await conn.execute("UPDATE cairn_meta SET value = value - 'next' WHERE key = 'embedding'")
    else:
        await conn.execute(
            "UPDATE cairn_meta SET value = jsonb_set(value, '{next}', %s::jsonb)"
            " WHERE key = 'embedding'",
            (json.dumps(following),),
        )


def _named(spec: EmbeddingSpec) -> dict[str, Any]:
    return {"name": spec.name, "dims": spec.dims}


# --- the backfill ----------------------------------------------------------------------------

_IN_OLD_INDEX = (
    f"EXISTS (SELECT 1 FROM {DEFAULT_TABLE} v WHERE v.prefix = s.prefix AND v.key = s.key)"  # noqa: S608 (constants only)
)
_COPY_BATCH = (
    "SELECT s.prefix, s.key, s.value, s.updated_at FROM store s"  # noqa: S608 (constants only)
    f" WHERE {_IN_OLD_INDEX} AND (%(after_prefix)s::text IS NULL"
    " OR (s.prefix, s.key) > (%(after_prefix)s, %(after_key)s))"
    " ORDER BY s.prefix, s.key LIMIT %(limit)s"
)
# Items whose new vector is missing or older than the item: written by a worker that did not
# write both indexes yet (or whose second write failed).
_STALE_BATCH = (
    "SELECT s.prefix, s.key, s.value, s.updated_at FROM store s"  # noqa: S608 (constants only)
    f" WHERE {_IN_OLD_INDEX} AND (%(after_prefix)s::text IS NULL"
    " OR (s.prefix, s.key) > (%(after_prefix)s, %(after_key)s))"
    " AND NOT EXISTS (SELECT 1 FROM {table} n WHERE n.prefix = s.prefix AND n.key = s.key"
    " AND n.updated_at >= s.updated_at)"
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
"""One statement per batch (a round trip per vector was most of the backfill's time)."""

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
    state = await _active(pool)
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
            return await _active(pool)
        await _set_state(pool, "catching_up")
    # Rounds until one finds nothing left to redo (forgotten facts stay skipped). Run again
    # later (a second `run`, or before `retire`) it redoes whatever a worker missed since.
    while True:
        before = (await _active(pool)).caught_up
        if not await _pass(pool, target, state.table, "catch_up", batch_size, stop, after_batch):
            return await _active(pool)
        if (await _active(pool)).caught_up == before:
            break
    if state.state in ("copying", "catching_up"):
        await _set_state(pool, "backfilled")
    return await _active(pool)


async def _count(pool: Pool) -> None:
    async with pool.connection() as conn:
        await conn.execute(
            f"UPDATE cairn_reembed SET total = (SELECT count(*) FROM store s WHERE {_IN_OLD_INDEX})"  # noqa: S608
            " WHERE state = 'copying' AND target = (SELECT value->'next'->>'name'"
            " FROM cairn_meta WHERE key = 'embedding')"
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
    state = await _active(pool)
    after: tuple[str, str] | None = None
    if kind == "copy" and state.copied + state.skipped:
        after = await _cursor(pool)
    select = (_COPY_BATCH if kind == "copy" else _STALE_BATCH).replace("{table}", table)
    while not stop.is_set():
        batch = await _run_batch(pool, target, table, select, after, batch_size, kind)
        if not batch.rows:
            return True
        after = (batch.rows[-1]["prefix"], batch.rows[-1]["key"])
        if after_batch is not None:
            await after_batch(await _active(pool))
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
    params = {
        "after_prefix": after[0] if after else None,
        "after_key": after[1] if after else None,
        "limit": batch_size,
    }
    async with pool.connection() as conn:
        cur = await conn.execute(select, params)
        rows = [dict(r) for r in await cur.fetchall()]
    if not rows:
        return _Batch(rows, 0, 0)
    forgotten = await _tombstones(pool, rows)
    keep = [r for r in rows if not _is_forgotten(r, forgotten)]
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
            " skipped = skipped + %s, updated_at = now(),"
            " cursor_prefix = CASE WHEN %s THEN %s ELSE cursor_prefix END,"
            " cursor_key = CASE WHEN %s THEN %s ELSE cursor_key END"
            " WHERE target = %s",
            (
                len(written),
                (len(rows) - len(keep)) if kind == "copy" else 0,
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


async def _tombstones(pool: Pool, rows: list[dict[str, Any]]) -> dict[str, list[Tombstone]]:
    """The forget records of every user whose memories are in the batch, by user label."""
    labels = {m[1] for r in rows if (m := _MEMORY_PREFIX.match(r["prefix"]))}
    if not labels:
        return {}
    prefixes = [f"{ROOT}.{label}.{TOMBSTONES}" for label in labels]
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT prefix, value FROM store WHERE prefix = ANY(%s)", (prefixes,)
        )
        found: dict[str, list[Tombstone]] = {label: [] for label in labels}
        for row in await cur.fetchall():
            label = row["prefix"].split(".")[1]
            value = row["value"]
            found[label].append(Tombstone(key=value.get("key"), fact=value.get("fact")))
    return found


def _is_forgotten(row: dict[str, Any], forgotten: dict[str, list[Tombstone]]) -> bool:
    match = _MEMORY_PREFIX.match(row["prefix"])
    if match is None or not forgotten.get(match[1]):
        return False
    content = str(row["value"].get("content", ""))
    return is_tombstoned(key=row["key"], content=content, tombstones=forgotten[match[1]])


async def _set_state(pool: Pool, state: str, *, eval_result: dict[str, Any] | None = None) -> None:
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE cairn_reembed SET state = %s, eval = COALESCE(%s::jsonb, eval),"
            " updated_at = now() WHERE target = (SELECT value->'next'->>'name'"
            " FROM cairn_meta WHERE key = 'embedding')",
            (state, json.dumps(eval_result) if eval_result is not None else None),
        )


# --- the gate, the switch and retiring -------------------------------------------------------


def verdict(current: dict[str, float], new: dict[str, float]) -> bool:
    """The new index may serve reads only if it recalls at least as well: precision and recall
    (at recall's default limit and threshold) both no lower than the current model's."""
    return new["precision"] >= current["precision"] and new["recall"] >= current["recall"]


async def record_eval(pool: Pool, current: dict[str, Any], new: dict[str, Any]) -> bool:
    """Store the eval's figures; mark the new index ready (reads may switch) if it passed."""
    state = await _active(pool)
    if state.state not in ("backfilled", "ready", "refused"):
        msg = f"the backfill is not finished ({state.line()}): run it to the end first"
        raise ReembedError(msg)
    passed = verdict(current, new)
    await _set_state(
        pool, "ready" if passed else "refused", eval_result={"current": current, "new": new}
    )
    record = await _record(pool)
    following = dict((record or {})["next"])
    async with pool.connection() as conn:
        await _set_next(conn, {**following, "ready": passed})
    return passed


async def retire(pool: Pool) -> Progress:
    """Drop the old index; the new one becomes the store's own (`store_vectors`) for good.

    Run it once every worker runs with the new model (reads switched): from here on the
    database is as a fresh install with the new model, and the old model no longer starts.
    """
    state = await _active(pool)
    if state.state != "ready":
        msg = f"the new index is not ready ({state.line()}): it cannot replace the current one"
        raise ReembedError(msg)
    t = state.table
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(f"DROP TABLE {DEFAULT_TABLE}")
        await conn.execute(f"ALTER TABLE {t} RENAME TO {DEFAULT_TABLE}")
        await conn.execute(
            f"ALTER TABLE {DEFAULT_TABLE} RENAME CONSTRAINT {t}_pkey TO {DEFAULT_TABLE}_pkey"
        )
        await conn.execute(
            f"ALTER TABLE {DEFAULT_TABLE} RENAME CONSTRAINT {t}_prefix_key_fkey"
            f" TO {DEFAULT_TABLE}_prefix_key_fkey"
        )
        await conn.execute(
            f"ALTER INDEX IF EXISTS {t}_embedding_idx RENAME TO {DEFAULT_TABLE}_embedding_idx"
        )
        # Workers still running with the switched reads name the new table: keep that name
        # working until they restart.
        await conn.execute(f"CREATE VIEW {t} AS SELECT * FROM {DEFAULT_TABLE}")  # noqa: S608
        await conn.execute(
            "UPDATE cairn_meta SET value = %s::jsonb WHERE key = 'embedding'",
            (json.dumps({"name": state.target, "dims": state.dims}),),
        )
        await conn.execute(
            "UPDATE cairn_reembed SET state = 'retired', updated_at = now() WHERE target = %s",
            (state.target,),
        )
    return await _finished(pool, state.target)


async def _retire_switched(pool: Pool, configured: EmbeddingSpec) -> Progress:
    """`retire` from the command: run with the settings the switched workers run with (the
    new model), after a last catch-up pass."""
    state = await _active(pool)
    if (configured.name, configured.dims) != (state.target, state.dims):
        msg = (
            f"configure the new model ({state.target}, {state.dims} dims) as the app's "
            "embedding model, restart every worker with it, then retire the old index"
        )
        raise ReembedError(msg)
    await backfill(pool, configured)
    return await retire(pool)


async def abandon(pool: Pool) -> Progress:
    """Drop the new index and forget the re-embedding (before any worker reads from it)."""
    state = await _active(pool)
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(f"DROP TABLE IF EXISTS {state.table}")
        await _set_next(conn, None)
        await conn.execute(
            "UPDATE cairn_reembed SET state = 'abandoned', updated_at = now() WHERE target = %s",
            (state.target,),
        )
    return await _finished(pool, state.target)


async def _finished(pool: Pool, target: str) -> Progress:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT * FROM cairn_reembed WHERE target = %s", (target,))
        row = await cur.fetchone()
    assert row is not None
    return Progress.from_row(row)


# --- the recall eval on the new index -------------------------------------------------------


async def compare(
    settings: Settings,
    current: EmbeddingSpec,
    target: EmbeddingSpec,
    *,
    database: str | None = None,
    dataset: Path | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The recall eval with the current model and on the new index: figures at recall's
    defaults (current, new).

    In a scratch database, never the app's: the labelled set is seeded under the current
    model, re-embedded by the backfill, and read from the new index as a switched worker
    reads it.
    """
    from evals.memory import RETRIEVAL_DATA, Memoised, eval_database
    from evals.retrieval import evaluate_retrieval, load_retrieval_set
    from graphs.core.embeddings import EmbeddingSpec

    labelled = load_retrieval_set(dataset or RETRIEVAL_DATA)
    old = EmbeddingSpec(current.name, current.dims, Memoised(current.embeddings))
    new = EmbeddingSpec(target.name, target.dims, Memoised(target.embeddings))
    async with eval_database(database, settings) as url:
        before = await open_persistence(
            settings, pool=make_pool(url, max_size=4), embedding=old, other_embedding=lambda *_: new
        )
        try:
            current_score = await evaluate_retrieval(before.store, labelled)
            await begin(before.pool, old, new)
            await backfill(before.pool, new)
            # Scratch data: ready without a gate, to be read as a switched worker reads it.
            following = dict((await _record(before.pool) or {})["next"])
            async with before.pool.connection() as conn:
                await _set_next(conn, {**following, "ready": True})
        finally:
            await before.close()
        after = await open_persistence(
            settings, pool=make_pool(url, max_size=4), embedding=new, other_embedding=lambda *_: old
        )
        try:
            new_score = await evaluate_retrieval(after.store, labelled)
        finally:
            await after.close()
    return current_score.defaults.as_dict(), new_score.defaults.as_dict()


# --- the command -----------------------------------------------------------------------------


def target_from(args: argparse.Namespace, settings: Settings) -> EmbeddingSpec:
    if args.provider == "local":
        return local_embeddings(settings)
    if not args.model or not args.dims:
        msg = "--provider openai needs --model and --dims"
        raise ReembedError(msg)
    return openai_embeddings(settings, args.model, args.dims)


async def run(
    pool: Pool,
    settings: Settings,
    current: EmbeddingSpec,
    target: EmbeddingSpec,
    *,
    batch_size: int = BATCH_SIZE,
    stop: asyncio.Event | None = None,
    after_batch: BatchHook | None = None,
    out: Callable[[str], None] = print,
) -> Progress:
    """begin + backfill + eval: what `run` does, resumable at every step."""
    started = await begin(pool, current, target)
    out(
        f"Re-embedding the store from {current.name} to {target.name} into {started.table}.\n"
        "Restart the app's workers now: once restarted they write to both indexes (writes "
        "from a worker not yet restarted are caught up at the end)."
    )
    clock = time.monotonic()

    async def report(now: Progress) -> None:
        rate = (now.copied + now.skipped + now.caught_up) / max(time.monotonic() - clock, 1e-6)
        out(f"  {now.line()}, {rate:.0f} items/s")
        if after_batch is not None:
            await after_batch(now)

    done = await backfill(pool, target, batch_size=batch_size, stop=stop, after_batch=report)
    if done.state in ("copying", "catching_up"):
        out(f"Stopped: {done.line()}. Run the same command again to resume.")
        return done
    out(f"Backfilled: {done.line()}.")
    if done.state == "backfilled" or done.eval is None:
        current_score, new_score = await compare(settings, current, target)
        await record_eval(pool, current_score, new_score)
    return await report_eval(pool, target, out)


async def report_eval(pool: Pool, target: EmbeddingSpec, out: Callable[[str], None]) -> Progress:
    state = await _active(pool)
    figures = state.eval or {}
    for label in ("current", "new"):
        score = figures.get(label, {})
        out(
            f"  recall eval, {label} model: precision {score.get('precision', 0):.3f}, "
            f"recall {score.get('recall', 0):.3f}, F1 {score.get('f1', 0):.3f}"
        )
    if state.state == "ready":
        out(
            f"The new index scores at least as well. Switch reads by configuring the app "
            f"with {target.name} ({target.dims} dims) and restarting it; once every worker "
            "runs with it, `python -m graphs.memory.reembed retire` drops the old index."
        )
    else:
        out(
            "The new index scores worse than the current one: reads stay on the current "
            "model (a worker configured with the new one refuses to start). "
            "`python -m graphs.memory.reembed abandon` drops it."
        )
    return state


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m graphs.memory.reembed",
        description="Re-embed the store with another embedding model (README: Changing the "
        "embedding model). Ctrl-C stops after the current batch; the same command resumes.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser(
        "run", help="start or resume: backfill the new index, then run the recall eval on it"
    )
    start.add_argument("--provider", choices=("local", "openai"), required=True)
    start.add_argument("--model", help="the openai-compatible model's name")
    start.add_argument("--dims", type=int, help="the openai-compatible model's dimensions")
    start.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    commands.add_parser("status", help="where the re-embedding stands")
    commands.add_parser("retire", help="drop the old index once reads use the new one")
    commands.add_parser("abandon", help="drop the new index and stay on the current model")
    return parser.parse_args(argv)


async def amain(argv: list[str] | None = None) -> int:
    from graphs.core.migrations import migrate
    from graphs.core.settings import Settings

    args = parse_args(argv)
    settings = Settings()
    pool = make_pool(await database_url(settings), max_size=4)
    await pool.open(wait=True, timeout=30)
    try:
        await migrate(pool)
        if args.command == "status":
            now = await progress(pool)
            print(now.line() if now else "No re-embedding has been run on this database.")
            print(json.dumps(await _record(pool), indent=2))
            return 0
        if args.command in ("retire", "abandon"):
            if args.command == "abandon":
                done = await abandon(pool)
            else:
                done = await _retire_switched(pool, build_embeddings(settings))
            print(f"{done.target}: {done.state}. Restart the app's workers.")
            return 0
        stop = asyncio.Event()
        _stop_on_signals(stop)
        done = await run(
            pool,
            settings,
            build_embeddings(settings),
            target_from(args, settings),
            batch_size=args.batch_size,
            stop=stop,
        )
        return {"ready": 0, "refused": 1}.get(done.state, 130)
    except (ReembedError, EmbeddingModelChanged) as refused:
        print(f"refused: {refused}", file=sys.stderr)
        return 2
    finally:
        await pool.close()


def _stop_on_signals(stop: asyncio.Event) -> None:
    """Ctrl-C or SIGTERM: stop after the batch being written; a second one: stop now (the
    uncommitted batch is simply redone on resume)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()

    def handle() -> None:
        if stop.is_set() and task is not None:
            task.cancel()
            return
        stop.set()
        print("Stopping after this batch (again to stop at once)...", file=sys.stderr)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, handle)


def main() -> None:
    try:
        sys.exit(asyncio.run(amain()))
    except asyncio.CancelledError:
        print("Stopped. Run the same command again to resume.", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
