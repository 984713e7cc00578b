"""The long-term memory store: langgraph's Postgres store, plus leaf-namespace reads in one trip.

`AsyncPostgresStore.abatch` runs a batch's queries one after another, waiting for each result
before sending the next. Recall (settings, pinned facts, semantic search) and a memory job's
snapshot (settings, memories, tombstones, suggestions, marker) are batches of reads of
namespaces nothing is stored beneath (every namespace graphs.memory.scoped builds).
`aread_exact` sends such a batch through the connection's pipeline in one round trip, with
equality on the prefix instead of the store's `prefix = ... OR prefix LIKE ...`, which Postgres
must plan afresh on every call, and a plain read instead of the store's get-with-TTL-refresh.
`make bench`: a recall batch 4.7 -> 1.9 ms p50.

Puts made under a user's authority (graphs.core.fence) are written in one transaction with the
check of that user's cut-off, instead of through the store's batching task (which runs in
the context of whoever first used the store, so it cannot see the caller's authority).

While the store is re-embedded (graphs.memory.reembed) its vectors may live in another table
than the library's `store_vectors` (`vectors_table`), and every indexed put is also written
to the other model's index (`mirror`). Everything else is the library's store.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, Literal, cast

from langgraph.checkpoint.postgres import _ainternal
from langgraph.store.base import (
    NOT_PROVIDED,
    GetOp,
    NotProvided,
    Op,
    PutOp,
    Result,
    SearchOp,
    _ensure_ttl,
    _validate_namespace,
)
from langgraph.store.base.embed import get_text_at_path, tokenize_path
from langgraph.store.postgres.aio import AsyncPostgresStore
from langgraph.store.postgres.base import (
    Row,
    _decode_ns_bytes,
    _namespace_to_text,
    _row_to_item,
    _row_to_search_item,
)
from psycopg.rows import dict_row

from graphs.core import fence
from graphs.core.embeddings import DEFAULT_TABLE, VectorIndex

log = logging.getLogger("cairn.store")

Statement = tuple[str, Sequence[Any] | Mapping[str, Any], Callable[[list[Row]], None]]
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
# An item scores by its closest indexed field, as in the store's own search (DISTINCT ON), plus:
# - `boost` when its content matches the given case-insensitive regular expression, else
#   `category_boost` when its stored category is one of the given ones (graphs.memory.situations;
#   a NULL pattern and an empty list boost nothing). Matching at read time costs ~0.5 ms per
#   search of 100 facts on a busy 2-core machine (`make bench`: 6.2 vs 4.6 ms p50 with the query
#   vector ready); names stored with each fact at write time and matched with `?|` cost ~0.02 ms
#   but would need a backfill, and go stale when the table changes. Worth it if the budget
#   tightens.
#   With the category and lexical boosts too: 2.8 vs 2.0 ms p50, 4.2 vs 3.1 ms p95 (`make bench`,
#   vector ready; whole recall p95 11.3 ms).
# - `lexical_boost` when the fact and the message share a word stem (Postgres English full-text
#   lexemes, stop words dropped, "user" too since every fact starts with it). Both texts are
#   bound parameters, never spliced into the SQL; a NULL message skips it. Parsing a fact's text
#   costs ~10 us, so it is done only for the facts that the boost could still lift into the
#   page: those scoring at least the page's last score without it, minus the boost. The
#   others cannot reach the page with it, so the answer is the same as parsing every fact.
_SEARCH_EXACT = (
    "WITH found AS ("
    " SELECT s.prefix, s.key, s.value, s.created_at, s.updated_at,"
    " 1 - min(v.embedding <=> %(vector)s::vector)"
    " + CASE WHEN bool_or(s.value->>'content' ~* %(pattern)s) THEN %(boost)s"
    " WHEN bool_or(s.value->>'category' = ANY(%(categories)s::text[])) THEN %(category_boost)s"
    " ELSE 0 END AS score"
    " FROM store s JOIN store_vectors v ON v.prefix = s.prefix AND v.key = s.key"
    " WHERE s.prefix = %(prefix)s AND (s.expires_at IS NULL OR s.expires_at > now())"
    " GROUP BY s.prefix, s.key"
    "), page_floor AS ("
    " SELECT score - %(lexical_boost)s AS at FROM found ORDER BY score DESC OFFSET %(last)s LIMIT 1"
    ")"
    " SELECT prefix, key, value, created_at, updated_at, score"
    " + CASE WHEN score < (SELECT at FROM page_floor) THEN 0"
    " WHEN array_remove(tsvector_to_array(to_tsvector('english', value->>'content')), 'user')"
    " && tsvector_to_array(to_tsvector('english', %(message)s::text)) THEN %(lexical_boost)s"
    " ELSE 0 END AS score"
    " FROM found ORDER BY score DESC, key LIMIT %(limit)s OFFSET %(offset)s"
)

_STAMP_EXISTING = (
    "UPDATE store SET value = jsonb_set(value, %s, to_jsonb(%s::text))"
    " WHERE prefix = %s AND key = ANY(%s)"
)


# The library's upsert replaces the whole value; `aput_keeping_latest` has it keep the later of
# the stored and the new text of some top-level fields (NULLs ignored, none: no field added).
_LIBRARY_SET = "SET value = EXCLUDED.value,"
_KEEP_LATEST = (
    "jsonb_strip_nulls(jsonb_build_object('{f}',"
    " GREATEST(store.value->>'{f}', EXCLUDED.value->>'{f}')))"
)
_FIELD_NAME = re.compile(r"^[a-z_]+$")
_keeping_latest: ContextVar[tuple[str, ...]] = ContextVar("cairn_store_keep_latest", default=())
"""The fields the puts prepared in this context keep the latest of (set by aput_keeping_latest)."""


def keeping_latest(query: str, fields: Sequence[str]) -> str:
    """The library's store upsert, merging `fields` by their latest value on conflict."""
    if _LIBRARY_SET not in query:
        msg = f"unexpected shape of the store's upsert: {query!r}"
        raise RuntimeError(msg)
    merged = " || ".join(_KEEP_LATEST.format(f=f) for f in fields)
    return query.replace(_LIBRARY_SET, f"SET value = EXCLUDED.value || {merged},")


# An item's vector in the other index, only while the item exists: a delete that landed
# first wins (and one landing later cascades). updated_at orders it after the item's write,
# which is how the re-embedding's catch-up pass tells a missed write.
_MIRROR_PUT = (
    "INSERT INTO {vectors} (prefix, key, field_name, embedding, created_at, updated_at)"
    " SELECT s.prefix, s.key, %s, %s::vector, clock_timestamp(), clock_timestamp()"
    " FROM store s WHERE s.prefix = %s AND s.key = %s"
    " ON CONFLICT (prefix, key, field_name) DO UPDATE"
    " SET embedding = EXCLUDED.embedding, updated_at = EXCLUDED.updated_at"
)


def _in_table(query: str, table: str) -> str:
    return query if table == DEFAULT_TABLE else query.replace(DEFAULT_TABLE, table)


class PipelinedStore(AsyncPostgresStore):
    """`AsyncPostgresStore` plus `aread_exact`: a batch of leaf-namespace reads in one round
    trip, and puts fenced by their user's cut-off."""

    async def aput(
        self,
        namespace: tuple[str, ...],
        key: str,
        value: Mapping[str, Any],
        index: Literal[False] | list[str] | None = None,
        *,
        ttl: float | NotProvided | None = NOT_PROVIDED,
    ) -> None:
        authority = fence.current()
        if authority is None:
            await super().aput(namespace, key, value, index, ttl=ttl)
            return
        _validate_namespace(namespace)
        op = PutOp(namespace, key, value, index, ttl=_ensure_ttl(self.ttl_config, ttl))
        # The embedding is computed before the transaction (and its lock) starts.
        queries, embedding = self._prepare_batch_PUT_queries([(0, op)])
        if not embedding and len(queries) == 1:
            # One row and no vectors (a marker, a setting): the check goes in the statement.
            ((statement, args),) = queries
            sql = fence.fenced_insert(statement)
            async with _ainternal.get_connection(self.conn) as conn:
                # The app's pools are autocommit; a bare connection (tests, tools) commits here.
                block = contextlib.nullcontext() if conn.autocommit else conn.transaction()
                async with block:
                    with fence.refusals():
                        await conn.execute(sql, (*fence.positional_args(authority), *args))
            return
        if embedding:
            query, texts = embedding
            assert self.embeddings is not None  # an embedding request implies an index
            vectors = await self.embeddings.aembed_documents([t[-1] for t in texts])
            vector_params: list[Any] = [
                p
                for (ns, k, path, _), v in zip(texts, vectors, strict=True)
                for p in (ns, k, path, v)
            ]
            queries.append((query, vector_params))
        async with (
            _ainternal.get_connection(self.conn) as conn,
            conn.pipeline(),
            conn.transaction(),
        ):
            await fence.check(conn, authority)
            async with conn.cursor(binary=True, row_factory=dict_row) as cur:
                for statement, args in queries:
                    await cur.execute(statement, args)
        if self.mirror is not None:
            await self._write_mirror(self.mirror, [op])

    vectors_table: str = DEFAULT_TABLE
    """The table this store's vectors are read from and written to."""
    mirror: VectorIndex | None = None
    """Another model's index every indexed put is also written to (during a re-embedding)."""

    async def aput_keeping_latest(
        self,
        namespace: tuple[str, ...],
        key: str,
        value: Mapping[str, Any],
        *,
        fields: Sequence[str],
    ) -> None:
        """`aput`, except that an update keeps the later of the stored and the new value of each
        of these top-level fields (ISO timestamps in UTC, as `astamp_existing` writes them).

        The merge is in the upsert itself, so a stamp committed between the caller's read and
        this write is kept, and one after it stamps the new row: none is lost.
        """
        if not all(_FIELD_NAME.match(f) for f in fields):
            msg = f"field names must be lower-case words: {list(fields)}"
            raise ValueError(msg)
        reset = _keeping_latest.set(tuple(fields))
        try:
            if fence.current() is not None:
                await self.aput(namespace, key, value)
                return
            # In this task (whose context holds the fields), not the store's batching task.
            _validate_namespace(namespace)
            ttl = _ensure_ttl(self.ttl_config, NOT_PROVIDED)
            await self.abatch([PutOp(namespace, key, value, None, ttl=ttl)])
        finally:
            _keeping_latest.reset(reset)

    # The library names `store_vectors` in its SQL; another index only swaps the table name.
    def _prepare_batch_PUT_queries(self, put_ops: Any) -> Any:
        queries, embedding_request = super()._prepare_batch_PUT_queries(put_ops)
        if fields := _keeping_latest.get():
            queries = [
                (keeping_latest(q, fields) if "INSERT INTO store " in q else q, p)
                for q, p in queries
            ]
        if embedding_request is not None:
            query, params = embedding_request
            embedding_request = (_in_table(query, self.vectors_table), params)
        return queries, embedding_request

    def _prepare_batch_search_queries(self, search_ops: Any) -> Any:
        queries, requests = super()._prepare_batch_search_queries(search_ops)
        return [(_in_table(q, self.vectors_table), p) for q, p in queries], requests

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        results = await super().abatch(ops)
        if self.mirror is not None:
            await self._write_mirror(self.mirror, [op for op in ops if isinstance(op, PutOp)])
        return results

    async def _write_mirror(self, index: VectorIndex, puts: list[PutOp]) -> None:
        """Never fails the write it follows: a vector missed here is redone by the
        re-embedding's catch-up pass, and a retired index is simply gone."""
        rows = [row for op in puts for row in self._texts(op)]
        if not rows:
            return
        try:
            vectors = await index.spec.embeddings.aembed_documents([text for *_, text in rows])
            query = _MIRROR_PUT.format(vectors=index.table)
            async with self._cursor(pipeline=True) as cur:
                for (prefix, key, field, _), vector in zip(rows, vectors, strict=True):
                    await cur.execute(query, (field, vector, prefix, key))
        except Exception:
            log.warning(
                "write to the %s index failed; the re-embedding catches it up",
                index.table,
                exc_info=True,
            )

    def _texts(self, op: PutOp) -> list[tuple[str, str, str, str]]:
        """(prefix, key, field name, text) for each vector the put makes."""
        if op.value is None or op.index is False or not self.index_config:
            return []
        fields = op.index or cast("dict[str, Any]", self.index_config)["fields"]
        prefix = _namespace_to_text(op.namespace)
        return [(prefix, op.key, name, text) for name, text in vector_texts(fields, op.value)]

    async def aread_exact(
        self,
        ops: Sequence[GetOp | SearchOp],
        *,
        boost_pattern: str | None = None,
        boost: float = 0.0,
        boost_categories: Sequence[str] = (),
        category_boost: float = 0.0,
        lexical_boost: float = 0.0,
    ) -> list[Result]:
        """`abatch(ops)` for reads of namespaces that have no child namespaces.

        A SearchOp's namespace is matched exactly rather than as a prefix: only for namespaces
        nothing is stored beneath. Items, cosine scores and order are the store's; filters are
        not supported. Query embeddings are computed before a connection is taken. Items whose
        content matches `boost_pattern` (Postgres `~*`) score `boost` more, else `category_boost`
        more when their category is in `boost_categories`; items sharing a word stem with the
        query score `lexical_boost` more (see _SEARCH_EXACT).
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
                search_params = {
                    "vector": next(vectors),
                    "pattern": boost_pattern,
                    "boost": boost,
                    "categories": list(boost_categories),
                    "category_boost": category_boost,
                    "prefix": namespace,
                    "lexical_boost": lexical_boost,
                    "last": max(op.limit + op.offset - 1, 0),
                    "message": op.query if lexical_boost else None,
                    "limit": op.limit,
                    "offset": op.offset,
                }
                search = _in_table(_SEARCH_EXACT, self.vectors_table)
                statements.append((search, search_params, self._search_items(results, idx)))
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


def vector_texts(fields: Sequence[str], value: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field name, text) of each vector the store makes for value, named as the library does."""
    found = []
    for path in fields:
        texts = get_text_at_path(value, tokenize_path(path))
        for i, text in enumerate(texts):
            found.append((f"{path}.{i}" if len(texts) > 1 else path, text))
    return found
