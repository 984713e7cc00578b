"""State of the Assistant graph."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AnyMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.graph.message import add_messages


def add_message_batches(state: list[AnyMessage], batches: Sequence[Any]) -> list[AnyMessage]:
    """add_messages over a batch of writes, as DeltaChannel replays them."""
    for batch in batches:
        state = add_messages(state, batch)  # type: ignore[assignment,arg-type]
    return state


SNAPSHOT_EVERY = 10
"""Updates between full snapshots of the (bounded) message list. Reading state replays the
writes since the last snapshot, so fewer means faster turns; each snapshot costs one copy of
the live window (graphs.assistant.graph.MAX_STATE_MESSAGES)."""


class RecalledMemory(TypedDict):
    key: str
    content: str


class State(TypedDict):
    """The conversation plus what recall found for the current turn."""

    # DeltaChannel: each checkpoint stores only the new messages (flat bytes per turn) while
    # the thread's full history is still rebuilt from its checkpoints.
    messages: Annotated[
        list[AnyMessage], DeltaChannel(add_message_batches, snapshot_frequency=SNAPSHOT_EVERY)
    ]
    recalled: list[RecalledMemory]
    """Memories for this turn's prompt; replaced by recall_memories, trimmed by forget."""
