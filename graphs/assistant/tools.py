"""Memory tools for the Assistant: remember (instant, validated) and forget (tombstoned)."""

from __future__ import annotations

from typing import Annotated, Any

from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langgraph.prebuilt.tool_node import ToolRuntime
from langgraph.types import Command, interrupt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from graphs.core.context import Context
from graphs.memory.policy import (
    SENSITIVE_CATEGORIES,
    Category,
    MemoryOp,
    check_op,
    normalise_fact,
)
from graphs.memory.scoped import MEMORY_KINDS, Memory, ScopedMemory

FORGET_MATCH_THRESHOLD = 0.5

# What the assistant tells the user when a fact is refused, by policy reason.
REFUSALS = {
    "secret": "it looks like a password, code, card, account or ID number, and I never store those",
    "other_person": "it is about someone other than you, and I only remember facts about you",
    "instruction": "it reads like an instruction to me rather than a fact about you",
    "disallowed_category": "it is about a sensitive topic (health, religion, politics, sexuality or finances) that you have not enabled for memory",
    "too_long": "it is too long; please state it in one short sentence",
    "empty": "there was nothing to remember",
    "duplicate": "I already remember exactly that",
    "inferred_over_stated": "it conflicts with something you told me directly",
    "unknown_key": "there is no such memory to update",
}


class ConfirmDecision(BaseModel):
    """What the UI sends back when the user answers a memory confirmation."""

    model_config = ConfigDict(extra="forbid")

    decision: Annotated[str, Field(pattern="^(confirm|reject)$")]


def _memory(runtime: ToolRuntime[Context, Any]) -> ScopedMemory:
    if runtime.store is None or runtime.context is None:
        msg = "memory tools need a store and a signed-in user"
        raise RuntimeError(msg)
    return ScopedMemory(runtime.store, runtime.context.user_id)


@tool
async def remember(fact: str, category: Category, runtime: ToolRuntime[Context, Any]) -> str:
    """Save a fact about the user right away, because they explicitly asked you to remember it.

    Args:
        fact: One short statement about the user starting with "User", e.g. "User is vegetarian".
        category: The kind of fact (profile, preference, fact, relationship, work, or a
            sensitive one: health, religion, politics, sexuality, finance_sensitive).
    """
    if runtime.context is not None and not runtime.context.memory:
        return "Not saved: this is a temporary chat, which keeps nothing in long-term memory."
    memory = _memory(runtime)
    settings = await memory.settings()
    if not settings.enabled:
        return "Not saved: memory is switched off for this account."
    op = MemoryOp(action="insert", content=fact.strip(), category=category, stated=True)
    # Tombstones are not checked here: an explicit request to remember wins over an earlier
    # forget, but only once every other check and the user's confirmation have passed.
    verdict = check_op(
        op, existing=await memory.existing(), tombstones=[], opted_in=settings.opted_in
    )
    if not verdict.accepted or verdict.key is None:
        return f"Not saved: {REFUSALS.get(verdict.reason, verdict.reason)}."
    # The policy may have re-labelled the fact (a fact about asthma is a health fact).
    category = verdict.op.category
    if category in SENSITIVE_CATEGORIES and not _confirmed(verdict.op):
        return "Not saved: you chose not to store that."
    source = {"thread_id": runtime.context.thread_id, "kind": "remember_tool"}
    async with memory.locked():
        await memory.clear_tombstone(key=verdict.key, content=op.content)
        await memory.put(
            verdict.key,
            content=op.content,
            category=category,
            source=source,
            confidence=1.0,
            stated=True,
        )
    return f"Saved: {op.content}"


def _confirmed(op: MemoryOp) -> bool:
    """Sensitive facts in an opted-in category wait for the user's explicit confirmation."""
    answer = interrupt({"kind": "confirm_memory", "content": op.content, "category": op.category})
    try:
        return ConfirmDecision.model_validate(answer).decision == "confirm"
    except ValidationError:
        return False


@tool
async def forget(what: str, runtime: ToolRuntime[Context, Any]) -> Command[Any]:
    """Forget something about the user for good, because they asked you to.

    Args:
        what: The fact to forget, in the user's words or as remembered, e.g. "User is vegetarian".
    """
    memory = _memory(runtime)
    target = await _find(memory, what)
    if target is None:
        # Nothing stored yet (the background job may not have run): the tombstone still
        # stops the fact from being saved later.
        target = Memory(
            key="",
            content=what,
            category="other",
            updated_at="",
            source={},
            confidence=0,
            stated=True,
        )
        text = f"Noted: I won't remember that ({what})."
    else:
        text = f"Forgotten: {target.content}"
    await memory.forget(target, reason="user asked in chat")
    fact = normalise_fact(target.content)
    recalled = [
        r
        for r in runtime.state.get("recalled", [])
        if r["key"] != target.key and normalise_fact(r["content"]) != fact
    ]
    return Command(
        update={
            "recalled": recalled,
            "messages": [ToolMessage(text, tool_call_id=runtime.tool_call_id or "forget")],
        }
    )


async def _find(memory: ScopedMemory, what: str) -> Memory | None:
    if (found := await memory.get(what.strip())) is not None:
        return found
    wanted = normalise_fact(what)
    memories = await memory.all_memories()
    for m in memories:
        if normalise_fact(m.content) == wanted:
            return m
    matches = await memory.search(
        what, limit=1, threshold=FORGET_MATCH_THRESHOLD, kinds=MEMORY_KINDS
    )
    return matches[0] if matches else None


TOOLS = [remember, forget]
