"""Assistant graph: a tool-free chat turn over the checkpointed conversation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langchain_core.messages import SystemMessage, trim_messages
from langgraph.graph import END, START, StateGraph

from graphs.assistant.prompts import SYSTEM_PROMPT
from graphs.assistant.state import State
from graphs.core.context import Context
from graphs.core.models import chat_model

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.graph.state import CompiledStateGraph
    from langgraph.store.base import BaseStore

# What the model sees, in approximate tokens; the checkpoint keeps everything.
MODEL_WINDOW_TOKENS = 6000


def build_graph(
    *,
    checkpointer: BaseCheckpointSaver | None,
    store: BaseStore | None,
    model: BaseChatModel | None = None,
) -> CompiledStateGraph[Any, Any, Any, Any]:
    llm = model or chat_model("chat")

    async def assistant(state: State) -> dict[str, Any]:
        window = trim_messages(
            state["messages"],
            max_tokens=MODEL_WINDOW_TOKENS,
            token_counter="approximate",  # noqa: S106 (not a password)
            strategy="last",
            start_on="human",
            include_system=False,
        )
        reply = await llm.ainvoke([SystemMessage(SYSTEM_PROMPT), *window])
        return {"messages": [reply]}

    builder = StateGraph(State, context_schema=Context)
    builder.add_node("assistant", assistant)
    builder.add_edge(START, "assistant")
    builder.add_edge("assistant", END)
    return builder.compile(checkpointer=checkpointer, store=store, name="assistant")
