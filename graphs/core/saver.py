"""The checkpointer: langgraph's Postgres saver, reading a checkpoint's blobs by key.

The library's query joins a checkpoint's channel versions to its thread's blobs; Postgres
estimates the versions at 100 rows and hash-joins them against every blob of the thread, so
loading a conversation slowed as it grew (0.9 ms at 200 turns, linear after). Here each
channel's blob is an index lookup on the blobs' primary key (0.2 ms, flat). Same columns, same
rows: everything else is the library's saver.
"""

from __future__ import annotations

from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

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


class CairnSaver(AsyncPostgresSaver):
    """`AsyncPostgresSaver` whose checkpoint reads look blobs up by key (see module doc)."""

    SELECT_SQL = SELECT_SQL
