"""The Assistant: a personal assistant with long-term memory (graphs/assistant/)."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import HumanMessage

from graphs.assistant.graph import build_graph
from ui.runner import AgentSpec, InterruptKind, McpTool, Starter


def _inputs(text: str, message_id: str) -> dict[str, Any]:
    return {"messages": [HumanMessage(text, id=message_id)]}


SPEC = AgentSpec(
    key="assistant",
    profile="Assistant",
    description="A personal assistant that remembers you across conversations.",
    build=build_graph,
    inputs=_inputs,
    interrupts=(
        InterruptKind(
            name="confirm_memory",
            decisions=frozenset({"confirm", "reject"}),
            describe=lambda value: {k: v for k, v in value.items() if k in ("content", "category")},
        ),
    ),
    stream_modes=("messages", "tasks"),
    memory_jobs=True,
    memory_prefetch=True,
    order=0,
    starters=(
        Starter(
            label="Remember my preferences", message="I prefer short answers, and I work in Berlin."
        ),
        Starter(label="What do you know about me?", message="What do you remember about me?"),
        Starter(label="Plan my week", message="Help me plan a focused work week."),
    ),
    mcp=McpTool(
        name="ask_assistant",
        title="Ask the Assistant",
        description=(
            "Send a message to the user's personal assistant, which recalls and learns what\n"
            "it should remember about them. Pass thread_id to continue a conversation;\n"
            "temporary=true keeps memory out of a new one."
        ),
        summary="talks to a personal assistant that remembers the user",
        text_arg="message",
        temporary=True,
    ),
)
