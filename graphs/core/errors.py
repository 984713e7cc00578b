"""Refusals every layer raises or catches the same way."""

from __future__ import annotations

NOT_FOUND = "Conversation not found"


class ThreadNotFound(LookupError):
    """Unknown or someone else's thread: the same refusal, so existence is never revealed.

    Raised by the ownership checks (auth/ownership.py) and by the privacy workflows
    (graphs/memory/privacy.py), which sit below auth and so cannot import it from there."""

    def __init__(self) -> None:
        super().__init__(NOT_FOUND)


class DatabaseUnavailable(ConnectionError):
    """Postgres could not be reached in time (restarting, down, or the pool has no connection)."""


def is_database_outage(exc: BaseException) -> bool:
    """The error (or one it was raised from) says Postgres is away, not that a query is wrong.

    A lost or refused connection (psycopg.OperationalError, which also covers "the server
    closed the connection"), a pool that found no connection in time (PoolTimeout), or the
    app's own DatabaseUnavailable. Libraries wrap these (procrastinate, LangGraph), so the
    causes are followed too."""
    import psycopg
    from psycopg_pool import PoolTimeout

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DatabaseUnavailable | PoolTimeout | psycopg.OperationalError):
            return True
        current = current.__cause__ or current.__context__
    return False
