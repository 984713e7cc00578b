"""The long-term memory store: langgraph's Postgres store, plus leaf-namespace reads in one trip.

`AsyncPostgresStore.abatch` runs a batch's queries one after another, waiting for each result
before sending the next. Recall (settings, pinned facts, semantic search) and a memory job's
snapshot (settings, memories, tombstones, suggestions, marker) are batches of reads of
namespaces nothing is stored beneath (every namespace graphs.memory.scoped builds).
`aread_exact` sends such a batch through the connection's pipeline in one round trip, with
equality on the prefix instead of the store's `prefix = ... OR prefix LIKE ...`, which Postgres
must plan afresh on every call, and a plain read instead of the store's get-with-TTL-refresh.
`make bench`: a recall batch 4.7 -> 1.9 ms p50. Everything else is the library's store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from langgraph.store.base import GetOp, Result, SearchOp
from langgraph.store.postgres.aio import AsyncPostgresStore
from langgraph.store.postgres.base import (
    Row,
    _decode_ns_bytes,
    _namespace_to_text,
    _row_to_item,
    _row_to_search_item,
)
from psycopg.rows import dict_row

Statement = tuple[str, Sequence[Any], Callable[[list[Row]], None]]
"""A query, its parameters, and what to do with its rows."""

_GET_EXACT = (
    "SELECT s.key, s.value, s.created_at, s.updated_at FROM store s"
    " WHERE s.prefix = %s AND s.key = %s"
    " AND (s.expires_at IS NULL OR s.expires_at > now())"
)
_LIST_EXACT = (
    "SELECT s.prefix, s.key, s.value, s.created_at, s.updated_at, NULL::float8 AS score"
    " FROM store s WHERE s.prefix = %s AND (s.expires_at IS NULL OR s.expires_at > now())"
    " ORDER BY s.updated_at DESC LIMIT %s OFFSET %s"
)
# An item scores by its closest indexed field, as in the store's own search (DISTINCT ON), plus
# `boost` when its content matches the given case-insensitive regular expression
# (graphs.memory.situations; NULL boosts nothing). Matching at read time costs ~0.5 ms per
# search of 100 facts on a busy 2-core machine (`make bench`: 6.2 vs 4.6 ms p50 with the query
# vector ready); names stored with each fact at write time and matched with `?|` cost ~0.02 ms
# but would need a backfill, and go stale when the table changes. Worth it if the budget tightens.
_SEARCH_EXACT = (
    "SELECT s.prefix, s.key, s.value, s.created_at, s.updated_at,"
    " 1 - min(v.embedding <=> %s::vector)"
    " + CASE WHEN bool_or(s.value->>'content' ~* %s) THEN %s ELSE 0 END AS score"
    " FROM store s JOIN store_vectors v ON v.prefix = s.prefix AND v.key = s.key"
    " WHERE s.prefix = %s AND (s.expires_at IS NULL OR s.expires_at > now())"
    " GROUP BY s.prefix, s.key ORDER BY score DESC, s.key LIMIT %s OFFSET %s"
)

_STAMP_EXISTING = (
    "UPDATE store SET value = jsonb_set(value, %s, to_jsonb(%s::text))"
    " WHERE prefix = %s AND key = ANY(%s)"
)


class PipelinedStore(AsyncPostgresStore):
    """`AsyncPostgresStore` plus `aread_exact`: a batch of leaf-namespace reads in one round trip."""

    async def aread_exact(
        self,
        ops: Sequence[GetOp | SearchOp],
        *,
        boost_pattern: str | None = None,
        boost: float = 0.0,
    ) -> list[Result]:
        """`abatch(ops)` for reads of namespaces that have no child namespaces.

        A SearchOp's namespace is matched exactly rather than as a prefix: only for namespaces
        nothing is stored beneath. Items, cosine scores and order are the store's; filters are
        not supported. Query embeddings are computed before a connection is taken. Items whose
        content matches `boost_pattern` (Postgres `~*`) score `boost` more.
        """
        if self.embeddings is None or (self.index_config or {}).get("distance_type") != "cosine":
            msg = "aread_exact needs the store's cosine vector index"
            raise ValueError(msg)
        results: list[Result] = [None] * len(ops)
        texts = [op.query for op in ops if isinstance(op, SearchOp) and op.query]
        vectors = iter(await self.embeddings.aembed_documents(texts) if texts else [])
        statements: list[Statement] = []
        for idx, op in enumerate(ops):
            if isinstance(op, GetOp):
                params: tuple[Any, ...] = (_namespace_to_text(op.namespace), op.key)
                statements.append((_GET_EXACT, params, self._item(results, idx, op.namespace)))
                continue
            if op.filter:
                msg = "aread_exact does not take filters"
                raise ValueError(msg)
            namespace = _namespace_to_text(op.namespace_prefix)
            if op.query:
                params = (next(vectors), boost_pattern, boost, namespace, op.limit, op.offset)
                statements.append((_SEARCH_EXACT, params, self._search_items(results, idx)))
            else:
                params = (namespace, op.limit, op.offset)
                statements.append((_LIST_EXACT, params, self._search_items(results, idx)))
        await self._run_pipelined(statements)
        return results

    async def astamp_existing(
        self, namespace: tuple[str, ...], keys: Sequence[str], *, field: str, at: str
    ) -> int:
        """Set one top-level text field of the items that exist under these keys; returns how many.

        An UPDATE, never an upsert: an item deleted meanwhile stays deleted. The value is changed
        in place, so the item's vectors and `updated_at` are untouched (no re-embedding).
        """
        if not keys:
            return 0
        params = ([field], at, _namespace_to_text(namespace), list(keys))
        async with self._cursor() as cur:
            await cur.execute(_STAMP_EXISTING, params)
            return cur.rowcount

    async def _run_pipelined(self, statements: Sequence[Statement]) -> None:
        """Send every statement, then read every result: one round trip for the lot."""
        if not statements:
            return
        async with self._cursor(pipeline=True) as cur:
            cursors = []
            for query, params, _ in statements:
                statement = cur.connection.cursor(binary=True, row_factory=dict_row)
                await statement.execute(query, params)
                cursors.append(statement)
            for statement, (_, _, fill) in zip(cursors, statements, strict=True):
                fill(cast("list[Row]", await statement.fetchall()))
                await statement.close()

    def _item(
        self, results: list[Result], idx: int, namespace: tuple[str, ...]
    ) -> Callable[[list[Row]], None]:
        def fill(rows: list[Row]) -> None:
            results[idx] = (
                _row_to_item(namespace, rows[0], loader=self._deserializer) if rows else None
            )

        return fill

    def _search_items(self, results: list[Result], idx: int) -> Callable[[list[Row]], None]:
        def fill(rows: list[Row]) -> None:
            results[idx] = [
                _row_to_search_item(_decode_ns_bytes(row["prefix"]), row, loader=self._deserializer)
                for row in rows
            ]

        return fill
