"""The Assistant in the chat: recall, thinking and each tool call as steps, the streamed
reply, and the code's account of what happened to memory."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import chainlit as cl
from langchain_core.messages import AIMessage, AIMessageChunk, ToolMessage

from ui.chainlit.agents import Presentation
from ui.chainlit.surface import ask_question, new_reply
from ui.memory_note import (
    NOTE_AUTHOR,
    NOTE_KIND,
    RECALL_STEP,
    category_label,
    memory_note,
    memory_note_text,
    plain,
    tool_messages,
)

if TYPE_CHECKING:
    from langgraph.types import Interrupt

    from ui.runner import LoadState, Status

REPLY_NODE = "assistant"
NODE_STEPS = {"recall_memories": RECALL_STEP, "assistant": "Thinking"}
"""Nodes shown as steps (Chainlit prefixes "Using"/"Used"); the tools node shows one step per
tool call instead."""
MEMORY_OFF = "Memory is off in this temporary chat: nothing was recalled."
MAX_SHOWN = 600


class AssistantView:
    """Steps in the order things happened, then the reply, then the memory note."""

    def __init__(self, *, memory: bool = True) -> None:
        self.memory = memory
        """Long-term memory is on in this chat (off in a temporary one)."""
        self.reply: cl.Message | None = None
        self.node_steps: dict[str, cl.Step] = {}
        self.tool_steps: dict[str, cl.Step] = {}
        self.tool_results: list[ToolMessage] = []
        self.first_token_at: float | None = None

    async def begin(self, load_state: LoadState) -> None:
        return None

    async def token(self, namespace: tuple[str, ...], token: Any, meta: dict[str, Any]) -> None:
        if meta.get("langgraph_node") != REPLY_NODE or not isinstance(token, AIMessageChunk):
            return
        if text := _text_of(token):
            if self.reply is None:
                self.first_token_at = time.perf_counter()
                self.reply = new_reply()
            await self.reply.stream_token(text)

    async def update(self, namespace: tuple[str, ...], node: str, delta: Any) -> None:
        return None

    async def task(self, namespace: tuple[str, ...], event: dict[str, Any]) -> None:
        if namespace:
            return
        name = event["name"]
        if "result" not in event and "error" not in event:
            if label := NODE_STEPS.get(name):
                started = cl.Step(name=label, type="run", default_open=False)
                self.node_steps[event["id"]] = started
                await started.send()
            return
        step = self.node_steps.pop(event["id"], None)
        result = event.get("result")
        if name == "tools":
            await self._tools_finished(result, failed=bool(event.get("error")))
        if step is None:
            return
        step.is_error = bool(event.get("error"))
        if step.is_error:
            step.output = "failed"
        elif name == "recall_memories" and not self.memory:
            step.output = MEMORY_OFF
        else:
            step.output = _node_output(name, result)
        await step.update()
        if name == REPLY_NODE and not step.is_error:
            await self._tools_called(result)

    async def _tools_called(self, result: Any) -> None:
        """One step per tool call the model asked for, with the arguments it gave."""
        for message in _messages(result):
            if not isinstance(message, AIMessage):
                continue
            for call in message.tool_calls:
                step = cl.Step(name=plain(str(call["name"]))[:60], type="tool", default_open=False)
                step.input = _shown(json.dumps(call.get("args") or {}, ensure_ascii=False))
                step.language = "json"
                self.tool_steps[str(call.get("id"))] = step
                await step.send()

    async def _tools_finished(self, result: Any, *, failed: bool) -> None:
        """Each tool step gets the code's verdict (memory tools) or the tool's result."""
        found = tool_messages(result)
        self.tool_results.extend(found)
        for message in found:
            step = self.tool_steps.pop(message.tool_call_id, None)
            if step is None:
                continue
            verdict = memory_note_text(message)
            step.is_error = message.status == "error"
            step.output = verdict or _shown(str(message.text))
            await step.update()
        if failed:
            await self._close_open("failed")

    async def _close_open(self, why: str) -> None:
        for step in [*self.node_steps.values(), *self.tool_steps.values()]:
            step.is_error = True
            step.output = why
            await step.update()
        self.node_steps.clear()
        self.tool_steps.clear()

    async def end(self, status: Status, load_state: LoadState) -> str | None:
        await self._close_open("stopped")
        if self.reply is None and status == "done":
            # A model that does not stream still leaves its answer in the checkpoint.
            self.reply = new_reply()
            self.reply.content = _final_text((await load_state()).values)
        if self.reply is not None:
            await self.reply.send()
        # What code decided about memory, after whatever the model said about it.
        await send_memory_note(self.tool_results)
        return self.reply.content if self.reply is not None else None


def _node_output(name: str, result: Any) -> str:
    if name == "recall_memories":
        return recall_output(result.get("recalled") if isinstance(result, dict) else None)
    calls = [c["name"] for m in _messages(result) if isinstance(m, AIMessage) for c in m.tool_calls]
    if calls:
        return "Asked to use: " + ", ".join(plain(str(c))[:60] for c in calls)
    return "Answered."


def recall_output(recalled: Any) -> str:
    """The facts recall put in front of the model, each linking to its memory page entry."""
    facts = [r for r in recalled or [] if isinstance(r, dict) and r.get("content")]
    if not facts:
        return "Nothing relevant."
    lines = [
        f"- [{plain(str(r['content']))[:200]}](/memory#memory-{quote(str(r.get('key', '')), safe='')})"
        for r in facts
    ]
    return f"Used {len(facts)} fact(s) from memory:\n" + "\n".join(lines)


def _messages(result: Any) -> list[Any]:
    written = result.get("messages") if isinstance(result, dict) else None
    if isinstance(written, dict):
        written = written.get("$writes", [])
    if not isinstance(written, list):
        written = [written]
    return [m for item in written for m in (item if isinstance(item, list) else [item])]


def _shown(text: str) -> str:
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + " …"


def _text_of(chunk: AIMessageChunk) -> str:
    if isinstance(chunk.content, str):
        return chunk.content
    return "".join(part.get("text", "") for part in chunk.content if isinstance(part, dict))


def _final_text(values: dict[str, Any]) -> str:
    messages = values.get("messages") or []
    last = messages[-1] if messages else None
    return str(last.text) if isinstance(last, AIMessage) else "(no reply)"


async def show_confirm_memory(interrupt: Interrupt, thread_id: str) -> None:
    value = interrupt.value if isinstance(interrupt.value, dict) else {}
    text = (
        "You asked me to remember something sensitive. Should I store it?\n\n"
        f"> {plain(str(value.get('content', '')))}\n\n"
        f"Category: {category_label(str(value.get('category', 'other')))}. "
        "You can delete it any time."
    )
    await ask_question(
        interrupt.id, thread_id, text, {"confirm": "Remember it", "reject": "Don't store it"}
    )


async def send_memory_note(results: Iterable[ToolMessage]) -> cl.Message | None:
    """Sent as its own message, so the data layer stores it with the conversation."""
    note = memory_note(results)
    if note is None:
        return None
    message = cl.Message(content=note, author=NOTE_AUTHOR, metadata={"kind": NOTE_KIND})
    await message.send()
    return message


PRESENTATION = Presentation(
    key="assistant",
    view=lambda context: AssistantView(memory=context.memory),
    questions={"confirm_memory": show_confirm_memory},
)
