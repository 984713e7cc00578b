"""State of the Assistant graph."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AnyMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.graph.message import add_messages

from graphs.memory.policy import normalise_fact


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


class ForgetUpdate(TypedDict):
    """What one forget call takes out of this turn's recalled memories."""

    forget_key: str
    forget_fact: str
    """The forgotten fact, normalised (graphs.memory.policy.normalise_fact)."""


def update_recalled(
    current: list[RecalledMemory], update: list[RecalledMemory] | ForgetUpdate
) -> list[RecalledMemory]:
    """recall_memories replaces the list; each forget removes its own fact from it.

    A reducer, not a plain value: a model may call forget several times in one reply, and the
    tool calls run in one step, so each forget's removal must add up instead of colliding.
    """
    if isinstance(update, dict):
        return [
            r
            for r in current
            if r["key"] != update["forget_key"]
            and normalise_fact(r["content"]) != update["forget_fact"]
        ]
    return list(update)


class State(TypedDict):
    """The conversation plus what recall found for the current turn."""

    # DeltaChannel: each checkpoint stores only the new messages (flat bytes per turn) while
    # the thread's full history is still rebuilt from its checkpoints.
    messages: Annotated[
        list[AnyMessage], DeltaChannel(add_message_batches, snapshot_frequency=SNAPSHOT_EVERY)
    ]
    recalled: Annotated[list[RecalledMemory], update_recalled]
    """Memories for this turn's prompt; replaced by recall_memories, trimmed by forget."""
