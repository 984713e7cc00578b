"""Runs one graph turn for Chainlit: reply tokens streamed, each node shown as a step."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import chainlit as cl
from langchain_core.messages import AIMessage, AIMessageChunk, ToolMessage

from ui.memory_note import send_memory_note, tool_messages

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from langchain_core.runnables import RunnableConfig
    from langgraph.graph.state import CompiledStateGraph
    from langgraph.types import Command, Durability, StreamMode

    from graphs.core.context import Context

log = logging.getLogger("cairn.turns")

STREAM_MODES: list[StreamMode] = ["messages", "tasks"]

# What users read while a node runs; nodes not listed show their own name.
STEP_LABELS = {
    "assistant": "Thinking",
    "recall_memories": "Recalling memories",
    "tools": "Using tools",
}


def _text_of(chunk: AIMessageChunk) -> str:
    if isinstance(chunk.content, str):
        return chunk.content
    return "".join(part.get("text", "") for part in chunk.content if isinstance(part, dict))


@dataclass
class TurnResult:
    reply: cl.Message | None
    interrupts: list[Any] = field(default_factory=list)
    """Interrupts the run paused on; the UI turns each into buttons."""


async def run_turn(
    graph: CompiledStateGraph[Any, Any, Any, Any],
    inputs: dict[str, Any] | Command[Any] | None,
    *,
    context: Context,
    reply_node: str,
    recursion_limit: int = 25,
    durability: Durability = "async",
) -> TurnResult:
    """Stream a run: `messages` tokens from reply_node into one message, `tasks` as steps."""
    config: RunnableConfig = {
        "configurable": {"thread_id": context.thread_id},
        "recursion_limit": recursion_limit,
    }
    # Created at the first token so it sorts after the steps that led to it.
    reply: cl.Message | None = None
    steps: dict[str, cl.Step] = {}
    started = time.perf_counter()
    first_token_at: float | None = None
    interrupts: list[Any] = []
    tool_results: list[ToolMessage] = []
    stream = graph.astream(
        inputs, config, context=context, stream_mode=STREAM_MODES, durability=durability
    )
    async for mode, chunk in cast("AsyncIterator[tuple[str, Any]]", stream):
        if mode == "messages":
            token, meta = chunk
            if meta.get("langgraph_node") != reply_node or not isinstance(token, AIMessageChunk):
                continue
            if text := _text_of(token):
                if reply is None:
                    first_token_at = time.perf_counter()
                    reply = cl.Message(content="")
                await reply.stream_token(text)
        elif "result" not in chunk and "error" not in chunk:
            step = cl.Step(name=STEP_LABELS.get(chunk["name"], chunk["name"]), type="run")
            steps[chunk["id"]] = step
            await step.send()
        elif (step := steps.pop(chunk["id"], None)) is not None:  # type: ignore[arg-type]
            interrupts.extend(chunk.get("interrupts") or [])
            tool_results.extend(tool_messages(chunk.get("result")))
            step.is_error = bool(chunk.get("error"))
            step.output = "failed" if step.is_error else "done"
            await step.update()
    if reply is None and not interrupts:
        # A model that does not stream still leaves its answer in the checkpoint.
        reply = cl.Message(content=await _final_text(graph, config))
    if reply is not None:
        await reply.send()
    # What code decided about memory, after whatever the model said about it.
    await send_memory_note(tool_results)
    log.info(
        "turn thread=%s first_token_ms=%s total_ms=%.1f",
        context.thread_id,
        f"{(first_token_at - started) * 1000:.1f}" if first_token_at else "-",
        (time.perf_counter() - started) * 1000,
    )
    if interrupts:
        # The stream reports them as plain dicts; the state gives the Interrupt objects.
        interrupts = list((await graph.aget_state(config)).interrupts)
    return TurnResult(reply=reply, interrupts=interrupts)


async def _final_text(graph: CompiledStateGraph[Any, Any, Any, Any], config: RunnableConfig) -> str:
    state = await graph.aget_state(config)
    messages = state.values.get("messages") or []
    last = messages[-1] if messages else None
    return str(last.text) if isinstance(last, AIMessage) else "(no reply)"
