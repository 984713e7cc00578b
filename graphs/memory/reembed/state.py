"""A re-embedding's state: the new index, its progress row, the eval's verdict, retiring."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from graphs.core.embeddings import DEFAULT_TABLE, EmbeddingSpec, vectors_table_for
from graphs.memory.reembed.coverage import uncovered

if TYPE_CHECKING:
    from graphs.core.pool import Pool

# Table names in this package's SQL are langgraph's or `vectors_table_for`'s (hex digits of a
# hash), never text from outside, so they are formatted into the statements.
HNSW_MAX_DIMS = 2000
"""pgvector's HNSW index takes vectors up to this size; larger ones are searched exactly."""


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


async def read_record(pool: Pool) -> dict[str, Any] | None:
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


async def active(pool: Pool) -> Progress:
    record = await read_record(pool)
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
    record = await read_record(pool)
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
            (target.name, target.dims, json.dumps(named(current)), table),
        )
        if not following:
            following = {**named(target), "table": table, "ready": False}
            await set_next(conn, following)
    return await active(pool)


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


async def set_next(conn: Any, following: dict[str, Any] | None) -> None:
    if following is None:
        await conn.execute("UPDATE cairn_meta SET value = value - 'next' WHERE key = 'embedding'")
    else:
        await conn.execute(
            "UPDATE cairn_meta SET value = jsonb_set(value, '{next}', %s::jsonb)"
            " WHERE key = 'embedding'",
            (json.dumps(following),),
        )


def named(spec: EmbeddingSpec) -> dict[str, Any]:
    return {"name": spec.name, "dims": spec.dims}


async def set_state(pool: Pool, state: str, *, eval_result: dict[str, Any] | None = None) -> None:
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE cairn_reembed SET state = %s, eval = COALESCE(%s::jsonb, eval),"
            " updated_at = now() WHERE target = (SELECT value->'next'->>'name'"
            " FROM cairn_meta WHERE key = 'embedding')",
            (state, json.dumps(eval_result) if eval_result is not None else None),
        )


def verdict(current: dict[str, float], new: dict[str, float]) -> bool:
    """The new index may serve reads only if it recalls at least as well: precision and recall
    (at recall's default limit and threshold) both no lower than the current model's."""
    return new["precision"] >= current["precision"] and new["recall"] >= current["recall"]


async def record_eval(pool: Pool, current: dict[str, Any], new: dict[str, Any]) -> bool:
    """Store the eval's figures; mark the new index ready (reads may switch) if it passed and
    it holds a current vector of every live item of the current index (else refuse: reads
    switched to it would miss those items)."""
    state = await active(pool)
    if state.state not in ("backfilled", "ready", "refused"):
        msg = f"the backfill is not finished ({state.line()}): run it to the end first"
        raise ReembedError(msg)
    passed = verdict(current, new)
    if passed and (missing := await uncovered(pool, state.table)):
        prefix, key = missing[0]
        msg = (
            f"the new index lacks a current vector of {len(missing)} live item(s) (the first: "
            f"{key!r} in {prefix}): written since by a worker not restarted after the "
            "re-embedding began, or a write to the new index failed. Run "
            "`python -m graphs.memory.reembed run` again to catch them up"
        )
        raise ReembedError(msg)
    await set_state(
        pool, "ready" if passed else "refused", eval_result={"current": current, "new": new}
    )
    record = await read_record(pool)
    following = dict((record or {})["next"])
    async with pool.connection() as conn:
        await set_next(conn, {**following, "ready": passed})
    return passed


async def retire(pool: Pool) -> Progress:
    """Drop the old index; the new one becomes the store's own (`store_vectors`) for good.

    Run it once every worker runs with the new model (reads switched): from here on the
    database is as a fresh install with the new model, and the old model no longer starts.
    """
    state = await active(pool)
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


async def abandon(pool: Pool, *, configured: EmbeddingSpec) -> Progress:
    """Drop the new index and forget the re-embedding (before any worker reads from it).

    configured: the app's embedding model. Configured with the new one, once it is ready,
    workers read the new index: dropping it then would leave them with no index at all.
    """
    state = await active(pool)
    if state.state == "ready" and (configured.name, configured.dims) == (state.target, state.dims):
        msg = (
            f"reads have switched to the new index (the app is configured with {state.target}): "
            f"configure it with {state.source['name']} again and restart every worker before "
            "abandoning, or finish with `retire`"
        )
        raise ReembedError(msg)
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(f"DROP TABLE IF EXISTS {state.table}")
        await set_next(conn, None)
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
