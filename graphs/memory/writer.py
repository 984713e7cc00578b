"""The debounced write_memory job: new messages in, validated upserts out, forgetting always wins."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from langchain_core.exceptions import ModelRefusalError, OutputParserException
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from pydantic import ValidationError

from graphs.memory.grounding import typed_text
from graphs.memory.policy import (
    PROFILE_SLOTS,
    SENSITIVE_CATEGORIES,
    TOMBSTONED,
    MemoryOps,
    Tombstone,
    Verdict,
    check_ops,
    is_tombstoned,
)
from graphs.memory.prompts import WRITER_PROMPT
from graphs.memory.scoped import ScopedMemory, Snapshot

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langgraph.store.base import BaseStore

log = logging.getLogger("cairn.memory")

MAX_NEW_MESSAGES = 60
"""A long idle batch is cut to its most recent messages (the marker still covers all)."""

MessageLoader = Callable[[str], Awaitable[list[BaseMessage]]]


class InvalidModelOutput(ValueError):
    """The memory writer's output failed its schema twice: the run is skipped, nothing written."""


@dataclass
class WriteReport:
    run_id: str
    new_messages: int = 0
    proposed: int = 0
    written: list[str] = field(default_factory=list)
    suggested: list[str] = field(default_factory=list)
    rejected: Counter[str] = field(default_factory=Counter)
    swept: int = 0
    skipped: str | None = None


async def write_memories(
    *,
    store: BaseStore,
    model: BaseChatModel,
    load_messages: MessageLoader,
    user_id: str,
    thread_id: str,
    run_id: str,
    still_wanted: Callable[[], Awaitable[bool]] | None = None,
    first: Snapshot | None = None,
) -> WriteReport:
    """One job run for (user, thread). user_id was resolved from the session when it was queued.

    first: this user's snapshot with the thread's marker, if the caller just read it.
    """
    report = WriteReport(run_id=run_id)
    memory = ScopedMemory(store, user_id)
    now = first or await memory.snapshot(marker_for=thread_id)
    if not (settings := now.settings).enabled:
        report.skipped = "memory_off"
        return report
    messages = await load_messages(thread_id)
    new = _after(messages, now.marker.get("last_message_id"))
    report.new_messages = len(new)
    if not new:
        report.skipped = "nothing_new"
        return report
    existing, tombstones = now.existing(), now.tombstones
    shown = new[-MAX_NEW_MESSAGES:]
    ops = await _propose(model, shown, existing, tombstones)
    report.proposed = len(ops.ops)
    verdicts = check_ops(
        ops,
        existing=existing,
        tombstones=tombstones,
        opted_in=settings.opted_in,
        evidence=user_words(shown),
    )
    source = {"thread_id": thread_id, "message_id": new[-1].id, "job_run_id": run_id}
    async with memory.locked():
        # A conversation deleted (or an account wiped) while the model was thinking: its
        # deletion held this lock, so checking here means nothing is written after it.
        if still_wanted is not None and not await still_wanted():
            report.skipped = "thread_gone"
            return report
        # Read under the lock: every forget, edit and write of this user takes it too, so
        # these tombstones stay current until the batch is done.
        current = await memory.snapshot(marker_for=thread_id)
        await _apply(memory, verdicts, tombstones=current.tombstones, source=source, report=report)
        # What was just written passed the same tombstones, so the sweep looks at the rest.
        report.swept = await memory.sweep_locked(current)
        # Only now, with the whole batch done, does the marker move past these messages.
        await memory.set_marker(thread_id, current=current.marker, last_message_id=new[-1].id)
    for reason, count in report.rejected.items():
        log.info("memory op rejected user=%s reason=%s count=%d", user_id, reason, count)
    return report


def _after(messages: list[BaseMessage], last_id: str | None) -> list[BaseMessage]:
    if last_id is None:
        return list(messages)
    ids = [m.id for m in messages]
    return list(messages[ids.index(last_id) + 1 :]) if last_id in ids else list(messages)


def user_words(messages: list[BaseMessage]) -> list[str]:
    """What the user wrote: the only evidence a proposed fact may be drawn from. The
    assistant's replies and tool results are the model's (or a web page's) words, and an
    attached file is a document's."""
    return [typed_text(str(m.text)) for m in messages if isinstance(m, HumanMessage)]


def transcript(messages: list[BaseMessage]) -> str:
    """One JSON object per message, so no message can pass for another role ("\nUser: …"
    inside a reply); tool results are left out, the assistant's replies are context only."""
    lines = []
    for m in messages:
        if isinstance(m, HumanMessage | AIMessage) and (text := str(m.text)):
            role = "user" if isinstance(m, HumanMessage) else "assistant"
            lines.append(json.dumps({"role": role, "text": text}, ensure_ascii=False))
    return "\n".join(lines)


async def _propose(
    model: BaseChatModel,
    messages: list[BaseMessage],
    existing: dict[str, Any],
    tombstones: list[Any],
) -> MemoryOps:
    prompt = WRITER_PROMPT.format(
        slots=", ".join(PROFILE_SLOTS),
        existing="\n".join(f"- {k}: {e.content}" for k, e in existing.items()) or "(none)",
        forgotten="\n".join(f"- {t.fact or t.key}" for t in tombstones) or "(none)",
    )
    structured = model.with_structured_output(MemoryOps)
    request = [SystemMessage(prompt), HumanMessage(f"New messages:\n{transcript(messages)}")]
    problem: Exception | None = None
    for _attempt in range(2):
        try:
            return MemoryOps.model_validate(await structured.ainvoke(request))
        except ModelRefusalError as exc:
            # Asked again, a refusing model refuses again: the job is skipped, not retried.
            msg = f"memory writer refused: {exc}"
            raise InvalidModelOutput(msg) from exc
        except (ValidationError, OutputParserException, ValueError, TypeError) as exc:
            problem = exc
    msg = f"memory writer returned invalid output twice: {problem}"
    raise InvalidModelOutput(msg)


async def _apply(
    memory: ScopedMemory,
    verdicts: list[Verdict],
    *,
    tombstones: list[Tombstone],
    source: dict[str, Any],
    report: WriteReport,
) -> None:
    """Write the accepted ops. The caller holds the user's lock, so no forget interleaves:
    tombstones, read under that lock, are the current ones for every op of the batch."""
    for verdict in verdicts:
        if not verdict.accepted or verdict.key is None:
            report.rejected[verdict.reason] += 1
            continue
        op = verdict.op
        # Checked again right before each write: a forget may have landed since the job
        # began (the lock keeps a new one out until this batch is done).
        if is_tombstoned(
            key=verdict.key, content=op.content, tombstones=tombstones
        ) or await memory.resembles_forgotten(op.content, tombstones):
            report.rejected[TOMBSTONED] += 1
            continue
        if op.category in SENSITIVE_CATEGORIES:
            await memory.suggest(
                verdict.key, content=op.content, category=op.category, source=source
            )
            report.suggested.append(verdict.key)
            continue
        await memory.put(
            verdict.key,
            content=op.content,
            category=op.category,
            source=source,
            confidence=op.confidence,
            stated=op.stated,
        )
        report.written.append(verdict.key)
