"""Research memories: evidence-based source reliability, written after the report passed the check.

Only this code writes `/memories/` for research, never a model and never a subagent: what it
records is counted from the deterministic citation check (how often a source's quotes held up),
not a model's opinion, so a hostile page cannot talk its way into being trusted. Entries are
timestamped and decay; they guide which sources to try first and never replace verification.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

from graphs.memory.policy import detect_secret, looks_like_instruction
from graphs.memory.scoped import MissingIdentity, user_label

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from langgraph.store.base import BaseStore

log = logging.getLogger("cairn.research")

SOURCES_KEY = "/source_reliability.md"
"""Read by the orchestrator as /memories/source_reliability.md (the CompositeBackend route)."""
MAX_SOURCES = 20
DECAY = timedelta(days=180)
_LINE = re.compile(r"^- (\S+): (\d+)/(\d+) quoted excerpts verified \(last (\d{4}-\d{2}-\d{2})\)$")
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


class ResearchMemory:
    """Store access for one user's research learnings; the namespace comes from identity only."""

    def __init__(self, store: BaseStore, user_id: str) -> None:
        self.namespace = memory_namespace_for(user_id)
        self._store = store

    async def source_stats(self) -> dict[str, tuple[int, int, str]]:
        item = await self._store.aget(self.namespace, SOURCES_KEY)
        if item is None:
            return {}
        stats = {}
        for line in str(item.value.get("content", "")).splitlines():
            if match := _LINE.match(line):
                stats[match[1]] = (int(match[2]), int(match[3]), match[4])
        return stats

    async def record_check(
        self, result: CheckedReport, fetched: Iterable[FetchedPage]
    ) -> str | None:
        """Add this report's per-source pass counts; returns the file written (None if refused).

        `fetched` is the thread's fetch log. Only sources it holds a page from are counted: a
        citation to a source never fetched is a model's invention, and its domain never enters
        memory, not even as a failure (a rating is evidence about pages really read)."""
        today = datetime.now(UTC).date()
        stats = {
            source: counts
            for source, counts in (await self.source_stats()).items()
            if today - datetime.fromisoformat(counts[2]).date() <= DECAY
        }
        read = fetched_sources(fetched)
        for citation in result.citations:
            source = source_of(citation.url)
            if source not in read:
                log.info("research memory skips a citation of a source this thread never fetched")
                continue
            passed, total, _ = stats.get(source, (0, 0, ""))
            stats[source] = (passed + citation.passed, total + 1, today.isoformat())
        if not stats:
            return None
        ranked = sorted(stats.items(), key=lambda kv: (-kv[1][1], kv[0]))[:MAX_SOURCES]
        content = "\n".join(
            f"- {source}: {passed}/{total} quoted excerpts verified (last {last})"
            for source, (passed, total, last) in ranked
        )
        if (problem := memory_problem(content)) is not None:
            log.warning("research memory not written: %s", problem)
            return None
        now = datetime.now(UTC).isoformat()
        value = {"content": content, "encoding": "utf-8", "modified_at": now}
        old = await self._store.aget(self.namespace, SOURCES_KEY)
        value["created_at"] = str(old.value.get("created_at", now)) if old else now
        await self._store.aput(self.namespace, SOURCES_KEY, value)
        return content


def fetched_sources(records: Iterable[FetchedPage]) -> set[str]:
    """The sources the thread really read a page from (requested and final address)."""
    return {source_of(url) for r in records if r.ok for url in (r.url, r.final_url)}


def source_of(url: str) -> str:
    """The source a rating is about: the host of a web page, the corpus name of a local document."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    return f"{parts.scheme}://{host}" if parts.scheme == "corpus" else host or url[:80]
