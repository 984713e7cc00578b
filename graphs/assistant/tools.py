"""Memory tools for the Assistant: remember (instant, validated) and forget (tombstoned)."""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.prebuilt.tool_node import ToolRuntime
from langgraph.types import Command, interrupt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from graphs.assistant.state import ForgetUpdate
from graphs.core.context import Context
from graphs.core.text import without_controls
from graphs.memory.grounding import asks_to_forget, remember_request, typed_text
from graphs.memory.policy import (
    AUTHORITY,
    MAX_CHARS,
    NOT_REQUESTED,
    SENSITIVE_CATEGORIES,
    UNGROUNDED,
    Category,
    MemoryOp,
    Verdict,
    check_op,
    detect_secret,
    normalise_fact,
    sensitive_topic,
)
from graphs.memory.scoped import MEMORY_KINDS, Memory, ScopedMemory

log = logging.getLogger("cairn.memory")

FORGET_MATCH_THRESHOLD = 0.5

# What the assistant tells the user when a fact is refused, by policy reason.
REFUSALS = {
    "secret": "it looks like a password, code, card, account or ID number, and I never store those",
    "other_person": "it is about someone other than you, and I only remember facts about you",
    "instruction": "it reads like an instruction to me rather than a fact about you",
    "authority": "it is about roles, permissions or access, which memory never grants",
    "disallowed_category": "it is about a sensitive topic (health, religion, politics, sexuality or finances) that you have not enabled for memory",
    "too_long": "it is too long; please state it in one short sentence",
    "empty": "there was nothing to remember",
    "duplicate": "I already remember exactly that",
    "inferred_over_stated": "it conflicts with something you told me directly",
    "unknown_key": "there is no such memory to update",
    "not_requested": "you did not ask me to remember it in your last message",
    "ungrounded": "it is not what you said; I only save facts in your own words from your message",
}

NAMED_REFUSALS = frozenset({NOT_REQUESTED, UNGROUNDED, AUTHORITY})
NAMED_MAX_CHARS = 120

MemoryOutcome = Literal["saved", "not_saved", "forgotten"]


def memory_result(
    runtime: ToolRuntime[Context, Any], text: str, outcome: MemoryOutcome
) -> ToolMessage:
    """The tool's answer to the model, with the code's decision as a structured artifact.

    The UI shows the artifact to the user after the reply (ui/memory_note.py), so what the
    user reads about their memory comes from code, never from the model's words.
    """
    return ToolMessage(
        text,
        name="forget" if outcome == "forgotten" else "remember",
        tool_call_id=runtime.tool_call_id or "memory",
        artifact={"kind": "memory", "outcome": outcome, "note": text},
    )


class ConfirmDecision(BaseModel):
    """What the UI sends back when the user answers a memory confirmation."""

    model_config = ConfigDict(extra="forbid")

    decision: Annotated[str, Field(pattern="^(confirm|reject)$")]


def _memory(runtime: ToolRuntime[Context, Any]) -> ScopedMemory:
    if runtime.store is None or runtime.context is None:
        msg = "memory tools need a store and a signed-in user"
        raise RuntimeError(msg)
    return ScopedMemory(runtime.store, runtime.context.user_id)


def latest_user_text(state: Any) -> str:
    """The user's own latest message: the only evidence for what they asked to remember."""
    messages = state.get("messages", []) if isinstance(state, dict) else []
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            return typed_text(str(message.text))
    return ""


@tool
async def remember(
    fact: str, category: Category, runtime: ToolRuntime[Context, Any]
) -> ToolMessage:
    """Save a fact about the user right away, because they explicitly asked you to remember it.

    Only facts the user asked you to remember in their latest message are saved, in their own
    words; anything else is refused.

    Args:
        fact: One short statement about the user starting with "User", using the user's own
            words, e.g. "User is vegetarian".
        category: The kind of fact (profile, preference, fact, relationship, work, or a
            sensitive one: health, religion, politics, sexuality, finance_sensitive).
    """
    if runtime.context is not None and not runtime.context.memory:
        text = "Not saved: this is a temporary chat, which keeps nothing in long-term memory."
        return memory_result(runtime, text, "not_saved")
    memory = _memory(runtime)
    settings = await memory.settings()
    if not settings.enabled:
        return memory_result(
            runtime, "Not saved: memory is switched off for this account.", "not_saved"
        )
    op = MemoryOp(action="insert", content=fact.strip(), category=category, stated=True)
    verdict = await _check_requested(memory, op, runtime, opted_in=settings.opted_in)
    if not verdict.accepted or verdict.key is None:
        log.info("remember refused user=%s reason=%s", memory.user_id, verdict.reason)
        return memory_result(runtime, _refusal(verdict), "not_saved")
    # The policy may have re-labelled the fact (a fact about asthma is a health fact).
    category = verdict.op.category
    if category in SENSITIVE_CATEGORIES and not _confirmed(verdict.op):
        return memory_result(runtime, "Not saved: you chose not to store that.", "not_saved")
    source = {"thread_id": runtime.context.thread_id, "kind": "remember_tool"}
    async with memory.locked():
        # The user restated the fact in this message and asked for it: that, and only that,
        # lifts an earlier forget (in these words or others).
        if await memory.clear_tombstone(key=verdict.key, content=op.content):
            log.info("forget record lifted by the user's request user=%s", memory.user_id)
        await memory.put(
            verdict.key,
            content=op.content,
            category=category,
            source=source,
            confidence=1.0,
            stated=True,
        )
    return memory_result(runtime, f"Saved: {op.content}", "saved")


async def _check_requested(
    memory: ScopedMemory,
    op: MemoryOp,
    runtime: ToolRuntime[Context, Any],
    *,
    opted_in: frozenset[str],
) -> Verdict:
    """The policy's checks plus: the user's latest message asks to remember, and the fact is
    drawn from the words of one such request. The model's arguments are never the evidence.

    Tombstones are not checked here: a grounded, explicit request from the user is exactly
    what lifts an earlier forget.
    """
    request = remember_request(latest_user_text(runtime.state))
    if request is None:
        return Verdict(op, None, accepted=False, reason=NOT_REQUESTED)
    existing = await memory.existing()
    verdict: Verdict | None = None
    for scope in request.scope:
        verdict = check_op(
            op,
            existing=existing,
            tombstones=[],
            opted_in=opted_in,
            evidence=[scope],
            keep_polarity=True,
        )
        if verdict.reason != UNGROUNDED:
            return verdict
    assert verdict is not None
    return verdict


def _refusal(verdict: Verdict) -> str:
    """Why a fact was not saved. A fact the user did not ask for is named, so the user sees
    what the model tried; a refused secret or sensitive fact is never repeated back."""
    reason = REFUSALS.get(verdict.reason, verdict.reason)
    fact = " ".join(verdict.op.content.split())
    if verdict.reason not in NAMED_REFUSALS or detect_secret(fact) or sensitive_topic(fact):
        return f"Not saved: {reason}."
    fact = fact if len(fact) <= NAMED_MAX_CHARS else fact[: NAMED_MAX_CHARS - 1] + "…"
    return f'Not saved: "{fact}", because {reason}.'


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
    if not asks_to_forget(latest_user_text(runtime.state)):
        # A model forgetting on its own (told to by a page, a memory or nobody) deletes nothing.
        log.info("forget refused user=%s reason=not_requested", memory.user_id)
        text = "Nothing forgotten: you did not ask me to forget anything in your last message."
        return Command(update={"messages": [memory_result(runtime, text, "not_saved")]})
    what = without_controls(what).strip()
    if not normalise_fact(what) or len(what) > MAX_CHARS:
        # Stored as a forget record otherwise: a page of text would block facts for good.
        text = (
            f"Nothing forgotten: say in one short sentence (at most {MAX_CHARS} characters) "
            "what to forget."
        )
        return Command(update={"messages": [memory_result(runtime, text, "not_saved")]})
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
    dropped: ForgetUpdate = {
        "forget_key": target.key,
        "forget_fact": normalise_fact(target.content),
    }
    return Command(
        update={
            "recalled": dropped,
            "messages": [memory_result(runtime, text, "forgotten")],
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
