"""Assistant graph: recall_memories -> assistant <-> tools, over the checkpointed conversation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_core.messages import (
    AIMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
    trim_messages,
)
from langgraph.graph import START, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.runtime import Runtime

from graphs.assistant.prompts import SYSTEM_PROMPT, TOOL_BUDGET_NOTE
from graphs.assistant.state import RecalledMemory, State
from graphs.assistant.tools import TOOLS
from graphs.core.context import Context
from graphs.core.models import chat_model
from graphs.core.nodes import bind, on_loop
from graphs.core.toolcalls import limit_tool_calls
from graphs.memory.recall import Recalled, memory_block, note_recalled, recall
from graphs.memory.scoped import Memory, ScopedMemory

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langchain_core.runnables import Runnable
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.graph.state import CompiledStateGraph
    from langgraph.store.base import BaseStore

MODEL_WINDOW_TOKENS = 6000
"""What the model sees, in approximate tokens; the checkpoint keeps everything."""
MAX_STATE_MESSAGES = 80
"""Live state keeps the latest messages (whole turns); older ones stay in the thread's checkpoint
history (get_state_history) and in the conversation record, so turn time and checkpoint bytes
stay flat however long a thread grows."""
TOOL_CALL_BUDGET = 4
"""Tool calls per user message before the model is told to answer with what it has."""
TOOL_BUDGET_SPENT = (
    "I stopped here: this message already used all the memory tool calls it may make. "
    "Nothing more was saved or forgotten; please ask again if something is missing."
)
EMPTY_REPLY = "The model sent an empty answer. Please try again."


async def recall_memories(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Pinned profile facts plus the facts closest to the latest user message, fresh every turn."""
    if runtime.store is None or not runtime.context.memory:
        return {"recalled": []}
    memory = ScopedMemory.from_runtime(runtime)
    query = _latest_human_text(state["messages"])
    found: Recalled = await recall(memory, query)
    note_recalled(memory, found)
    return {"recalled": [_as_recalled(m) for m in found.memories]}


@dataclass(frozen=True)
class AssistantDeps:
    """What the assistant node needs, bound once when the graph is built."""

    model: BaseChatModel
    """Answers once the tool budget is spent (no tools offered)."""
    with_tools: Runnable[Any, Any]
    """The same model with the memory tools bound."""

    @classmethod
    def of(cls, model: BaseChatModel) -> AssistantDeps:
        return cls(model=model, with_tools=model.bind_tools(TOOLS))


async def assistant(state: State, *, deps: AssistantDeps) -> dict[str, Any]:
    """Answer with the trimmed conversation and the recalled memories as labelled data."""
    used = _tool_calls_this_turn(state["messages"])
    over_budget = used >= TOOL_CALL_BUDGET
    prompt = SYSTEM_PROMPT.format(memories=_block(state.get("recalled", [])))
    if over_budget:
        prompt += TOOL_BUDGET_NOTE
    window = _window(state["messages"])
    runnable = deps.model if over_budget else deps.with_tools
    answer = await runnable.ainvoke([SystemMessage(prompt), *window])
    # The budget holds in code: a model offered no tools may still answer with tool calls, and
    # one reply may ask for any number of them.
    reply = limit_tool_calls(answer, TOOL_CALL_BUDGET - used)
    if reply.tool_calls:
        return {"messages": [reply]}
    if not str(reply.text).strip():
        reply = AIMessage(TOOL_BUDGET_SPENT if over_budget else EMPTY_REPLY, id=reply.id)
    return {"messages": [reply, *_prune([*state["messages"], reply])]}


def build_graph(
    *,
    checkpointer: BaseCheckpointSaver | None,
    store: BaseStore | None,
    model: BaseChatModel | None = None,
) -> CompiledStateGraph[Any, Any, Any, Any]:
    deps = AssistantDeps.of(model or assistant_model())
    builder = StateGraph(State, context_schema=Context)
    builder.add_node(recall_memories)
    builder.add_node(bind(assistant, deps=deps))
    builder.add_node("tools", ToolNode(TOOLS, handle_tool_errors=True))
    builder.add_edge(START, "recall_memories")
    builder.add_edge("recall_memories", "assistant")
    builder.add_conditional_edges("assistant", on_loop(tools_condition))
    builder.add_edge("tools", "assistant")
    return builder.compile(checkpointer=checkpointer, store=store, name="assistant")


def assistant_model() -> BaseChatModel:
    from graphs.assistant.offline import offline_assistant
    from graphs.core.settings import get_settings

    return offline_assistant() if get_settings().offline else chat_model("chat")


def _prune(messages: list[Any]) -> list[RemoveMessage]:
    """Drop the oldest whole turns once the live state is over MAX_STATE_MESSAGES."""
    excess = len(messages) - MAX_STATE_MESSAGES
    if excess <= 0:
        return []
    cut = next(
        (i for i in range(excess, len(messages)) if isinstance(messages[i], HumanMessage)),
        excess,
    )
    return [RemoveMessage(id=m.id) for m in messages[:cut] if m.id]


def _window(messages: list[Any]) -> list[Any]:
    """The last MODEL_WINDOW_TOKENS of the conversation, never without the current request.

    A request bigger than the budget on its own is sent whole rather than trimmed away.
    """
    window = trim_messages(
        messages,
        max_tokens=MODEL_WINDOW_TOKENS,
        token_counter="approximate",  # noqa: S106 (not a password)
        strategy="last",
        start_on="human",
        include_system=False,
    )
    start = max((i for i, m in enumerate(messages) if isinstance(m, HumanMessage)), default=0)
    current_turn = messages[start:]
    if current_turn and not any(m is current_turn[0] for m in window):
        return list(current_turn)
    return list(window)


def _block(recalled: list[RecalledMemory]) -> str:
    memories = [Memory(r["key"], r["content"], "", "", {}, 0.0, True) for r in recalled]
    block = memory_block(Recalled(pinned=memories, relevant=[], latency_ms=0, searched=False))
    return f"\n{block}" if block else ""


def _as_recalled(memory: Memory) -> RecalledMemory:
    return {"key": memory.key, "content": memory.content}


def _latest_human_text(messages: list[Any]) -> str:
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            return str(message.text)
    return ""


def _tool_calls_this_turn(messages: list[Any]) -> int:
    count = 0
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            break
        count += isinstance(message, ToolMessage)
    return count
