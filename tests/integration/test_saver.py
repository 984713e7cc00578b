"""graphs.core.saver on a real Postgres: the same checkpoints as the library's saver reads."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from graphs.assistant.graph import build_graph
from graphs.core.context import Context
from graphs.core.offline import OfflineChatModel
from graphs.core.persistence import Persistence
from graphs.core.runs import DURABILITY
from graphs.core.saver import CairnSaver

pytestmark = pytest.mark.integration


def comparable(tuple_: Any) -> Any:
    checkpoint = dict(tuple_.checkpoint)
    values = checkpoint.pop("channel_values")
    return (
        tuple_.config,
        tuple_.parent_config,
        tuple_.metadata,
        checkpoint,
        {k: repr(v) for k, v in values.items()},
        [(task, channel, repr(value)) for task, channel, value in tuple_.pending_writes or []],
    )


async def chat(graph: Any, config: Any, context: Context, *, turns: int) -> None:
    for turn in range(turns):
        await graph.ainvoke(
            {"messages": [HumanMessage(f"turn {turn}")]},
            config,
            context=context,
            durability=DURABILITY,
        )


async def test_checkpoint_reads_match_the_library_saver(persistence: Persistence) -> None:
    saver = persistence.checkpointer
    assert isinstance(saver, CairnSaver)
    reference = AsyncPostgresSaver(persistence.pool)  # type: ignore[arg-type]
    graph = build_graph(checkpointer=saver, store=persistence.store, model=OfflineChatModel())
    config: dict[str, Any] = {"configurable": {"thread_id": "saver-parity"}}
    context = Context(user_id="saver-u1", thread_id="saver-parity")
    # Past a DeltaChannel snapshot (every 10 updates), so the read crosses one.
    await chat(graph, config, context, turns=13)
    latest = await saver.aget_tuple(config)
    assert latest is not None
    await saver.aput_writes(latest.config, [("messages", "pending")], task_id="t-1")

    assert comparable(await saver.aget_tuple(config)) == comparable(
        await reference.aget_tuple(config)
    )
    ours = [comparable(t) async for t in saver.alist(config)]
    theirs = [comparable(t) async for t in reference.alist(config)]
    assert ours == theirs
    assert len(ours) >= 13
    assert ours[0][5] == [("t-1", "messages", repr("pending"))]
    state = await graph.aget_state(config)
    assert [m.text for m in state.values["messages"][::2]] == [f"turn {n}" for n in range(13)]


class _Mirrored(CairnSaver):
    """Ours, also handing every write to the library's saver under `<thread>-lib`."""

    def __init__(self, pool: Any, library: AsyncPostgresSaver) -> None:
        super().__init__(pool)
        self.library = library

    @staticmethod
    def _lib(config: Any) -> Any:
        configurable = config["configurable"]
        return {"configurable": {**configurable, "thread_id": configurable["thread_id"] + "-lib"}}

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        await self.library.aput(self._lib(config), checkpoint, metadata, new_versions)
        return await super().aput(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self, config: Any, writes: Any, task_id: str, task_path: str = ""
    ) -> None:
        await self.library.aput_writes(self._lib(config), writes, task_id, task_path)
        await super().aput_writes(config, writes, task_id, task_path)


async def _rows(pool: Any, thread_id: str) -> dict[str, list[Any]]:
    queries = {
        "checkpoints": "SELECT checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint::text,"
        " metadata::text FROM checkpoints WHERE thread_id = %s ORDER BY checkpoint_id",
        "blobs": "SELECT checkpoint_ns, channel, version, type, blob FROM checkpoint_blobs"
        " WHERE thread_id = %s ORDER BY channel, version",
        "writes": "SELECT checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob"
        " FROM checkpoint_writes WHERE thread_id = %s ORDER BY checkpoint_id, task_id, idx",
    }
    async with pool.connection() as conn:
        found = {}
        for name, sql in queries.items():
            rows = await (await conn.execute(sql, (thread_id,))).fetchall()
            found[name] = [
                tuple(
                    v.replace(thread_id, "<thread>") if isinstance(v, str) else v
                    for v in row.values()  # the pool's rows are dicts
                )
                for row in rows
            ]
        return found


async def test_fenced_writes_store_the_rows_the_library_would(
    persistence: Persistence,
) -> None:
    """The fenced statements store every row the library's would, byte for byte, duplicate
    special writes included (measured, folding a checkpoint's statements into one with arrays
    saved nothing measurable, so the library's statements stay)."""
    pool = persistence.pool
    saver = _Mirrored(pool, AsyncPostgresSaver(pool))  # type: ignore[arg-type]
    graph = build_graph(checkpointer=saver, store=persistence.store, model=OfflineChatModel())
    config: dict[str, Any] = {"configurable": {"thread_id": "mirror"}}
    context = Context(user_id="saver-u2", thread_id="mirror")
    await chat(graph, config, context, turns=12)  # past a DeltaChannel snapshot
    latest = await saver.aget_tuple(config)
    assert latest is not None
    # Two writes to one special channel in one call (one index): upserted, the last one stays;
    # mixed with a regular channel (insert, do nothing), the first one stays.
    await saver.aput_writes(latest.config, [("__error__", "first"), ("__error__", "last")], "t-1")
    await saver.aput_writes(
        latest.config, [("__error__", "kept"), ("messages", "m"), ("__error__", "dropped")], "t-2"
    )
    await saver.aput_writes(latest.config, [], "t-3")

    ours, theirs = await _rows(pool, "mirror"), await _rows(pool, "mirror-lib")
    assert ours == theirs
    assert len(ours["checkpoints"]) >= 36
    assert len({r[1] for r in ours["blobs"]}) >= 2  # channels
    assert len(ours["writes"]) >= 36
    errors = {(r[2], r[7]) for r in ours["writes"] if r[5] == "__error__"}
    serde = saver.serde
    assert errors == {
        ("t-1", serde.dumps_typed("last")[1]),
        ("t-2", serde.dumps_typed("kept")[1]),
    }


async def test_threads_with_interrupts_finds_the_paused_ones_only(persistence: Persistence) -> None:
    from langgraph.graph import START, StateGraph
    from langgraph.types import Command, interrupt
    from typing_extensions import TypedDict

    from graphs.core.saver import threads_with_interrupts

    class S(TypedDict, total=False):
        ask: bool
        answer: str

    def node(state: S) -> dict[str, Any]:
        return {"answer": interrupt("sure?") if state.get("ask") else "no question"}

    builder = StateGraph(S)
    builder.add_node(node)
    builder.add_edge(START, "node")
    graph = builder.compile(checkpointer=persistence.checkpointer)

    def config(thread: str) -> Any:
        return {"configurable": {"thread_id": thread}}

    await graph.ainvoke({"ask": True}, config("paused"), durability=DURABILITY)
    await graph.ainvoke({"ask": False}, config("finished"), durability=DURABILITY)
    await graph.ainvoke({"ask": True}, config("answered"), durability=DURABILITY)
    await graph.ainvoke(Command(resume="yes"), config("answered"), durability=DURABILITY)
    await graph.ainvoke({"ask": True}, config("paused-again"), durability=DURABILITY)
    await graph.ainvoke(Command(resume="yes"), config("paused-again"), durability=DURABILITY)
    await graph.ainvoke({"ask": True}, config("paused-again"), durability=DURABILITY)

    found = await threads_with_interrupts(
        persistence.pool, ["paused", "finished", "answered", "paused-again", "never-ran"]
    )

    assert sorted(found) == ["paused", "paused-again"]
    for thread in ("paused", "paused-again", "answered", "finished"):
        pending = bool((await graph.aget_state(config(thread))).interrupts)
        assert pending == (thread in found), thread
    assert await threads_with_interrupts(persistence.pool, []) == []
