"""The team plan gallery: a workspace's approved plans, examples for every member's team runs.

A Planner run in a team conversation records its summary in the user's own plans (plans.py)
and here, under `(TEAM_ROOT, workspace_id, "plans")`, a namespace built here only from the
run's context (set by ui/ from the thread's stored workspace), never from anything a model or
client says. The same checks as for the user's own examples apply on the way in and out.

Each entry keeps its author's id only so that the author's leaving or wiping can find it: it is
never shown to anyone. When the author leaves the workspace or wipes their account, their
entries are anonymised: the author, the conversation and the goal (personal: it is what they
asked) are removed, and the approved steps stay, shown with the goal "(goal removed)".
Deleting the conversation removes its entries. An admin's delete is remembered (a delete record
under the entry's key), so a re-run never brings the entry back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from graphs.memory.locks import user_locks_for
from graphs.memory.plans import (
    MAX_EXAMPLES,
    PLANS,
    TOMBSTONES,
    PastPlan,
    PlanMemory,
    best_examples,
    past_plan,
    summary_problem,
    summary_value,
)
from graphs.memory.scoped import MissingIdentity, now_iso

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    from langgraph.runtime import Runtime
    from langgraph.store.base import BaseStore

    from graphs.core.context import Context
    from graphs.memory.locks import UserLocks

log = logging.getLogger("cairn.memory")

TEAM_ROOT = "%team"
"""Root label of every workspace's namespaces. No user's root can equal it (user_label always
writes "%" as "%25"), so a team's rows never sit under a user's root: a user's erase or wipe
count never takes or counts them."""
GOAL_REMOVED = "(goal removed)"
"""What an anonymised entry shows (and the Planner is shown) for its goal."""
PAGE = 500


@dataclass(frozen=True)
class GalleryEntry:
    """An entry as members see it: no author, no conversation."""

    key: str
    goal: str
    steps: list[str]
    outcome: str
    quality: str
    at: str
    anonymised: bool

    def public(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "goal": self.goal,
            "steps": self.steps,
            "outcome": self.outcome,
            "quality": self.quality,
            "at": self.at,
            "anonymised": self.anonymised,
        }


class TeamGallery:
    """One workspace's gallery. Mutations hold the workspace's memory lock, so an admin's
    delete and a run's write never interleave (the delete record is checked before each put)."""

    def __init__(
        self, store: BaseStore, workspace_id: str, *, locks: UserLocks | None = None
    ) -> None:
        if (
            not isinstance(workspace_id, str)
            or not workspace_id.strip()
            or any(c in workspace_id for c in ".\x00")
        ):
            msg = "the team gallery needs the thread's stored workspace id"
            raise MissingIdentity(msg)
        self._store = store
        self.workspace_id = workspace_id
        self._namespace = (TEAM_ROOT, workspace_id, PLANS)
        self._deleted_ns = (*self._namespace, TOMBSTONES)
        self._locks = locks or user_locks_for(store)

    @classmethod
    def from_runtime(cls, runtime: Runtime[Context]) -> TeamGallery | None:
        """The run's workspace's gallery; None in a personal or temporary chat."""
        context = runtime.context
        if context is None:
            msg = "this run has no user context"
            raise MissingIdentity(msg)
        if runtime.store is None or not context.memory or not context.workspace_id:
            return None
        return cls(runtime.store, context.workspace_id)

    def _lock(self) -> AbstractAsyncContextManager[None]:
        return self._locks.hold(f"{TEAM_ROOT}:{self.workspace_id}")

    async def similar(self, goal: str, *, limit: int = MAX_EXAMPLES) -> list[PastPlan]:
        items = await self._store.asearch(self._namespace, query=goal, limit=limit * 3)
        plans = [
            _shown(past_plan(item.value, getattr(item, "score", None)))
            for item in items
            if tuple(item.namespace) == self._namespace
        ]
        return best_examples(plans, limit=limit)

    async def record(
        self, *, key: str, author: str, thread_id: str, goal: str, steps: list[str], outcome: str
    ) -> None:
        """The approved steps of a team run (the caller passes what the reviewer approved;
        checked here as for the user's own plans). Upsert by key, like PlanMemory.record."""
        if (problem := summary_problem(goal, steps)) is not None:
            log.info("team plan summary not kept: %s", problem)
            return
        value = summary_value(goal=goal, steps=steps, outcome=outcome, thread_id=thread_id)
        value["author"] = author
        async with self._lock():
            if await self._store.aget(self._deleted_ns, key) is not None:
                log.info("team plan summary not kept: an admin deleted it")
                return
            await self._store.aput(self._namespace, key, value)

    async def entries(self) -> list[GalleryEntry]:
        """Every entry, newest first, as members see it."""
        found = [_entry(item.key, item.value) for item in await self._all()]
        return sorted(found, key=lambda e: e.at, reverse=True)

    async def delete(self, key: str) -> GalleryEntry | None:
        """An admin removes an entry for good; None if the workspace has no such entry."""
        async with self._lock():
            item = await self._store.aget(self._namespace, key)
            if item is None:
                return None
            await self._store.aput(self._deleted_ns, key, {"at": now_iso()}, index=False)
            await self._store.adelete(self._namespace, key)
        return _entry(key, item.value)

    async def anonymise(self, author: str) -> int:
        """The author's entries lose the author, the conversation and the goal; steps stay."""
        async with self._lock():
            doomed = [i for i in await self._all() if i.value.get("author") == author]
            for item in doomed:
                await self._store.aput(self._namespace, item.key, _anonymous(item.value))
        return len(doomed)

    async def forget_thread(self, thread_id: str) -> int:
        async with self._lock():
            doomed = [i for i in await self._all() if i.value.get("thread_id") == thread_id]
            for item in doomed:
                await self._store.adelete(self._namespace, item.key)
        return len(doomed)

    async def _all(self) -> list[Any]:
        """The entries only: the search also matches the delete records beneath."""
        return [i for i in await search_prefix(self._store, self._namespace) if _is_entry(i)]


async def plan_examples(runtime: Runtime[Context], goal: str) -> list[PastPlan]:
    """What the Planner is shown: the user's own past plans, and in a team conversation the
    team's gallery too (one copy of a plan found in both), at most MAX_EXAMPLES."""
    memory = PlanMemory.from_runtime(runtime)
    if memory is None:
        return []
    own = await memory.similar(goal)
    gallery = TeamGallery.from_runtime(runtime)
    if gallery is None:
        return own
    unique: dict[tuple[str, tuple[str, ...]], PastPlan] = {}
    for plan in [*own, *await gallery.similar(goal)]:
        unique.setdefault((plan.goal, tuple(plan.steps)), plan)
    return best_examples(list(unique.values()))


async def remember_team_plan(
    runtime: Runtime[Context], *, key: str, goal: str, steps: list[str], outcome: str
) -> None:
    """A team run's approved plan also goes into its workspace's gallery (nothing elsewhere)."""
    gallery = TeamGallery.from_runtime(runtime)
    if gallery is None:
        return
    context = runtime.context
    await gallery.record(
        key=key,
        author=context.user_id,
        thread_id=context.thread_id,
        goal=goal,
        steps=steps,
        outcome=outcome,
    )


async def anonymise_author(
    store: BaseStore, author: str, *, workspace_id: str | None = None
) -> int:
    """The author's entries in one workspace (they left it) or in all (their account is
    wiped), anonymised. Safe to run again."""
    prefix = (TEAM_ROOT, workspace_id) if workspace_id else (TEAM_ROOT,)
    found = await search_prefix(store, prefix, filter={"author": author})
    workspaces = sorted({str(i.namespace[1]) for i in found if _is_entry(i)})
    return sum([await TeamGallery(store, ws).anonymise(author) for ws in workspaces])


async def forget_thread_entries(store: BaseStore, thread_id: str) -> int:
    """A deleted conversation takes its entries out of whichever gallery holds them."""
    found = await search_prefix(store, (TEAM_ROOT,), filter={"thread_id": thread_id})
    workspaces = sorted({str(i.namespace[1]) for i in found if _is_entry(i)})
    return sum([await TeamGallery(store, ws).forget_thread(thread_id) for ws in workspaces])


async def search_prefix(
    store: BaseStore, prefix: tuple[str, ...], *, filter: dict[str, Any] | None = None
) -> list[Any]:
    """Every item under prefix (matching filter), read a page at a time."""
    found: list[Any] = []
    while batch := await store.asearch(prefix, filter=filter, limit=PAGE, offset=len(found)):
        found.extend(batch)
        if len(batch) < PAGE:
            break
    return found


def _is_entry(item: Any) -> bool:
    namespace = tuple(item.namespace)
    return len(namespace) == 3 and namespace[0] == TEAM_ROOT and namespace[2] == PLANS


def _anonymous(value: dict[str, Any]) -> dict[str, Any]:
    steps = value.get("steps")
    steps = [str(s) for s in steps] if isinstance(steps, list) else []
    kept: dict[str, Any] = {k: value[k] for k in ("outcome", "quality", "at") if k in value}
    return {**kept, "content": "Steps: " + " | ".join(steps), "goal": "", "steps": steps}


def _shown(plan: PastPlan) -> PastPlan:
    if plan.goal:
        return plan
    return PastPlan(GOAL_REMOVED, plan.steps, plan.outcome, plan.quality, plan.score)


def _entry(key: str, value: dict[str, Any]) -> GalleryEntry:
    plan = past_plan(value, None)
    return GalleryEntry(
        key=key,
        goal=plan.goal or GOAL_REMOVED,
        steps=plan.steps,
        outcome=plan.outcome,
        quality=plan.quality,
        at=str(value.get("at", "")),
        anonymised=not plan.goal,
    )
