"""Plan memory: summaries of past plans under `(user_id, "plans")`, the namespace built here only."""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from graphs.core.text import has_controls
from graphs.memory.locks import user_locks_for
from graphs.memory.policy import detect_secret, has_injection_marker
from graphs.memory.scoped import MissingIdentity, now_iso, user_label

if TYPE_CHECKING:
    from langgraph.runtime import Runtime
    from langgraph.store.base import BaseStore

    from graphs.core.context import Context
    from graphs.memory.locks import UserLocks

log = logging.getLogger("cairn.memory")

PLANS = "plans"
TOMBSTONES = "tombstones"
"""(user, "plans", "tombstones"): examples the user deleted, by key; never stored again."""
GOOD_OUTCOMES = frozenset({"answered"})
OUTCOMES = frozenset({"answered", "partial", "rejected", "failed"})
MAX_EXAMPLES = 3
MAX_STEP_CHARS = 160
"""Stored steps are cut to this: examples show a plan's shape, not its wording."""
MAX_CHECKED_STEP_CHARS = 500
"""A longer step (the review's own limit) is refused, not cut: it was never a reviewable step."""
MAX_STORED_STEPS = 12
MAX_GOAL_CHARS = 300


@dataclass(frozen=True)
class PastPlan:
    goal: str
    steps: list[str]
    outcome: str
    quality: str
    score: float | None = None


@dataclass(frozen=True)
class PlanExample:
    """A stored summary as the user sees it: what the Planner is shown, and where it came from."""

    key: str
    goal: str
    steps: list[str]
    outcome: str
    quality: str
    thread_id: str | None
    at: str


class PlanMemory:
    """Store access for one user's plans. Nothing the model writes can name the namespace.

    A write and a delete hold the user's memory lock (graphs.memory.locks), and a write checks
    the user's deletes under it right before the put: a deleted example never comes back.
    """

    def __init__(self, store: BaseStore, user_id: str, *, locks: UserLocks | None = None) -> None:
        if not isinstance(user_id, str) or not user_id.strip():
            msg = "plan memory needs the verified user's id"
            raise MissingIdentity(msg)
        self._store = store
        self.user_id = user_id
        self._namespace = (user_label(user_id), PLANS)
        self._forgotten_ns = (*self._namespace, TOMBSTONES)
        self._locks = locks or user_locks_for(store)

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
        plans = [
            past_plan(item.value, getattr(item, "score", None))
            for item in items
            if tuple(item.namespace) == self._namespace
        ]
        return best_examples(plans, limit=limit)

    async def record(
        self, *, key: str, thread_id: str, goal: str, steps: list[str], outcome: str
    ) -> None:
        """Plan structure and outcome label only: no results, no rows. Upsert: a re-run node
        writes the same key again instead of a duplicate. `steps` must be the steps the user
        approved; each is checked here as well, and one bad step keeps the whole summary out."""
        if (problem := summary_problem(goal, steps)) is not None:
            # A failed write is better than a wrong one: a summary becomes an example in later
            # planner prompts, so nothing instruction-shaped or personal may enter it.
            log.info("plan summary not kept: %s", problem)
            return
        value = summary_value(goal=goal, steps=steps, outcome=outcome, thread_id=thread_id)
        async with self._locks.hold(self.user_id):
            if await self._store.aget(self._forgotten_ns, key) is not None:
                log.info("plan summary not kept: its user deleted it")
                return
            await self._store.aput(self._namespace, key, value)

    async def count(self) -> int:
        return len(await self._all())

    async def examples(self) -> list[PlanExample]:
        """Every stored summary, newest first, as stored (whether or not it still passes)."""
        found = [_example(item.key, item.value) for item in await self._all()]
        return sorted(found, key=lambda e: e.at, reverse=True)

    async def forgotten(self) -> list[dict[str, str]]:
        """The user's deletes: key and when (no goal text: that went with the example)."""
        items = await self._store.asearch(self._forgotten_ns, limit=10_000)
        return [{"key": i.key, "at": str(i.value.get("at", ""))} for i in items]

    async def forget(self, key: str) -> PlanExample | None:
        """Delete one example and record that the user did, so no re-run writes it again; None
        if the user has no such example (another user's key looks exactly alike)."""
        async with self._locks.hold(self.user_id):
            item = await self._store.aget(self._namespace, key)
            if item is None:
                return None
            await self._store.aput(self._forgotten_ns, key, {"at": now_iso()}, index=False)
            await self._store.adelete(self._namespace, key)
        log.info("plan example deleted by its user user=%s", self.user_id)
        return _example(key, item.value)

    async def forget_thread(self, thread_id: str) -> int:
        """A deleted conversation takes its plan summaries with it."""
        async with self._locks.hold(self.user_id):
            doomed = [i for i in await self._all() if i.value.get("thread_id") == thread_id]
            for item in doomed:
                await self._store.adelete(self._namespace, item.key)
        return len(doomed)

    async def _all(self) -> list[Any]:
        """The summaries only: the search also matches the deletes' namespace beneath."""
        found: list[Any] = []
        seen = 0
        while batch := await self._store.asearch(self._namespace, limit=500, offset=seen):
            seen += len(batch)
            found.extend(i for i in batch if tuple(i.namespace) == self._namespace)
        return found


_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_NUMBER_RUN = re.compile(r"\+?[0-9][0-9 ().-]*[0-9]")


def best_examples(plans: list[PastPlan], *, limit: int = MAX_EXAMPLES) -> list[PastPlan]:
    """The plans that pass today's checks, good outcomes and closer matches first."""
    # Checked again on the way out: a row written before these checks (or by anything
    # else) never reaches the planner's prompt unless it would pass them today.
    plans = [p for p in plans if summary_problem(p.goal, p.steps) is None]
    plans.sort(key=lambda p: (p.quality == "good", p.score or 0.0), reverse=True)
    return plans[:limit]


def summary_value(*, goal: str, steps: list[str], outcome: str, thread_id: str) -> dict[str, Any]:
    """The stored row of a summary that passed summary_problem: shape and outcome label only."""
    steps = [s.strip()[:MAX_STEP_CHARS] for s in steps]
    return {
        "content": f"Goal: {goal[:MAX_GOAL_CHARS]}\nSteps: " + " | ".join(steps),
        "goal": goal[:MAX_GOAL_CHARS],
        "steps": steps,
        "outcome": outcome,
        "quality": "good" if outcome in GOOD_OUTCOMES else "poor",
        "thread_id": thread_id,
        "at": now_iso(),
    }


def summary_problem(goal: str, steps: list[str]) -> str | None:
    """Why a plan summary may not be stored or shown as an example, or None if it may."""
    if not steps or len(steps) > MAX_STORED_STEPS:
        return f"it has {len(steps)} steps"
    if any(not step.strip() or len(step) > MAX_CHECKED_STEP_CHARS for step in steps):
        return "a step is empty or longer than a reviewable step"
    if any(has_controls(text) for text in (goal, *steps)):
        return "the goal or a step holds control characters"
    for text in (goal, *steps):
        if has_injection_marker(text):
            return "the goal or a step reads like an instruction to the model"
        if _personal(text):
            return "the goal or a step holds personal details"
    return None


def _personal(text: str) -> bool:
    """Secrets (cards, IDs, keys ...), e-mail addresses and phone-like numbers (10+ digits;
    a year range such as 2023-2024 is not one)."""
    if detect_secret(text) is not None or _EMAIL.search(text):
        return True
    return any(sum(c.isdigit() for c in run) >= 10 for run in _NUMBER_RUN.findall(text))


def summary_key(thread_id: str, goal: str) -> str:
    """One summary per goal per thread, whatever retries happen."""
    return hashlib.sha256(f"{thread_id}\n{goal}".encode()).hexdigest()[:32]


def _example(key: str, value: dict[str, Any]) -> PlanExample:
    steps = value.get("steps")
    thread_id = value.get("thread_id")
    return PlanExample(
        key=key,
        goal=str(value.get("goal", "")),
        steps=[str(s) for s in steps] if isinstance(steps, list) else [],
        outcome=str(value.get("outcome", "")),
        quality="good" if value.get("quality") == "good" else "poor",
        thread_id=thread_id if isinstance(thread_id, str) else None,
        at=str(value.get("at", "")),
    )


def past_plan(value: dict[str, Any], score: float | None) -> PastPlan:
    """A stored row as an example; labels outside the known ones read as "unknown"/"poor"."""
    steps = value.get("steps")
    outcome = str(value.get("outcome", ""))
    return PastPlan(
        goal=str(value.get("goal", "")),
        steps=[str(s) for s in steps] if isinstance(steps, list) else [],
        outcome=outcome if outcome in OUTCOMES else "unknown",
        quality="good" if value.get("quality") == "good" else "poor",
        score=score,
    )
