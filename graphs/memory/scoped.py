"""The one way into long-term memory: every namespace built from the verified user, never from input."""

from __future__ import annotations

import logging
import math
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from langgraph.store.base import GetOp, Item, PutOp, SearchItem, SearchOp

from graphs.core.store import PipelinedStore
from graphs.memory.locks import UserLocks, user_locks_for
from graphs.memory.policy import PROFILE_SLOTS, Existing, Tombstone, fact_key, normalise_fact
from graphs.memory.situations import (
    Boosts,
    Situation,
    fact_categories,
    fact_pattern,
    request_situations,
    situations_for,
)

if TYPE_CHECKING:
    from langgraph.runtime import Runtime
    from langgraph.store.base import BaseStore, Item

    from graphs.core.context import Context

log = logging.getLogger("cairn.memory")

ROOT = "memories"
PROFILE = "profile"
"""Pinned core facts (name, language, home city ...): always recalled."""
FACTS = "facts"
"""Everything else: recalled by semantic search on the latest message."""
TOMBSTONES = "tombstones"
MARKERS = "markers"
SETTINGS = "settings"
SUGGESTIONS = "suggestions"
"""Sensitive facts (in a category the user opted into) waiting for the user's confirmation."""
MEMORY_KINDS = (PROFILE, FACTS)
RESEMBLANCE = 0.78
"""Cosine similarity (MiniLM) at which a fact is a forgotten one in other words: keeps apart
"window" vs "aisle seats" (0.70) and "vegetarian" vs "vegan" (0.76)."""
LAST_RECALLED = "last_recalled_at"
ALL_KINDS = (PROFILE, FACTS, TOMBSTONES, MARKERS, SETTINGS, SUGGESTIONS)


def user_label(user_id: str) -> str:
    """user_id as one namespace label. Labels may not contain "." (the store's separator;
    e-mail-like OIDC subjects do), so "%" and "." are percent-encoded: distinct ids stay
    distinct and no id is a prefix of another's namespace path."""
    return user_id.replace("%", "%25").replace(".", "%2E")


class MissingIdentity(PermissionError):
    """A memory call without a verified user: refused before it reaches the store."""


@dataclass(frozen=True)
class Memory:
    key: str
    content: str
    category: str
    updated_at: str
    source: dict[str, Any]
    confidence: float
    stated: bool
    score: float | None = None
    last_recalled_at: str | None = None
    """When recall last put this fact in front of the model (graphs.memory.recall)."""

    @classmethod
    def from_item(cls, item: Item) -> Memory:
        v = item.value
        return cls(
            key=item.key,
            content=str(v.get("content", "")),
            category=str(v.get("category", "other")),
            updated_at=str(v.get("updated_at", "")),
            source=dict(v.get("source") or {}),
            confidence=float(v.get("confidence", 0.0)),
            stated=bool(v.get("stated", True)),
            score=getattr(item, "score", None),
            last_recalled_at=v.get(LAST_RECALLED) or None,
        )


@dataclass(frozen=True)
class MemorySettings:
    enabled: bool = True
    """Off means off: no recall, no writes, no jobs."""
    opted_in: frozenset[str] = field(default_factory=frozenset)
    """Sensitive categories the user allowed (each write still needs their confirmation)."""


@dataclass(frozen=True)
class Snapshot:
    """Everything a memory job weighs, read in one store round trip."""

    settings: MemorySettings
    memories: list[Memory]
    tombstones: list[Tombstone]
    suggestions: list[dict[str, Any]]
    marker: dict[str, Any]

    def existing(self) -> dict[str, Existing]:
        return _existing(self.memories)


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


class ScopedMemory:
    """Store access for one user. Namespaces are `("memories", user_id, kind)`, built here only."""

    def __init__(self, store: BaseStore, user_id: str, *, locks: UserLocks | None = None) -> None:
        if not isinstance(user_id, str) or not user_id.strip():
            msg = "memory access needs the verified user's id"
            raise MissingIdentity(msg)
        self._store = store
        self.user_id = user_id
        self.label = user_label(user_id)
        self._locks = locks or user_locks_for(store)

    @classmethod
    def from_runtime(cls, runtime: Runtime[Context]) -> ScopedMemory:
        """Identity from the run's context (set by ui/ from the session), never from arguments."""
        context = runtime.context
        if context is None or runtime.store is None:
            msg = "this run has no user context or no store"
            raise MissingIdentity(msg)
        return cls(runtime.store, context.user_id)

    def _ns(self, kind: str) -> tuple[str, ...]:
        if kind not in ALL_KINDS:
            msg = f"unknown memory namespace {kind!r}"
            raise ValueError(msg)
        return (ROOT, self.label, kind)

    def locked(self) -> AbstractAsyncContextManager[None]:
        """Serialise this user's memory mutations (across workers with Postgres)."""
        return self._locks.hold(self.user_id)

    async def _read(
        self, ops: list[Any], *, query: str | None = None, boosts: Boosts | None = None
    ) -> list[Any]:
        """A batch of reads in one round trip. Every namespace built by `_ns` is a leaf (nothing
        is stored beneath it), so on Postgres it is matched exactly (graphs.core.store).

        A search for `query` adds `boosts.situation` to the facts whose words bear on a
        situation the query asks about (graphs.memory.situations), else `boosts.category` to
        those whose category does, and `boosts.lexical` to those sharing a word stem with it:
        in the query on Postgres; elsewhere (in-memory stores in tests) to the results, after
        the store's own limit, and without the lexical part (no text search there).
        """
        b = boosts or Boosts()
        asked = request_situations(query) if query and (b.situation or b.category) else []
        if isinstance(self._store, PipelinedStore):
            return await self._store.aread_exact(
                ops,
                boost_pattern=fact_pattern(asked),
                boost=b.situation,
                boost_categories=fact_categories(asked),
                category_boost=b.category,
                lexical_boost=b.lexical if query else 0.0,
            )
        results = list(await self._store.abatch(ops))
        return [_boosted(r, asked, b) if isinstance(r, list) else r for r in results]

    # Memories -----------------------------------------------------------------------------

    @staticmethod
    def kind_for(key: str) -> str:
        return PROFILE if key in PROFILE_SLOTS else FACTS

    async def pinned(self, *, limit: int = 20) -> list[Memory]:
        items = await self._store.asearch(self._ns(PROFILE), limit=limit)
        return [Memory.from_item(i) for i in items]

    async def recall_batch(
        self, query: str | None, *, limit: int, threshold: float, boosts: Boosts | None = None
    ) -> tuple[MemorySettings, list[Memory], list[Memory]]:
        """Settings, pinned facts and the facts closest to query, in one store round trip.

        The store first awaits the query's embedding (already computed, or under way, when the
        UI started it as the message arrived). Reading settings and pinned facts while the
        embedding is computed was tried: on two cores the extra round trip slows the embedding
        threads more than it hides (`make bench`: recall p50 13.6 ms overlapped, 10.3 ms not).
        """
        ops: list[Any] = [
            GetOp(self._ns(SETTINGS), "prefs", refresh_ttl=False),
            SearchOp(self._ns(PROFILE), limit=20, refresh_ttl=False),
        ]
        if query:
            ops.append(SearchOp(self._ns(FACTS), query=query, limit=limit, refresh_ttl=False))
        settings_item, profile, *rest = await self._read(ops, query=query, boosts=boosts)
        found = rest[0] if rest else []
        relevant = [
            Memory.from_item(i)
            for i in cast("list[SearchItem]", found)
            if i.score is not None and i.score >= threshold
        ]
        pinned = [Memory.from_item(i) for i in cast("list[Item]", profile)]
        return _settings_from(cast("Item | None", settings_item)), pinned, relevant

    async def search(
        self, query: str, *, limit: int, threshold: float, kinds: tuple[str, ...] = (FACTS,)
    ) -> list[Memory]:
        """Semantic search; matches scoring below threshold are dropped as too weak."""
        found: list[Memory] = []
        for kind in kinds:
            items = await self._store.asearch(self._ns(kind), query=query, limit=limit)
            found.extend(
                Memory.from_item(i) for i in items if i.score is not None and i.score >= threshold
            )
        found.sort(key=lambda m: m.score or 0.0, reverse=True)
        return found[:limit]

    async def all_memories(self, *, limit: int = 1000) -> list[Memory]:
        found: list[Memory] = []
        for kind in MEMORY_KINDS:
            items = await self._store.asearch(self._ns(kind), limit=limit)
            found.extend(Memory.from_item(i) for i in items)
        return found

    async def existing(self) -> dict[str, Existing]:
        return _existing(await self.all_memories())

    async def snapshot(self, *, marker_for: str | None = None) -> Snapshot:
        """Settings, every memory, tombstone and suggestion (and a thread's marker) at once."""
        ops: list[Any] = [
            GetOp(self._ns(SETTINGS), "prefs", refresh_ttl=False),
            SearchOp(self._ns(TOMBSTONES), limit=10_000, refresh_ttl=False),
            SearchOp(self._ns(SUGGESTIONS), limit=1000, refresh_ttl=False),
            *(SearchOp(self._ns(kind), limit=1000, refresh_ttl=False) for kind in MEMORY_KINDS),
        ]
        if marker_for is not None:
            ops.append(GetOp(self._ns(MARKERS), marker_for, refresh_ttl=False))
        results: list[Any] = await self._read(ops)
        marker = results.pop() if marker_for is not None else None
        settings, tombstones, suggestions, *kinds = results
        return Snapshot(
            settings=_settings_from(settings),
            memories=[Memory.from_item(i) for items in kinds for i in items],
            tombstones=[_tombstone(i) for i in tombstones],
            suggestions=[dict(i.value) for i in suggestions],
            marker=dict(marker.value) if marker is not None else {},
        )

    async def get(self, key: str) -> Memory | None:
        item = await self._store.aget(self._ns(self.kind_for(key)), key)
        return Memory.from_item(item) if item else None

    async def put(
        self,
        key: str,
        *,
        content: str,
        category: str,
        source: dict[str, Any],
        confidence: float,
        stated: bool,
    ) -> None:
        """Upsert by stable key. Callers validate first (graphs.memory.policy) and hold the lock.

        An update keeps when the memory was last recalled: an edit, a job's update or a
        `remember` of the same key is the same memory, used as recently as before. On Postgres
        the upsert keeps the later of the stored stamp and none (one statement, so a recall
        stamping the item meanwhile is never lost); elsewhere the stamp is read and carried,
        under the lock `mark_recalled` also holds there.
        """
        ns = self._ns(self.kind_for(key))
        value: dict[str, Any] = {
            "content": content,
            "category": category,
            "updated_at": now_iso(),
            "source": source,
            "confidence": confidence,
            "stated": stated,
        }
        if isinstance(self._store, PipelinedStore):
            await self._store.aput_keeping_latest(ns, key, value, fields=(LAST_RECALLED,))
            return
        current = await self._store.aget(ns, key, refresh_ttl=False)
        if current is not None and current.value.get(LAST_RECALLED):
            value[LAST_RECALLED] = current.value[LAST_RECALLED]
        await self._store.aput(ns, key, value)

    async def mark_recalled(self, keys: list[str], *, at: str | None = None) -> int:
        """Stamp when these memories were last recalled; a memory deleted meanwhile stays deleted.

        On Postgres one UPDATE per namespace, of existing rows only (no upsert, no re-embedding).
        Elsewhere (in-memory stores in tests) a read and re-put under the user's lock, which
        `forget` also holds, so a forgotten item is never written back.
        """
        at = at or now_iso()
        stamped = 0
        for kind in MEMORY_KINDS:
            mine = [k for k in dict.fromkeys(keys) if self.kind_for(k) == kind]
            if not mine:
                continue
            if isinstance(self._store, PipelinedStore):
                stamped += await self._store.astamp_existing(
                    self._ns(kind), mine, field=LAST_RECALLED, at=at
                )
                continue
            async with self.locked():
                for key in mine:
                    item = await self._store.aget(self._ns(kind), key)
                    if item is not None:
                        value = {**item.value, LAST_RECALLED: at}
                        await self._store.aput(self._ns(kind), key, value)
                        stamped += 1
        return stamped

    async def delete(self, key: str) -> None:
        await self._store.adelete(self._ns(self.kind_for(key)), key)

    # Forgetting -----------------------------------------------------------------------------

    async def tombstones(self) -> list[Tombstone]:
        items = await self._store.asearch(self._ns(TOMBSTONES), limit=10_000)
        return [_tombstone(i) for i in items]

    async def forget(self, memory: Memory, *, reason: str) -> None:
        """Delete the item and record its tombstone together, under the user lock."""
        async with self.locked():
            await self.forget_unlocked(memory, reason=reason)

    async def forget_unlocked(self, memory: Memory, *, reason: str) -> None:
        fact = normalise_fact(memory.content)
        key = memory.key or None
        tombstone = {"key": key, "fact": fact, "at": now_iso(), "reason": reason}
        await self._store.aput(self._ns(TOMBSTONES), fact_key(fact), tombstone, index=False)
        if key is not None:
            await self.delete(key)
        log.info("forgot memory user=%s key=%s (%s)", self.user_id, memory.key, reason)

    async def resembles_forgotten(
        self, content: str, tombstones: list[Tombstone], *, threshold: float = RESEMBLANCE
    ) -> bool:
        """A forgotten fact in other words ("likes window seats" after forgetting "prefers
        window seats"), by cosine similarity of the store's own embeddings."""
        facts = [t.fact for t in tombstones if t.fact]
        return any(await self._resembling(content, facts, threshold=threshold))

    async def _resembling(self, content: str, facts: list[str], *, threshold: float) -> list[bool]:
        embeddings = getattr(self._store, "embeddings", None)
        if embeddings is None or not facts:
            return [False] * len(facts)
        vectors = await embeddings.aembed_documents([normalise_fact(content), *facts])
        return [_cosine(vectors[0], other) >= threshold for other in vectors[1:]]

    async def clear_tombstone(self, *, key: str, content: str) -> bool:
        """The user restated a forgotten fact and explicitly asked to remember it (or typed it
        on the memory page): every forget record of it goes, in these words or in others."""
        from graphs.memory.policy import is_tombstoned

        items = await self._store.asearch(self._ns(TOMBSTONES), limit=10_000)
        same = [is_tombstoned(key=key, content=content, tombstones=[_tombstone(i)]) for i in items]
        others = [i for i, hit in zip(items, same, strict=True) if not hit and i.value.get("fact")]
        similar = await self._resembling(
            content, [str(i.value["fact"]) for i in others], threshold=RESEMBLANCE
        )
        doomed = [i for i, hit in zip(items, same, strict=True) if hit]
        doomed += [i for i, hit in zip(others, similar, strict=True) if hit]
        for item in doomed:
            await self._store.adelete(self._ns(TOMBSTONES), item.key)
        return bool(doomed)

    async def sweep(self) -> int:
        """Safety net after every job: delete anything that matches a tombstone."""
        async with self.locked():
            return await self.sweep_locked()

    async def sweep_locked(self, now: Snapshot | None = None) -> int:
        """sweep() for a caller that already holds this user's lock (and may have just read
        everything under it: `now`)."""
        from graphs.memory.policy import is_tombstoned

        removed = 0
        now = now or await self.snapshot()
        tombstones = now.tombstones
        for memory in now.memories:
            if is_tombstoned(key=memory.key, content=memory.content, tombstones=tombstones):
                await self.delete(memory.key)
                removed += 1
        for suggestion in now.suggestions:
            key, content = str(suggestion.get("key")), str(suggestion.get("content"))
            if is_tombstoned(key=key, content=content, tombstones=tombstones):
                await self.drop_suggestion(key)
                removed += 1
        if removed:
            log.warning("sweep removed %d tombstoned items for user %s", removed, self.user_id)
        return removed

    # Suggestions ----------------------------------------------------------------------------

    async def suggest(
        self, key: str, *, content: str, category: str, source: dict[str, Any]
    ) -> None:
        value = {"key": key, "content": content, "category": category, "source": source}
        await self._store.aput(self._ns(SUGGESTIONS), key, {**value, "at": now_iso()}, index=False)

    async def suggestions(self) -> list[dict[str, Any]]:
        items = await self._store.asearch(self._ns(SUGGESTIONS), limit=1000)
        return [dict(i.value) for i in items]

    async def drop_suggestion(self, key: str) -> None:
        await self._store.adelete(self._ns(SUGGESTIONS), key)

    async def suggestion(self, key: str) -> dict[str, Any] | None:
        item = await self._store.aget(self._ns(SUGGESTIONS), key)
        return dict(item.value) if item else None

    # Erasing --------------------------------------------------------------------------------

    async def items(self, *, include_tombstones: bool = True) -> list[Item]:
        """Every item the user owns: under ("memories", user, ...) and under the other agents'
        user-first namespaces (user, ...), whatever the sub-namespace."""
        found: list[Item] = []
        roots = [(ROOT, self.label)] if self.label == ROOT else [(ROOT, self.label), (self.label,)]
        for root in roots:
            seen = 0
            while True:
                page = await self._store.asearch(root, limit=500, offset=seen)
                found.extend(page)
                seen += len(page)
                if len(page) < 500:
                    break
        if include_tombstones:
            return found
        return [i for i in found if i.namespace[2:3] != (TOMBSTONES,)]

    async def erase_locked(self, *, include_tombstones: bool) -> int:
        """Delete every item of this user (tombstones only when asked). Caller holds the lock."""
        doomed = await self.items(include_tombstones=include_tombstones)
        if doomed:
            await self._store.abatch([PutOp(i.namespace, i.key, None) for i in doomed])
        return len(doomed)

    # Bookkeeping ----------------------------------------------------------------------------

    async def marker(self, thread_id: str) -> dict[str, Any]:
        item = await self._store.aget(self._ns(MARKERS), thread_id)
        return dict(item.value) if item else {}

    async def set_marker(
        self, thread_id: str, *, current: dict[str, Any] | None = None, **fields: Any
    ) -> None:
        """Update fields of the thread's marker; current: the marker as just read, if it was."""
        value = {**(await self.marker(thread_id) if current is None else current), **fields}
        await self._store.aput(self._ns(MARKERS), thread_id, value, index=False)

    async def drop_marker(self, thread_id: str) -> None:
        await self._store.adelete(self._ns(MARKERS), thread_id)

    async def settings_and_marker(self, thread_id: str) -> tuple[MemorySettings, dict[str, Any]]:
        settings, marker = await self._read(
            [
                GetOp(self._ns(SETTINGS), "prefs", refresh_ttl=False),
                GetOp(self._ns(MARKERS), thread_id, refresh_ttl=False),
            ]
        )
        current = dict(cast("Item", marker).value) if marker is not None else {}
        return _settings_from(cast("Item | None", settings)), current

    async def settings(self) -> MemorySettings:
        return _settings_from(await self._store.aget(self._ns(SETTINGS), "prefs"))

    async def save_settings(self, settings: MemorySettings) -> None:
        value = {"enabled": settings.enabled, "opted_in": sorted(settings.opted_in)}
        await self._store.aput(self._ns(SETTINGS), "prefs", value, index=False)


def _existing(memories: list[Memory]) -> dict[str, Existing]:
    return {m.key: Existing(key=m.key, content=m.content, stated=m.stated) for m in memories}


def _tombstone(item: Item) -> Tombstone:
    return Tombstone(key=item.value.get("key"), fact=item.value.get("fact"))


def _boosted(items: list[Any], asked: list[Situation], boosts: Boosts) -> list[Any]:
    if not asked:
        return items
    names = {s.name for s in asked}
    categories = set(fact_categories(asked))
    for item in items:
        if item.score is None:
            continue
        if names & {s.name for s in situations_for(item.value.get("content", ""))}:
            item.score += boosts.situation
        elif item.value.get("category") in categories:
            item.score += boosts.category
    return sorted(items, key=lambda i: i.score or 0.0, reverse=True)


def _settings_from(item: Item | None) -> MemorySettings:
    if item is None:
        return MemorySettings()
    return MemorySettings(
        enabled=bool(item.value.get("enabled", True)),
        opted_in=frozenset(item.value.get("opted_in", [])),
    )


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0
