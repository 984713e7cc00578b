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


async def test_checkpoint_reads_match_the_library_saver(persistence: Persistence) -> None:
    saver = persistence.checkpointer
    assert isinstance(saver, CairnSaver)
    reference = AsyncPostgresSaver(persistence.pool)  # type: ignore[arg-type]
    graph = build_graph(checkpointer=saver, store=persistence.store, model=OfflineChatModel())
    config: dict[str, Any] = {"configurable": {"thread_id": "saver-parity"}}
    context = Context(user_id="saver-u1", thread_id="saver-parity")
    # Past a DeltaChannel snapshot (every 10 updates), so the read crosses one.
    for turn in range(13):
        await graph.ainvoke(
            {"messages": [HumanMessage(f"turn {turn}")]},
            config,
            context=context,
            durability=DURABILITY,
        )
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
