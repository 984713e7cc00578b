"""A workspace's research source memory: how each source's quotes held up in the team's checks.

Source reliability belongs to the workspace the conversation belongs to. A Research run in a
team conversation records its counts here, under `(TEAM_ROOT, workspace_id, "sources")`, and
its orchestrator reads this file as /memories/source_reliability.md; a run in a personal
conversation records into and reads the user's own (graphs.memory.research), exactly as before.
Instead of both, not as well as: a team conversation's evidence is the team's work, so copying
it into the author's personal memory would carry the team's learnings out of the team (and onto
the author's memory page); and a member's personal ratings, learned in their own conversations,
are not the team's to be guided by. Other teams never see either. The workspace id comes only
from the run's context (ui/ sets it from the thread's stored workspace), never from a model.

The same code and checks as the user's own ratings apply (counted from the citation check, only
for sources the thread fetched, decaying, at most MAX_SOURCES, refused when the file would read
like page text, a secret or an instruction). Who contributed which conversation's counts is kept
beside the file, in `(..., "sources", "authors")`, only so that an author's leaving or wiping can
find them: it is never shown. Then their conversations' counts stay as unnamed counts and the
author rows go. Deleting a conversation takes its counts (or leaves them unnamed) as for the
user's own. An admin's delete of a source is remembered, as a user's is.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from graphs.memory.gallery import TEAM_ROOT, search_prefix
from graphs.memory.research import (
    TOMBSTONES,
    ResearchMemory,
    SourceMemory,
    SourceRatings,
    memory_namespace_for,
)
from graphs.memory.scoped import MissingIdentity

if TYPE_CHECKING:
    from collections.abc import Iterable

    from langgraph.store.base import BaseStore

    from graphs.core.context import Context
    from graphs.memory.locks import UserLocks
    from graphs.memory.research import CheckedReport, FetchedPage

log = logging.getLogger("cairn.research")

SOURCES = "sources"
AUTHORS = "authors"


def team_namespace(workspace_id: object) -> tuple[str, ...]:
    """`(TEAM_ROOT, workspace_id, "sources")`; refused without a usable workspace id."""
    if (
        not isinstance(workspace_id, str)
        or not workspace_id.strip()
        or any(c in workspace_id for c in ".\x00")
    ):
        msg = "the team's source memory needs the thread's stored workspace id"
        raise MissingIdentity(msg)
    return (TEAM_ROOT, workspace_id, SOURCES)


class TeamSources(SourceRatings):
    """One workspace's source ratings. Changes hold the workspace's source lock, so an admin's
    delete, a run's write and an author's anonymisation never interleave."""

    def __init__(
        self,
        store: BaseStore,
        workspace_id: str,
        *,
        author: str | None = None,
        locks: UserLocks | None = None,
    ) -> None:
        namespace = team_namespace(workspace_id)
        super().__init__(
            store,
            namespace,
            forgotten_ns=(*namespace, TOMBSTONES),
            lock_key=f"{TEAM_ROOT}:{workspace_id}:{SOURCES}",
            locks=locks,
        )
        self.workspace_id = workspace_id
        self.author = author
        """The run's verified user, for recording; None for reading, deleting, anonymising."""
        self._authors_ns = (*namespace, AUTHORS)

    async def record_check(
        self, result: CheckedReport, fetched: Iterable[FetchedPage], *, thread_id: str
    ) -> str | None:
        """As for a user's ratings. The author is kept beside the file, written first, so
        counts are never stored without a way to find their author."""
        if not self.author:
            msg = "a team's source rating needs the verified author"
            raise MissingIdentity(msg)
        async with self._locks.hold(self._lock_key):
            value = {"author": self.author, "thread_id": thread_id}
            await self._store.aput(self._authors_ns, thread_id, value, index=False)
            return await self._record_locked(result, fetched, thread_id=thread_id)

    async def forget_thread(self, thread_id: str, *, forget: bool) -> int:
        changed = await super().forget_thread(thread_id, forget=forget)
        await self._store.adelete(self._authors_ns, thread_id)
        return changed

    async def anonymise(self, author: str) -> int:
        """The author's conversations' counts stay, unnamed; the rows naming them go. Returns
        how many of their conversations were anonymised."""
        async with self._locks.hold(self._lock_key):
            rows = await search_prefix(self._store, self._authors_ns, filter={"author": author})
            threads = {str(r.value.get("thread_id", r.key)) for r in rows}
            if threads:
                await self._drop_threads(threads, forget=False)
            for row in rows:
                await self._store.adelete(self._authors_ns, row.key)
        return len(rows)


def public(source: SourceMemory) -> dict[str, Any]:
    """A team source as members see it: no conversations, no authors."""
    return {
        "id": source.id,
        "source": source.source,
        "passed": source.passed,
        "total": source.total,
        "last": source.last,
    }


def source_namespace(context: object) -> tuple[str, ...]:
    """Where the run's orchestrator reads /memories/ from: its conversation's workspace's file,
    else the user's own (refused without a verified user)."""
    if workspace_id := getattr(context, "workspace_id", None):
        return team_namespace(workspace_id)
    return memory_namespace_for(getattr(context, "user_id", None))


def ratings_for(store: BaseStore, context: Context) -> SourceRatings:
    """The ratings a run records into: the workspace's in a team conversation, else the user's."""
    if context.workspace_id:
        return TeamSources(store, context.workspace_id, author=context.user_id)
    return ResearchMemory(store, context.user_id)


async def anonymise_source_author(
    store: BaseStore, author: str, *, workspace_id: str | None = None
) -> int:
    """The author's counts in one workspace (they left it) or in all (their account is wiped)
    anonymised. Safe to run again."""
    prefix = (TEAM_ROOT, workspace_id) if workspace_id else (TEAM_ROOT,)
    found = await search_prefix(store, prefix, filter={"author": author})
    workspaces = sorted({str(i.namespace[1]) for i in found if _is_author_row(i)})
    return sum([await TeamSources(store, ws).anonymise(author) for ws in workspaces])


async def forget_thread_sources(store: BaseStore, thread_id: str, *, forget: bool) -> int:
    """A deleted conversation's counts leave (or stay unnamed in) whichever team holds them."""
    found = await search_prefix(store, (TEAM_ROOT,), filter={"thread_id": thread_id})
    workspaces = sorted({str(i.namespace[1]) for i in found if _is_author_row(i)})
    changed = 0
    for ws in workspaces:
        changed += await TeamSources(store, ws).forget_thread(thread_id, forget=forget)
    return changed


def _is_author_row(item: Any) -> bool:
    namespace = tuple(item.namespace)
    return len(namespace) == 4 and namespace[0] == TEAM_ROOT and namespace[2:] == (SOURCES, AUTHORS)
