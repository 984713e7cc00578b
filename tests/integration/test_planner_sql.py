"""The Planner's SQL tools against a real Postgres: the database itself refuses anything but reading."""

from __future__ import annotations

import time

import psycopg
import pytest

from graphs.planner.schema import ANALYTICS_DEMO_SQL, DEMO_SCHEMA
from graphs.planner.sql import (
    AnalyticsDatabase,
    SqlFailure,
    analyst_url,
    format_result,
    markdown_tables,
)
from graphs.planner.tools import make_tools

pytestmark = pytest.mark.integration

COUNTS = (
    "SELECT (SELECT count(*) FROM analytics_demo.customers),"
    " (SELECT count(*) FROM analytics_demo.churn_events),"
    " (SELECT sum(mrr) FROM analytics_demo.subscriptions)"
)


@pytest.fixture(scope="module")
async def demo(persistence, database_url):
    # The persistence fixture applied every migration, the demo dataset among them.
    return AnalyticsDatabase(analyst_url(database_url), timeout_ms=1000, max_rows=50)


def snapshot(database_url: str) -> tuple:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(COUNTS).fetchone()
        tables = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s",
            (DEMO_SCHEMA,),
        ).fetchone()
    assert row is not None
    assert tables is not None
    return (*row, tables[0])


async def test_demo_data_is_deterministic_and_realistic(demo, persistence, database_url):
    customers, churned, _mrr, tables = snapshot(database_url)
    assert (customers, tables) == (2400, 4)
    assert 300 < churned < 700
    # Running the migration's script again (a database that lost its record) changes nothing.
    async with persistence.pool.connection() as conn:
        await conn.execute(ANALYTICS_DEMO_SQL, prepare=False)
    assert snapshot(database_url)[:3] == (customers, churned, _mrr)

    result = await demo.query(
        "SELECT region, count(*) AS churned FROM churn_events WHERE quarter = '2026-Q3' "
        "GROUP BY region ORDER BY churned DESC"
    )
    assert result.columns == ["region", "churned"]
    assert {r[0] for r in result.rows} == {"North America", "EMEA", "APAC", "LATAM"}
    table = markdown_tables(format_result(result, max_chars=5000))[0]
    assert table.numeric_by_category() is not None


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM analytics_demo.churn_events",
        "UPDATE analytics_demo.subscriptions SET mrr = 0",
        "DROP TABLE analytics_demo.customers",
        "SELECT 1; DELETE FROM analytics_demo.churn_events",
        "WITH gone AS (DELETE FROM analytics_demo.churn_events RETURNING 1) SELECT count(*) FROM gone",
        "INSERT INTO analytics_demo.customers VALUES (99999, 'x', 'EMEA', 'SMB', now())",
        "SELECT * FROM checkpoints",
        "SELECT set_config('default_transaction_read_only', 'off', false); "
        "DELETE FROM analytics_demo.customers",
    ],
)
async def test_writes_ddl_and_other_schemas_are_refused(demo, database_url, sql):
    before = snapshot(database_url)
    with pytest.raises(SqlFailure, match=r"^ERROR: "):
        await demo.query(sql)
    assert snapshot(database_url) == before


async def test_the_role_itself_cannot_write_even_outside_the_tool(demo, database_url):
    """The guarantee sits in the database: a raw connection as the role cannot write either."""
    with psycopg.connect(analyst_url(database_url), autocommit=True) as conn:
        conn.execute("SET default_transaction_read_only = off")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM analytics_demo.churn_events")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE analytics_demo.evil (x int)")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM public.cairn_threads")


async def test_pg_sleep_is_cut_off_by_the_statement_timeout(demo):
    started = time.monotonic()
    with pytest.raises(SqlFailure, match="statement timeout"):
        await demo.query("SELECT pg_sleep(60)")
    assert time.monotonic() - started < 10


async def test_a_query_cannot_switch_its_own_timeout_off(demo):
    with pytest.raises(SqlFailure, match="statement timeout"):
        await demo.query("SELECT set_config('statement_timeout', '0', false), pg_sleep(60)")
    # Nor for the next query: each call has a fresh connection and a rolled-back transaction.
    with pytest.raises(SqlFailure, match="statement timeout"):
        await demo.query("SELECT pg_sleep(60)")


async def test_ten_million_rows_are_cut_off_at_the_row_limit(demo, database_url):
    before = snapshot(database_url)
    started = time.monotonic()
    # Materialised (a set-returning function in FROM): the role's temp_file_limit stops it.
    with pytest.raises(SqlFailure, match=r"temp_file_limit|statement timeout"):
        await demo.query("SELECT g, md5(g::text) FROM generate_series(1, 10000000) AS g")
    # Streamed: the server-side cursor hands over only the first rows.
    result = await demo.query("SELECT generate_series(1, 10000000) AS g, md5('x') AS h")
    assert len(result.rows) == 50
    assert result.truncated
    assert time.monotonic() - started < 10
    text = format_result(result, max_chars=1000)
    assert "cut off at the 50-row limit" in text
    assert len(text) <= 1000
    assert snapshot(database_url) == before


async def test_a_superuser_connection_is_refused(database_url):
    superuser = AnalyticsDatabase(database_url, timeout_ms=1000)
    with pytest.raises(SqlFailure, match="superuser"):
        await superuser.query("SELECT 1")


async def test_tools_return_errors_and_data_as_wrapped_text(demo):
    tools = {t.name: t for t in make_tools(demo)}
    listed = await tools["list_tables"].ainvoke({})
    assert "analytics_demo.churn_events" in listed
    assert "checkpoints" not in listed
    described = await tools["describe_table"].ainvoke({"table": "churn_events"})
    assert "lost_mrr" in described
    refused = await tools["sql_query"].ainvoke({"query": "DROP TABLE customers"})
    assert refused.startswith("<tool_output")
    assert "ERROR:" in refused
    empty = await tools["sql_query"].ainvoke({"query": "SELECT * FROM customers WHERE false"})
    assert "0 rows" in empty
