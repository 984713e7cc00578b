"""Plan memory: summaries of past plans under `(user_id, "plans")`, the namespace built here only."""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from graphs.memory.policy import detect_secret
from graphs.memory.scoped import MissingIdentity, now_iso, user_label

if TYPE_CHECKING:
    from langgraph.runtime import Runtime
    from langgraph.store.base import BaseStore

    from graphs.core.context import Context

log = logging.getLogger("cairn.memory")

PLANS = "plans"
GOOD_OUTCOMES = frozenset({"answered"})
MAX_EXAMPLES = 3
MAX_STEP_CHARS = 160


@dataclass(frozen=True)
class PastPlan:
    goal: str
    steps: list[str]
    outcome: str
    quality: str
    score: float | None = None


class PlanMemory:
    """Store access for one user's plans. Nothing the model writes can name the namespace."""

    def __init__(self, store: BaseStore, user_id: str) -> None:
        if not isinstance(user_id, str) or not user_id.strip():
            msg = "plan memory needs the verified user's id"
            raise MissingIdentity(msg)
        self._store = store
        self._namespace = (user_label(user_id), PLANS)

    @classmethod
    def from_runtime(cls, runtime: Runtime[Context]) -> PlanMemory | None:
        """The run's own user's plans; None for a temporary chat or a run without a store."""
        context = runtime.context
        if context is None:
            msg = "this run has no user context"
            raise MissingIdentity(msg)
        if runtime.store is None or not context.memory:
            return None
        return cls(runtime.store, context.user_id)

    async def similar(self, goal: str, *, limit: int = MAX_EXAMPLES) -> list[PastPlan]:
        """A few past plans closest to the goal, good outcomes first."""
        items = await self._store.asearch(self._namespace, query=goal, limit=limit * 3)
        plans = [_past_plan(item.value, getattr(item, "score", None)) for item in items]
        plans.sort(key=lambda p: (p.quality == "good", p.score or 0.0), reverse=True)
        return plans[:limit]

    async def record(
        self, *, key: str, thread_id: str, goal: str, steps: list[str], outcome: str
    ) -> None:
        """Plan structure and outcome label only: no results, no rows. Upsert: a re-run node
        writes the same key again instead of a duplicate."""
        steps = [s[:MAX_STEP_CHARS] for s in steps]
        if any(_personal(text) for text in (goal, *steps)):
            # A failed write is better than a wrong one: no plan example is worth keeping a
            # secret, an e-mail address or a phone number in the user's plan memory.
            log.info("plan summary not kept: the goal or a step holds personal details")
            return
        quality = "good" if outcome in GOOD_OUTCOMES else "poor"
        value = {
            "content": f"Goal: {goal[:300]}\nSteps: " + " | ".join(steps),
            "goal": goal[:300],
            "steps": steps,
            "outcome": outcome,
            "quality": quality,
            "thread_id": thread_id,
            "at": now_iso(),
        }
        await self._store.aput(self._namespace, key, value)

    async def count(self) -> int:
        return len(await self._all())

    async def forget_thread(self, thread_id: str) -> int:
        """A deleted conversation takes its plan summaries with it."""
        doomed = [i for i in await self._all() if i.value.get("thread_id") == thread_id]
        for item in doomed:
            await self._store.adelete(self._namespace, item.key)
        return len(doomed)

    async def _all(self) -> list[Any]:
        found: list[Any] = []
        while batch := await self._store.asearch(self._namespace, limit=500, offset=len(found)):
            found.extend(batch)
        return found


_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_NUMBER_RUN = re.compile(r"\+?[0-9][0-9 ().-]*[0-9]")


def _personal(text: str) -> bool:
    """Secrets (cards, IDs, keys ...), e-mail addresses and phone-like numbers (10+ digits;
    a year range such as 2023-2024 is not one)."""
    if detect_secret(text) is not None or _EMAIL.search(text):
        return True
    return any(sum(c.isdigit() for c in run) >= 10 for run in _NUMBER_RUN.findall(text))


def summary_key(thread_id: str, goal: str) -> str:
    """One summary per goal per thread, whatever retries happen."""
    return hashlib.sha256(f"{thread_id}\n{goal}".encode()).hexdigest()[:32]


def _past_plan(value: dict[str, Any], score: float | None) -> PastPlan:
    return PastPlan(
        goal=str(value.get("goal", "")),
        steps=[str(s) for s in value.get("steps", [])][:8],
        outcome=str(value.get("outcome", "unknown")),
        quality=str(value.get("quality", "poor")),
        score=score,
    )
