"""The checkpointer: langgraph's Postgres saver, reading a checkpoint's blobs by key.

The library's query joins a checkpoint's channel versions to its thread's blobs; Postgres
estimates the versions at 100 rows and hash-joins them against every blob of the thread, so
loading a conversation slowed as it grew (0.9 ms at 200 turns, linear after). Here each
channel's blob is an index lookup on the blobs' primary key (0.2 ms, flat). Same columns, same
rows.

Writes are fenced (graphs.core.fence): each of a checkpoint's write statements checks its user's
cut-off itself (the library's INSERTs rewritten to read `fence`, below), so a run still going on
one worker when the user's data is wiped on another stops at its next write instead of leaving
checkpoints behind. A statement, not a transaction block with a check before the writes: some
seven checkpoint writes an Assistant turn, each one statement fewer and no BEGIN/COMMIT (issue
13). A wipe between a checkpoint's blobs and its row leaves blobs written before the cut-off,
which the wipe deletes, and refuses the row.

Two worker-thread hops are also skipped where they only cost (see the methods): decoding a
checkpoint's pending writes when it has none, and encoding one node's writes. Everything else
is the library's saver.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from psycopg import AsyncCursor
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from graphs.core import fence, metrics

_writing: ContextVar[bool] = ContextVar("cairn_saver_writing", default=False)

SELECT_SQL = """
select
    thread_id,
    checkpoint,
    checkpoint_ns,
    checkpoint_id,
    parent_checkpoint_id,
    metadata,
    (
        select array_agg(array[bl.channel::bytea, bl.type::bytea, bl.blob])
        from jsonb_each_text(checkpoint -> 'channel_versions') cv
        cross join lateral (
            select b.channel, b.type, b.blob
            from checkpoint_blobs b
            where b.thread_id = checkpoints.thread_id
                and b.checkpoint_ns = checkpoints.checkpoint_ns
                and b.channel = cv.key
                and b.version = cv.value
            offset 0  -- keeps the lookup per channel: no hash join over the thread's blobs
        ) bl
    ) as channel_values,
    (
        select
        array_agg(array[cw.task_id::text::bytea, cw.channel::bytea, cw.type::bytea, cw.blob, convert_to(cw.task_path, 'UTF8'), cw.idx::text::bytea])
        from checkpoint_writes cw
        where cw.thread_id = checkpoints.thread_id
            and cw.checkpoint_ns = checkpoints.checkpoint_ns
            and cw.checkpoint_id = checkpoints.checkpoint_id
    ) as pending_writes
from checkpoints """


class _FencingCursor:
    """The cursor the library writes with: a fenced statement gets its fence's parameters."""

    def __init__(self, cur: AsyncCursor[DictRow], fenced: frozenset[str], args: tuple[Any, ...]):
        self._cur = cur
        self._fenced = fenced
        self._args = args

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        if query in self._fenced:
            params = (*self._args, *params)
        return await self._cur.execute(query, params, **kwargs)

    async def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> Any:
        if query in self._fenced:
            params_seq = [(*self._args, *params) for params in params_seq]
        return await self._cur.executemany(query, params_seq, **kwargs)

    def __aiter__(self) -> Any:
        return self._cur.__aiter__()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)


class CairnSaver(AsyncPostgresSaver):
    """`AsyncPostgresSaver` whose checkpoint reads look blobs up by key and whose writes pass
    the wipe's check in the statement (see module doc)."""

    SELECT_SQL = SELECT_SQL
    UPSERT_CHECKPOINT_BLOBS_SQL = fence.fenced_insert(
        AsyncPostgresSaver.UPSERT_CHECKPOINT_BLOBS_SQL
    )
    UPSERT_CHECKPOINTS_SQL = fence.fenced_insert(AsyncPostgresSaver.UPSERT_CHECKPOINTS_SQL)
    UPSERT_CHECKPOINT_WRITES_SQL = fence.fenced_insert(
        AsyncPostgresSaver.UPSERT_CHECKPOINT_WRITES_SQL
    )
    INSERT_CHECKPOINT_WRITES_SQL = fence.fenced_insert(
        AsyncPostgresSaver.INSERT_CHECKPOINT_WRITES_SQL
    )
    _FENCED = frozenset(
        {
            UPSERT_CHECKPOINT_BLOBS_SQL,
            UPSERT_CHECKPOINTS_SQL,
            UPSERT_CHECKPOINT_WRITES_SQL,
            INSERT_CHECKPOINT_WRITES_SQL,
        }
    )

    async def _load_checkpoint_tuple(self, value: DictRow) -> CheckpointTuple:
        # The library decodes pending writes in a worker thread. A checkpoint a run starts from
        # usually has none, and the thread hop alone cost ~1 ms a turn while the query's
        # embedding kept both cores busy.
        if value["pending_writes"]:
            return await super()._load_checkpoint_tuple(value)
        configurable = {
            "thread_id": value["thread_id"],
            "checkpoint_ns": value["checkpoint_ns"],
        }
        return CheckpointTuple(
            {"configurable": {**configurable, "checkpoint_id": value["checkpoint_id"]}},
            {  # type: ignore[typeddict-item]  # the row's checkpoint is a whole Checkpoint
                **value["checkpoint"],
                "channel_values": {
                    **(value["checkpoint"].get("channel_values") or {}),
                    **self._load_blobs(value["channel_values"]),
                },
            },
            value["metadata"],
            (
                {"configurable": {**configurable, "checkpoint_id": value["parent_checkpoint_id"]}}
                if value["parent_checkpoint_id"]
                else None
            ),
            [],
        )

    @asynccontextmanager
    async def _cursor(self, *, pipeline: bool = False) -> AsyncIterator[AsyncCursor[DictRow]]:
        authority = fence.current() if _writing.get() else None
        args = fence.positional_args(authority)
        with fence.refusals():
            async with super()._cursor(pipeline=pipeline) as cur:
                yield _FencingCursor(cur, self._FENCED, args)  # type: ignore[misc]

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        token = _writing.set(True)
        started = time.perf_counter()
        try:
            return await self._put(config, _without_nul(checkpoint), metadata, new_versions)
        finally:
            _writing.reset(token)
            metrics.observe_checkpoint_write("checkpoint", time.perf_counter() - started)

    async def _put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        # As the library's `aput`, but the channel blobs are serialised on the event loop, as
        # `_put_writes` does for writes: a turn's blobs are the new messages (the history is a
        # delta channel), and the library's worker-thread hop cost more than serialising them,
        # three times a turn. The saver parity test (tests/integration/test_saver.py) holds the
        # rows equal to the library's.
        configurable = config["configurable"].copy()
        thread_id = configurable.pop("thread_id")
        checkpoint_ns = configurable.pop("checkpoint_ns")
        parent_id = configurable.pop("checkpoint_id", None)
        copy = checkpoint.copy()
        copy["channel_values"] = copy["channel_values"].copy()
        blob_values = {}
        for key, value in checkpoint["channel_values"].items():
            if isinstance(value, _DeltaSnapshot):
                blob_values[key] = copy["channel_values"].pop(key)
                copy["channel_values"][key] = True
            elif not (value is None or isinstance(value, str | int | float | bool)):
                blob_values[key] = copy["channel_values"].pop(key)
        async with self._cursor(pipeline=True) as cur:
            if blob_versions := {k: v for k, v in new_versions.items() if k in blob_values}:
                await cur.executemany(
                    self.UPSERT_CHECKPOINT_BLOBS_SQL,
                    self._dump_blobs(thread_id, checkpoint_ns, blob_values, blob_versions),
                )
            await cur.execute(
                self.UPSERT_CHECKPOINTS_SQL,
                (
                    thread_id,
                    checkpoint_ns,
                    checkpoint["id"],
                    parent_id,
                    Jsonb(copy),
                    Jsonb(get_serializable_checkpoint_metadata(config, metadata)),
                ),
            )
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": checkpoint_ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        token = _writing.set(True)
        started = time.perf_counter()
        try:
            await self._put_writes(config, writes, task_id, task_path)
        finally:
            _writing.reset(token)
            metrics.observe_checkpoint_write("writes", time.perf_counter() - started)

    async def _put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        # As the library's, but the writes (one node's output: a turn's few messages) are
        # serialised on the event loop rather than in a worker thread. Serialising holds the
        # GIL either way; the hop added ~1 ms a write while the query embedding kept both
        # cores busy, and a turn stores one or two.
        query = (
            self.UPSERT_CHECKPOINT_WRITES_SQL
            if all(w[0] in WRITES_IDX_MAP for w in writes)
            else self.INSERT_CHECKPOINT_WRITES_SQL
        )
        configurable = config["configurable"]
        params = self._dump_writes(
            configurable["thread_id"],
            configurable["checkpoint_ns"],
            configurable["checkpoint_id"],
            task_id,
            task_path,
            writes,
        )
        async with self._cursor(pipeline=True) as cur:
            await cur.executemany(query, params)


INTERRUPT_CHANNEL = "__interrupt__"
"""The channel of LangGraph's interrupt writes (private in langgraph 1.x; one of WRITES_IDX_MAP's)."""
assert INTERRUPT_CHANNEL in WRITES_IDX_MAP

PAUSED_THREADS_SQL = """
SELECT t.thread_id
FROM unnest(%s::text[]) AS t(thread_id)
CROSS JOIN LATERAL (
    SELECT c.checkpoint_id FROM checkpoints c
    WHERE c.thread_id = t.thread_id AND c.checkpoint_ns = ''
    ORDER BY c.checkpoint_id DESC
    LIMIT 1
) latest
WHERE EXISTS (
    SELECT 1 FROM checkpoint_writes w
    WHERE w.thread_id = t.thread_id AND w.checkpoint_ns = ''
        AND w.checkpoint_id = latest.checkpoint_id AND w.channel = %s
)
"""


def _without_nul(checkpoint: Checkpoint) -> Checkpoint:
    """The checkpoint with NUL taken out of its plain string values.

    The library keeps a channel's string inline in the checkpoint's jsonb, which cannot hold
    NUL: one in a planner's answer or a typed goal would fail the write and lose the turn.
    Messages and other values go to the blobs as bytes and keep theirs.
    """
    values = checkpoint["channel_values"]
    bad = [k for k, v in values.items() if isinstance(v, str) and "\x00" in v]
    if not bad:
        return checkpoint
    cleaned = {**values, **{k: values[k].replace("\x00", "") for k in bad}}
    return {**checkpoint, "channel_values": cleaned}


async def threads_with_interrupts(pool: Any, thread_ids: Sequence[str]) -> list[str]:
    """Those of `thread_ids` whose head checkpoint holds an interrupt write: the threads that may
    be paused on a question, in one query (a superset: `aget_state` says which question is
    still pending). Callers pass ids they have checked the user owns."""
    if not thread_ids:
        return []
    async with pool.connection() as conn:
        cur = await conn.execute(PAUSED_THREADS_SQL, (list(thread_ids), INTERRUPT_CHANNEL))
        return [row["thread_id"] for row in await cur.fetchall()]
