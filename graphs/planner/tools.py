"""The executor's SQL tools (read-only by the database role). Nothing here writes or sends anything."""

from __future__ import annotations

from typing import TYPE_CHECKING

from langchain_core.tools import BaseTool, tool

from graphs.planner.sql import SqlFailure, format_result

if TYPE_CHECKING:
    from graphs.planner.sql import AnalyticsDatabase


def untrusted(source: str, text: str) -> str:
    """Tool output as data: delimited, so the prompt can say it never carries instructions."""
    body = text.replace("</tool_output>", "</tool_output >")
    return f'<tool_output source="{source}" trust="untrusted-data">\n{body}\n</tool_output>'


def make_tools(db: AnalyticsDatabase) -> list[BaseTool]:
    """The SQL tools bound to one analytics database (its role decides what they can see)."""

    @tool
    async def list_tables() -> str:
        """List the tables you can query, with a one-line description of each."""
        try:
            tables = await db.list_tables()
        except SqlFailure as exc:
            return untrusted("list_tables", str(exc))
        lines = [f"- {schema}.{name}: {about}".rstrip(": ") for schema, name, about in tables]
        return untrusted("list_tables", "\n".join(lines) or "No readable tables.")

    @tool
    async def describe_table(table: str) -> str:
        """Show the columns and types of one table, named `table` or `schema.table`."""
        try:
            columns = await db.describe_table(table)
        except SqlFailure as exc:
            return untrusted("describe_table", str(exc))
        lines = [f"- {name} {kind}{'' if null else ' not null'}" for name, kind, null in columns]
        return untrusted("describe_table", f"{table}:\n" + "\n".join(lines))

    @tool
    async def sql_query(query: str) -> str:
        """Run ONE read-only PostgreSQL SELECT and get the rows back as a Markdown table.

        Aggregate in SQL (GROUP BY, count, sum) rather than fetching raw rows: results are cut
        off at a row limit and queries are cancelled after a few seconds. Writes are refused.
        """
        try:
            result = await db.query(query)
        except SqlFailure as exc:
            return untrusted("sql_query", str(exc))
        return untrusted("sql_query", format_result(result, max_chars=db.max_chars))

    return [list_tables, describe_table, sql_query]
