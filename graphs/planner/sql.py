"""Read-only analytics SQL: the one way to query the demo dataset, as the SELECT-only role.

The dataset and the role are made by migration 0100_analytics_demo (graphs/core/migrations.py).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from graphs.planner.schema import ANALYST_ROLE

if TYPE_CHECKING:
    from graphs.core.settings import Settings

log = logging.getLogger("cairn.planner.sql")


TRANSIENT_ATTEMPTS = 3
TRANSIENT_BACKOFF_S = 0.25
MAX_CELL_CHARS = 80


class SqlFailure(Exception):
    """A query the database refused or cut off; its text is the step's result, not a crash."""


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool
    """True when more rows existed than the row limit allowed."""


def analyst_url(app_url: str) -> str:
    """The app's database reached as the analyst role (no password: the embedded server
    trusts its Unix socket; anywhere else set CAIRN_ANALYTICS_DATABASE_URL)."""
    params = conninfo_to_dict(app_url)
    params.pop("password", None)
    params["user"] = ANALYST_ROLE
    return make_conninfo(**params)  # type: ignore[arg-type]


class AnalyticsDatabase:
    """Queries run as a SELECT-only role, one statement, read-only, time- and size-limited."""

    def __init__(
        self,
        url: str | None = None,
        *,
        settings: Settings | None = None,
        timeout_ms: int | None = None,
        max_rows: int | None = None,
        max_chars: int | None = None,
    ) -> None:
        from graphs.core.settings import get_settings

        self._settings = settings or get_settings()
        self._url = url
        self.timeout_ms = timeout_ms or self._settings.sql_timeout_ms
        self.max_rows = max_rows or self._settings.sql_max_rows
        self.max_chars = max_chars or self._settings.sql_max_chars

    async def url(self) -> str:
        if self._url is None:
            configured = self._settings.analytics_database_url
            if configured is not None:
                self._url = configured.get_secret_value()
            else:
                from graphs.core.persistence import database_url

                self._url = analyst_url(await database_url(self._settings))
        return self._url

    async def query(self, sql: str) -> QueryResult:
        """Run one SELECT through a server-side cursor; at most max_rows rows come back."""
        statement = sql.strip().rstrip(";").strip()
        if not statement:
            msg = "ERROR: empty query"
            raise SqlFailure(msg)

        async def run(conn: psycopg.AsyncConnection[Any]) -> QueryResult:
            # DECLARE only accepts a single SELECT/VALUES: writes and a second statement
            # are syntax errors before anything runs, on top of the role's missing grants.
            async with conn.cursor(name="cairn_query") as cur:
                await cur.execute(statement)
                rows = await cur.fetchmany(self.max_rows + 1)
                columns = [c.name for c in cur.description or []]
            return QueryResult(columns, rows[: self.max_rows], len(rows) > self.max_rows)

        return await self._run(run)

    async def list_tables(self) -> list[tuple[str, str, str]]:
        """(schema, table, description) for every table the role may SELECT from."""

        async def run(conn: psycopg.AsyncConnection[Any]) -> list[tuple[str, str, str]]:
            cur = await conn.execute(
                "SELECT table_schema, table_name,"
                " coalesce(obj_description(format('%I.%I', table_schema, table_name)::regclass,"
                " 'pg_class'), '') FROM information_schema.tables"
                " WHERE table_schema NOT IN ('pg_catalog', 'information_schema')"
                " AND has_table_privilege(format('%I.%I', table_schema, table_name), 'SELECT')"
                " ORDER BY 1, 2"
            )
            return [(str(r[0]), str(r[1]), str(r[2])) for r in await cur.fetchall()]

        return await self._run(run)

    async def describe_table(self, name: str) -> list[tuple[str, str, bool]]:
        """(column, type, nullable) of one readable table, `table` or `schema.table`."""
        schema, _, table = name.strip().rpartition(".")

        async def run(conn: psycopg.AsyncConnection[Any]) -> list[tuple[str, str, bool]]:
            cur = await conn.execute(
                "SELECT column_name, data_type, is_nullable = 'YES'"
                " FROM information_schema.columns"
                # information_schema only lists columns this role may read.
                " WHERE table_name = %s AND (%s = '' OR table_schema = %s)"
                " ORDER BY table_schema, ordinal_position",
                (table, schema, schema),
            )
            return [(str(r[0]), str(r[1]), bool(r[2])) for r in await cur.fetchall()]

        columns = await self._run(run)
        if not columns:
            msg = f"ERROR: no readable table named {name!r}; call list_tables to see them"
            raise SqlFailure(msg)
        return columns

    async def _run(self, work: Any) -> Any:
        """Retry transient failures (connection trouble) with backoff; refused queries are not
        transient and come back as SqlFailure at once."""
        for attempt in range(1, TRANSIENT_ATTEMPTS + 1):
            try:
                async with self._read_only() as conn:
                    return await asyncio.wait_for(work(conn), self.timeout_ms / 1000 + 5)
            except pg_errors.QueryCanceled as exc:
                msg = (
                    f"ERROR: the query was cancelled after {self.timeout_ms} ms "
                    f"(statement timeout); make it narrower or aggregate more ({exc})"
                )
                raise SqlFailure(msg) from None
            except (psycopg.OperationalError, TimeoutError) as exc:
                if not _transient(exc):
                    msg = f"ERROR: {exc}"
                    raise SqlFailure(msg) from None
                if attempt == TRANSIENT_ATTEMPTS:
                    msg = f"ERROR: the analytics database is unavailable ({exc})"
                    raise SqlFailure(msg) from None
                log.warning("analytics query attempt %d failed: %s", attempt, exc)
                await asyncio.sleep(TRANSIENT_BACKOFF_S * 2 ** (attempt - 1))
            except psycopg.Error as exc:
                msg = f"ERROR: {exc.diag.message_primary or exc}"
                raise SqlFailure(msg) from None
        raise AssertionError("unreachable")  # pragma: no cover

    @asynccontextmanager
    async def _read_only(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A fresh connection per call, inside a READ ONLY transaction that is rolled back:
        a set_config() smuggled into a SELECT dies with the transaction and the connection."""
        conn = await psycopg.AsyncConnection.connect(await self.url(), connect_timeout=10)
        try:
            await conn.set_read_only(True)
            async with conn.transaction(force_rollback=True):
                cur = await conn.execute(
                    "SELECT set_config('statement_timeout', %s, true),"
                    " set_config('idle_in_transaction_session_timeout', '30s', true),"
                    " (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)",
                    (f"{self.timeout_ms}ms",),
                )
                row = await cur.fetchone()
                if row is None or row[2]:
                    msg = "ERROR: refusing to query as a superuser; configure a SELECT-only role"
                    raise SqlFailure(msg)
                yield conn
        finally:
            await conn.close()


def _transient(exc: Exception) -> bool:
    """Connection trouble and server restarts are worth a retry; resource limits are not."""
    if isinstance(exc, TimeoutError):
        return True
    state = getattr(exc, "sqlstate", None)
    return state is None or state.startswith(("08", "57P")) or state == "53300"


def format_result(result: QueryResult, *, max_chars: int) -> str:
    """A Markdown table (the UI renders and charts it), cut to max_chars with a note."""
    if not result.rows:
        return f"The query returned 0 rows (columns: {', '.join(result.columns)})."
    head = [_row(result.columns), _row(["---"] * len(result.columns))]
    note = f"{len(result.rows)} rows" + (
        f" (cut off at the {len(result.rows)}-row limit; more rows exist)"
        if result.truncated
        else ""
    )
    lines = [*head]
    used = sum(len(line) + 1 for line in head) + len(note) + 80
    shown = 0
    for row in result.rows:
        line = _row([_cell(v) for v in row])
        if used + len(line) + 1 > max_chars:
            break
        lines.append(line)
        used += len(line) + 1
        shown += 1
    if shown < len(result.rows):
        note += f"; only the first {shown} shown (output size limit)"
    return f"Query returned {note}.\n\n" + "\n".join(lines)


def _row(values: Sequence[str]) -> str:
    return "| " + " | ".join(values) + " |"


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, Decimal):
        value = value.normalize() if value == value.to_integral() else round(value, 4)
        text = f"{value:f}"
    elif isinstance(value, float):
        text = f"{value:.4g}"
    else:
        text = str(value)
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= MAX_CELL_CHARS else text[: MAX_CELL_CHARS - 1] + "…"


_TABLE = re.compile(r"(?:^\|.*\|[ \t]*$\n?){3,}", re.M)


@dataclass(frozen=True)
class Table:
    columns: list[str]
    rows: list[list[str]]

    def numeric_by_category(self) -> tuple[str, str, list[str], list[float]] | None:
        """(category column, value column, labels, values) when the table is one number per
        category: a text first column and a numeric column, 2 to 50 rows."""
        if not 2 <= len(self.rows) <= 50 or len(self.columns) < 2:
            return None
        labels = [r[0] for r in self.rows]
        if all(_number(label) is not None for label in labels):
            return None
        for i in range(1, len(self.columns)):
            values = [_number(r[i]) if i < len(r) else None for r in self.rows]
            if all(v is not None for v in values):
                return self.columns[0], self.columns[i], labels, [float(v or 0) for v in values]
        return None


def markdown_tables(text: str) -> list[Table]:
    """The Markdown tables in a text (as format_result writes them)."""
    tables = []
    for block in _TABLE.findall(text):
        lines = [line.strip() for line in block.strip().splitlines()]
        if not re.fullmatch(r"\|(\s*:?-{3,}:?\s*\|)+", lines[1]):
            continue
        split = [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines]
        tables.append(Table(columns=split[0], rows=split[2:]))
    return tables


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None
