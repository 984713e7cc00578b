"""The fetch log: every fetch the fetch tool made, per thread, written by the tool and never by a model."""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from graphs.core.fence import fenced
from graphs.core.text import without_controls

if TYPE_CHECKING:
    from graphs.core.pool import Pool

_DEFAULT_PORTS = {"http": 80, "https": 443}


def normalise_url(url: str) -> str:
    """One spelling per address: lower-case scheme and host, no default port, no fragment."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if parts.port is not None and parts.port != _DEFAULT_PORTS.get(scheme):
        host = f"{host}:{parts.port}"
    path = parts.path or "/"
    return urlunsplit((scheme, host, path, parts.query, ""))


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class FetchRecord:
    """One fetch as the tool saw it. `content` is the stored text snapshot citations are checked against."""

    id: int
    thread_id: str
    url: str
    final_url: str
    fetched_at: str
    status: int
    content_hash: str
    title: str
    content: str
    error: str | None = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300 and bool(self.content)


def new_record(
    *,
    thread_id: str,
    url: str,
    final_url: str,
    status: int,
    title: str,
    content: str,
    error: str | None = None,
) -> FetchRecord:
    """A fetch to log. Control characters become spaces first: a NUL in a URL the model wrote
    or in a page's text would fail the log's write, and with it the whole research run."""
    content = without_controls(content)
    return FetchRecord(
        id=0,
        thread_id=thread_id,
        url=normalise_url(without_controls(url)),
        final_url=normalise_url(without_controls(final_url)),
        fetched_at=datetime.now(UTC).isoformat(timespec="seconds"),
        status=status,
        content_hash=content_hash(content),
        title=without_controls(title),
        content=content,
        error=without_controls(error) if error is not None else None,
    )


class FetchLog(Protocol):
    async def record(self, record: FetchRecord) -> FetchRecord:
        """Store a fetch; returns it with its id."""
        ...

    async def for_thread(self, thread_id: str) -> list[FetchRecord]:
        """Every fetch of one thread, oldest first."""
        ...


class PostgresFetchLog:
    """The fetch log in the app's Postgres (migration 0007_research_fetch_log)."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def record(self, record: FetchRecord) -> FetchRecord:
        # Fenced: a page fetched for a run whose user was wiped meanwhile is not logged.
        async with fenced(self._pool) as conn:
            cur = await conn.execute(
                "INSERT INTO research_fetch_log (thread_id, url, final_url, status, content_hash,"
                " title, content, error) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
                " RETURNING id, fetched_at",
                (
                    record.thread_id,
                    record.url,
                    record.final_url,
                    record.status,
                    record.content_hash,
                    record.title,
                    record.content,
                    record.error,
                ),
            )
            row = await cur.fetchone()
        assert row is not None
        return replace(record, id=int(row["id"]), fetched_at=_iso(row["fetched_at"]))

    async def for_thread(self, thread_id: str) -> list[FetchRecord]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT * FROM research_fetch_log WHERE thread_id = %s ORDER BY id", (thread_id,)
            )
            rows = await cur.fetchall()
        return [_from_row(row) for row in rows]


class MemoryFetchLog:
    """The same log in memory, for runs without Postgres (Studio, unit tests)."""

    def __init__(self) -> None:
        self._records: list[FetchRecord] = []
        self._ids = itertools.count(1)

    async def record(self, record: FetchRecord) -> FetchRecord:
        stored = replace(record, id=next(self._ids))
        self._records.append(stored)
        return stored

    async def for_thread(self, thread_id: str) -> list[FetchRecord]:
        return [r for r in self._records if r.thread_id == thread_id]


def fetch_log_for_store(store: Any) -> FetchLog:
    """The Postgres log when the graph runs on the app's Postgres store, else an in-memory one."""
    pool = getattr(store, "conn", None)
    if pool is not None and hasattr(pool, "connection"):
        return PostgresFetchLog(pool)
    return MemoryFetchLog()


def _iso(value: Any) -> str:
    return value.isoformat(timespec="seconds") if hasattr(value, "isoformat") else str(value)


def _from_row(row: dict[str, Any]) -> FetchRecord:
    return FetchRecord(
        id=int(row["id"]),
        thread_id=row["thread_id"],
        url=row["url"],
        final_url=row["final_url"],
        fetched_at=_iso(row["fetched_at"]),
        status=int(row["status"]),
        content_hash=row["content_hash"],
        title=row["title"],
        content=row["content"],
        error=row["error"],
    )
