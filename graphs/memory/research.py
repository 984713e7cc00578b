"""Research memories: evidence-based source reliability, written after the report passed the check.

Only this code writes `/memories/` for research, never a model and never a subagent: what it
records is counted from the deterministic citation check (how often a source's quotes held up),
not a model's opinion, so a hostile page cannot talk its way into being trusted. Entries are
timestamped and decay; they guide which sources to try first and never replace verification.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from graphs.memory.locks import user_locks_for
from graphs.memory.policy import detect_secret, looks_like_instruction
from graphs.memory.scoped import MissingIdentity, now_iso, user_label

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from langgraph.store.base import BaseStore, Item

    from graphs.memory.locks import UserLocks

log = logging.getLogger("cairn.research")

SOURCES_KEY = "/source_reliability.md"
"""Read by the orchestrator as /memories/source_reliability.md (the CompositeBackend route)."""
MAX_SOURCES = 20
EVIDENCE = "evidence"
"""Beside the file's text: each source's counts per conversation (the page shows where from)."""
Evidence = dict[str, dict[str, list[Any]]]
"""{source: {thread_id: [passed, total, last day]}}; thread "" holds unnamed counts."""
EARLIER = ""
MAX_THREADS_PER_SOURCE = 10
"""Beyond this, a source's oldest conversations are counted together, unnamed."""
TOMBSTONES = "tombstones"
"""(user, "research", "tombstones"): sources the user deleted, kept until a wipe's last step."""
DECAY = timedelta(days=180)
_LINE = re.compile(r"^- (\S+): (\d+)/(\d+) quoted excerpts verified \(last (\d{4}-\d{2}-\d{2})\)$")
_LAST = re.compile(r"^\d{4}-\d{2}-\d{2}$")
MAX_MEMORY_LINE_CHARS = 240
"""Longer lines look like copied page text, which never goes into memory."""
_CONTACT = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+|\+?\d[\d ()-]{7,}\d")


# What this module reads of the research graph's types (graphs.research.citations.CheckResult
# and graphs.tools.fetchlog.FetchRecord), so memory depends on no agent and no tool.
class CheckedCitation(Protocol):
    @property
    def url(self) -> str: ...
    @property
    def passed(self) -> bool: ...


class CheckedReport(Protocol):
    @property
    def citations(self) -> Sequence[CheckedCitation]: ...


class FetchedPage(Protocol):
    @property
    def ok(self) -> bool: ...
    @property
    def url(self) -> str: ...
    @property
    def final_url(self) -> str: ...
    @property
    def fetched_at(self) -> str: ...


def memory_namespace_for(user_id: object) -> tuple[str, ...]:
    if not isinstance(user_id, str) or not user_id.strip():
        msg = "research memories need the verified user's id"
        raise MissingIdentity(msg)
    return (user_label(user_id), "research", "memories")


def memory_problem(content: str) -> str | None:
    """Research memories are short learnings about sources: no page text, secrets or personal data."""
    if "<untrusted_page" in content or "fetch_log_id:" in content:
        return "it contains raw page text"
    if detect_secret(content) is not None:
        return "it looks like it contains a secret"
    for match in _CONTACT.finditer(content):
        if "@" in match[0] or sum(ch.isdigit() for ch in match[0]) >= 9:
            return "it contains personal contact details"
    for line in content.splitlines():
        if len(line) > MAX_MEMORY_LINE_CHARS:
            return "a line is long enough to be copied page text"
        if line.strip() and looks_like_instruction(line.strip("-* ")):
            return "it reads like an instruction rather than a learning"
    return None


@dataclass(frozen=True)
class SourceMemory:
    """One source's rating as the user sees it: the counts and the conversations they came from."""

    source: str
    passed: int
    total: int
    last: str
    """The day a report last cited it (YYYY-MM-DD)."""
    threads: tuple[str, ...]
    """The conversations whose checked reports counted it, most recent first."""
    earlier: bool
    """Some of the counts come from conversations not named (deleted, or before they were)."""

    @property
    def id(self) -> str:
        return source_id(self.source)


def source_id(source: str) -> str:
    """What the memory page names a source by: a fixed-shape id, never the host text itself."""
    return hashlib.sha256(source.encode()).hexdigest()[:32]


class SourceRatings:
    """Store access for one owner's research learnings: one file of ratings, the deletes that
    keep a source from coming back, and the lock every change holds.

    Every change is a read-modify-write of one item, so each holds the owner's memory lock
    (graphs.memory.locks): a rating being recorded and a delete never interleave, on any worker.
    The owner is a user (ResearchMemory) or a workspace (graphs.memory.team_sources); the
    namespace is built by the subclass from identity only.
    """

    def __init__(
        self,
        store: BaseStore,
        namespace: tuple[str, ...],
        *,
        forgotten_ns: tuple[str, ...],
        lock_key: str,
        locks: UserLocks | None = None,
    ) -> None:
        self.namespace = namespace
        self._forgotten_ns = forgotten_ns
        self._lock_key = lock_key
        self._store = store
        self._locks = locks or user_locks_for(store)

    async def source_stats(self) -> dict[str, tuple[int, int, str]]:
        return {s: _totals(e) for s, e in _evidence(await self._item()).items()}

    async def sources(self) -> list[SourceMemory]:
        """Every rated source, most evidence first."""
        rated = [_source_memory(s, e) for s, e in _evidence(await self._item()).items()]
        return sorted(rated, key=lambda m: (-m.total, m.source))

    async def forgotten(self) -> dict[str, str]:
        """Sources the owner deleted, with when: {source: ISO time}."""
        items = await self._store.asearch(self._forgotten_ns, limit=1000)
        return {str(i.value.get("source")): str(i.value.get("at", "")) for i in items}

    async def record_check(
        self, result: CheckedReport, fetched: Iterable[FetchedPage], *, thread_id: str
    ) -> str | None:
        """Add this report's per-source pass counts; returns the file written (None if refused).

        `fetched` is the thread's fetch log. Only sources it holds a page from are counted: a
        citation to a source never fetched is a model's invention, and its domain never enters
        memory, not even as a failure (a rating is evidence about pages really read). A source
        deleted (by the user, or a team's admin) is not counted from pages this thread read
        before the delete."""
        async with self._locks.hold(self._lock_key):
            return await self._record_locked(result, fetched, thread_id=thread_id)

    async def _record_locked(
        self, result: CheckedReport, fetched: Iterable[FetchedPage], *, thread_id: str
    ) -> str | None:
        records = list(fetched)
        current = await self._item()
        evidence = _fresh(_evidence(current), datetime.now(UTC).date())
        _add(evidence, result, records, thread_id=thread_id, forgotten=await self.forgotten())
        if not evidence:
            return None
        return await self._write(evidence, current)

    async def forget_source(self, ident: str) -> SourceMemory | None:
        """Delete one source's rating (by `source_id`) and record that it was deleted; None if
        the owner has no such source (another owner's id looks exactly alike)."""
        async with self._locks.hold(self._lock_key):
            current = await self._item()
            evidence = _evidence(current)
            source = next((s for s in evidence if source_id(s) == ident), None)
            if source is None:
                return None
            gone = _source_memory(source, evidence.pop(source))
            value = {"source": source, "at": now_iso()}
            await self._store.aput(self._forgotten_ns, ident, value, index=False)
            await self._replace(evidence, current)
        log.info("research source memory deleted in %s", self.namespace[0])
        return gone

    async def forget_thread(self, thread_id: str, *, forget: bool) -> int:
        """A deleted conversation: its counts go too (`forget`), or stay unnamed. Returns how
        many sources changed."""
        async with self._locks.hold(self._lock_key):
            return await self._drop_threads({thread_id}, forget=forget)

    async def _drop_threads(self, threads: set[str], *, forget: bool) -> int:
        """Under the lock: these conversations' counts removed (`forget`) or merged into the
        unnamed ones. Returns how many sources changed."""
        current = await self._item()
        evidence = _evidence(current)
        touched = [s for s, e in evidence.items() if threads & e.keys()]
        for source in touched:
            for thread_id in sorted(threads & evidence[source].keys()):
                counts = evidence[source].pop(thread_id)
                if not forget:
                    _merge(evidence[source], EARLIER, counts)
            if not evidence[source]:
                del evidence[source]
        if touched:
            await self._replace(evidence, current)
        return len(touched)

    async def _item(self) -> Item | None:
        return await self._store.aget(self.namespace, SOURCES_KEY)

    async def _replace(self, evidence: Evidence, current: Item | None) -> None:
        """Write what is left after a removal; nothing left (or nothing writable) deletes it."""
        if not evidence or await self._write(evidence, current) is None:
            await self._store.adelete(self.namespace, SOURCES_KEY)

    async def _write(self, evidence: Evidence, current: Item | None) -> str | None:
        ranked = sorted(evidence.items(), key=lambda kv: (-_totals(kv[1])[1], kv[0]))
        kept = {source: _capped(per_thread) for source, per_thread in ranked[:MAX_SOURCES]}
        content = "\n".join(_line(source, per_thread) for source, per_thread in kept.items())
        if (problem := memory_problem(content)) is not None:
            log.warning("research memory not written: %s", problem)
            return None
        now = now_iso()
        value = {"content": content, "encoding": "utf-8", "modified_at": now, EVIDENCE: kept}
        value["created_at"] = str(current.value.get("created_at", now)) if current else now
        await self._store.aput(self.namespace, SOURCES_KEY, value)
        return content


class ResearchMemory(SourceRatings):
    """One user's research learnings, under `(user, "research", "memories")`: the source memory
    of their personal conversations. The namespace comes from the verified user id only."""

    def __init__(self, store: BaseStore, user_id: str, *, locks: UserLocks | None = None) -> None:
        namespace = memory_namespace_for(user_id)
        super().__init__(
            store,
            namespace,
            forgotten_ns=(*namespace[:2], TOMBSTONES),
            lock_key=user_id,
            locks=locks,
        )
        self.user_id = user_id


def _evidence(item: Item | None) -> Evidence:
    """The stored per-conversation counts. The file's lines are what the orchestrator reads, so
    they decide which sources exist; a line without (valid) counts behind it, as written before
    conversations were recorded, is one unnamed entry."""
    if item is None:
        return {}
    stored = item.value.get(EVIDENCE)
    stored = stored if isinstance(stored, dict) else {}
    evidence: Evidence = {}
    for line in str(item.value.get("content", "")).splitlines():
        if not (match := _LINE.match(line)):
            continue
        counts = [int(match[2]), int(match[3]), match[4]]
        per_thread = _valid_threads(stored.get(match[1]))
        consistent = _totals(per_thread)[:2] == (counts[0], counts[1])
        evidence[match[1]] = per_thread if consistent else {EARLIER: counts}
    return evidence


def _line(source: str, per_thread: dict[str, list[Any]]) -> str:
    passed, total, last = _totals(per_thread)
    return f"- {source}: {passed}/{total} quoted excerpts verified (last {last})"


def _valid_threads(raw: object) -> dict[str, list[Any]]:
    if not isinstance(raw, dict):
        return {}
    valid = {}
    for thread_id, counts in raw.items():
        if isinstance(thread_id, str) and isinstance(counts, list) and len(counts) == 3:
            passed, total, last = counts
            if isinstance(passed, int) and isinstance(total, int) and _LAST.match(str(last)):
                valid[thread_id] = [passed, total, str(last)]
    return valid


def _totals(per_thread: dict[str, list[Any]]) -> tuple[int, int, str]:
    counts = per_thread.values()
    last = max((str(c[2]) for c in counts), default="")
    return sum(int(c[0]) for c in counts), sum(int(c[1]) for c in counts), last


def _source_memory(source: str, per_thread: dict[str, list[Any]]) -> SourceMemory:
    passed, total, last = _totals(per_thread)
    named = sorted((t for t in per_thread if t != EARLIER), key=lambda t: per_thread[t][2])
    return SourceMemory(
        source, passed, total, last, tuple(reversed(named)), earlier=EARLIER in per_thread
    )


def _fresh(evidence: Evidence, today: date) -> Evidence:
    """Sources not cited for longer than DECAY are dropped: old evidence stops guiding."""
    return {
        source: per_thread
        for source, per_thread in evidence.items()
        if today - date.fromisoformat(_totals(per_thread)[2]) <= DECAY
    }


def _add(
    evidence: Evidence,
    result: CheckedReport,
    fetched: list[FetchedPage],
    *,
    thread_id: str,
    forgotten: dict[str, str],
) -> None:
    today = datetime.now(UTC).date().isoformat()
    read = fetched_sources(fetched)
    for citation in result.citations:
        source = source_of(citation.url)
        if source not in read:
            log.info("research memory skips a citation of a source this thread never fetched")
            continue
        if source in forgotten and _read_before(source, forgotten[source], fetched):
            log.info("research memory skips a deleted source's pages read before the delete")
            continue
        _merge(evidence.setdefault(source, {}), thread_id, [int(citation.passed), 1, today])


def _read_before(source: str, deleted_at: str, fetched: list[FetchedPage]) -> bool:
    """Whether the thread read a page of `source` before the user deleted its rating (a time
    that cannot be read counts as before: forgetting wins)."""
    cutoff = _when(deleted_at)
    for record in fetched:
        if record.ok and source in {source_of(record.url), source_of(record.final_url)}:
            at = _when(record.fetched_at)
            if cutoff is None or at is None or at <= cutoff:
                return True
    return False


def _when(iso: str) -> datetime | None:
    try:
        at = datetime.fromisoformat(iso)
    except (TypeError, ValueError):
        return None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _merge(per_thread: dict[str, list[Any]], thread_id: str, counts: list[Any]) -> None:
    passed, total, last = per_thread.get(thread_id, [0, 0, ""])
    per_thread[thread_id] = [passed + counts[0], total + counts[1], max(str(last), counts[2])]


def _capped(per_thread: dict[str, list[Any]]) -> dict[str, list[Any]]:
    named = sorted((t for t in per_thread if t != EARLIER), key=lambda t: per_thread[t][2])
    kept = dict(per_thread)
    for thread_id in named[: max(0, len(named) - MAX_THREADS_PER_SOURCE)]:
        _merge(kept, EARLIER, kept.pop(thread_id))
    return kept


def fetched_sources(records: Iterable[FetchedPage]) -> set[str]:
    """The sources the thread really read a page from (requested and final address)."""
    return {source_of(url) for r in records if r.ok for url in (r.url, r.final_url)}


def source_of(url: str) -> str:
    """The source a rating is about: the host of a web page, the corpus name of a local document."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    return f"{parts.scheme}://{host}" if parts.scheme == "corpus" else host or url[:80]
