"""What the user does to their memory by hand: edit, forget, confirm or reject a suggestion,
forget what one conversation taught, export it all. Through the scoped wrappers only."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from graphs.memory.policy import MemoryOp, check_op
from graphs.memory.scoped import Memory, ScopedMemory, now_iso

if TYPE_CHECKING:
    from graphs.memory.plans import PlanExample, PlanMemory
    from graphs.memory.policy import Reason
    from graphs.memory.research import ResearchMemory, SourceMemory

log = logging.getLogger("cairn.memory")

REFUSALS: dict[str, str] = {
    "empty": "A memory cannot be empty.",
    "too_long": "That is too long for one memory; keep it to a short fact.",
    "secret": "That looks like a password, card, account or ID number; Cairn does not keep those.",
    "instruction": "That reads like an instruction to the assistant, not a fact about you.",
    "other_person": "That is about someone else; Cairn keeps facts about you only.",
    "authority": "That is about roles, permissions or access; memory never grants those.",
    "disallowed_category": "That is about a sensitive topic you have not turned on for memory.",
}


class MemoryNotFound(LookupError):
    """No such memory or suggestion for this user (another user's key looks exactly alike)."""


class MemoryRefused(ValueError):
    def __init__(self, reason: Reason, detail: str = "") -> None:
        super().__init__(REFUSALS.get(reason, "That cannot be stored."))
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Erased:
    memories: int
    tombstones: int


async def edit_memory(memory: ScopedMemory, key: str, content: str) -> Memory:
    """Replace a memory's text under the same key (re-embedded; source records the edit).

    The user's own words still pass the content checks: a secret or an instruction typed
    here would be replayed into every prompt just the same.
    """
    async with memory.locked():
        current = await memory.get(key)
        if current is None:
            raise MemoryNotFound(key)
        try:
            op = MemoryOp.model_validate(
                {
                    "action": "update",
                    "key": key,
                    "content": content.strip(),
                    "category": current.category,
                    "stated": True,
                }
            )
        except ValidationError:
            raise MemoryRefused("empty" if not content.strip() else "too_long") from None
        settings = await memory.settings()
        verdict = check_op(
            op,
            existing={},
            tombstones=[],
            opted_in=settings.opted_in | {current.category},
        )
        if verdict.reason not in ("ok", "unknown_key"):
            raise MemoryRefused(verdict.reason, verdict.detail)
        # Typed by the user on purpose: a matching forget record must not sweep it away.
        await memory.clear_tombstone(key=key, content=op.content)
        source = {**current.source, "edited": {"by": "user", "at": now_iso()}}
        await memory.put(
            key,
            content=op.content,
            category=verdict.op.category,
            source=source,
            confidence=1.0,
            stated=True,
        )
    updated = await memory.get(key)
    assert updated is not None
    log.info("memory edited by its user user=%s key=%s", memory.user_id, key)
    return updated


async def forget_key(memory: ScopedMemory, key: str) -> None:
    """Delete a memory and tombstone it (honoured on the very next recall)."""
    async with memory.locked():
        current = await memory.get(key)
        if current is None:
            raise MemoryNotFound(key)
        await memory.forget_unlocked(current, reason="deleted on the memory page")


async def answer_suggestion(memory: ScopedMemory, key: str, *, accept: bool) -> Memory | None:
    """A sensitive fact waiting for the user: confirmed → stored; rejected → dropped and
    tombstoned, so the writer does not propose it again."""
    async with memory.locked():
        suggestion = await memory.suggestion(key)
        if suggestion is None:
            raise MemoryNotFound(key)
        content = str(suggestion.get("content", ""))
        category = str(suggestion.get("category", "other"))
        await memory.drop_suggestion(key)
        if not accept:
            # Tombstone the fact only (no key): a stored memory under the same key stays.
            stand_in = Memory("", content, category, "", {}, 0.0, stated=True)
            await memory.forget_unlocked(stand_in, reason="suggestion rejected")
            return None
        source = {**dict(suggestion.get("source") or {}), "confirmed_at": now_iso()}
        await memory.put(
            key, content=content, category=category, source=source, confidence=1.0, stated=True
        )
    return await memory.get(key)


async def forget_thread_memories(memory: ScopedMemory, thread_id: str) -> int:
    """Forget (delete + tombstone) everything learned from one conversation. Caller holds
    the user's lock, so a memory job cannot write from that conversation in between."""
    forgotten = 0
    for item in await memory.all_memories():
        if item.source.get("thread_id") == thread_id:
            await memory.forget_unlocked(item, reason=f"conversation {thread_id} deleted")
            forgotten += 1
    for suggestion in await memory.suggestions():
        source: dict[str, Any] = dict(suggestion.get("source") or {})
        if source.get("thread_id") == thread_id:
            await memory.drop_suggestion(str(suggestion.get("key")))
            forgotten += 1
    return forgotten


def source_json(source: SourceMemory) -> dict[str, Any]:
    """A source rating as the page and the export show it (`id` is what a delete names)."""
    return {
        "id": source.id,
        "source": source.source,
        "passed": source.passed,
        "total": source.total,
        "last_cited": source.last,
        "thread_ids": list(source.threads),
        "from_unnamed_conversations": source.earlier,
    }


def plan_json(example: PlanExample) -> dict[str, Any]:
    return asdict(example)


async def export_agent_memories(research: ResearchMemory, plans: PlanMemory) -> dict[str, Any]:
    """The other agents' memories of the user: Research's source ratings, the Planner's
    examples, and the deletes that keep them from coming back."""
    forgotten = await research.forgotten()
    return {
        "research_sources": [source_json(s) for s in await research.sources()],
        "research_sources_deleted": [{"source": s, "at": at} for s, at in forgotten.items()],
        "plan_examples": [plan_json(e) for e in await plans.examples()],
        "plan_examples_deleted": await plans.forgotten(),
    }


async def export_memories(
    memory: ScopedMemory, *, research: ResearchMemory, plans: PlanMemory
) -> dict[str, Any]:
    """Everything Cairn keeps about the user in long-term memory, as plain JSON."""
    settings = await memory.settings()
    return {
        "user": memory.user_id,
        "exported_at": now_iso(),
        "settings": {"enabled": settings.enabled, "opted_in": sorted(settings.opted_in)},
        "memories": [
            {
                "key": m.key,
                "content": m.content,
                "category": m.category,
                "updated_at": m.updated_at,
                "source": m.source,
                "confidence": m.confidence,
                "stated": m.stated,
            }
            for m in sorted(await memory.all_memories(), key=lambda m: m.key)
        ],
        "suggestions": await memory.suggestions(),
        "forgotten": [
            {"key": t.key, "fact": t.fact} for t in await memory.tombstones() if t.fact or t.key
        ],
        **await export_agent_memories(research, plans),
    }
