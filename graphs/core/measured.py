"""A deployment's own figures read from its Postgres: runs, table sizes, store items, writes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from psycopg import sql

from graphs.core.capacity import METRICS, AgentFigures, Pilot, Spread

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg.rows import DictRow

    from graphs.core.pool import Pool

WINDOW = 20_000
"""Most recent finished runs per agent whose distributions are measured."""
RAN = ("done", "paused", "stopped", "failed", "cancelled")
"""Statuses of runs that ran (a refused or not-found run wrote next to nothing)."""
FINISHED = ("done", "paused")
THREAD_TABLES = {
    "checkpoints": "thread_id",
    "checkpoint_blobs": "thread_id",
    "checkpoint_writes": "thread_id",
    "research_fetch_log": "thread_id",
    "cairn_message_checkpoints": "thread_id",
    "cairn_threads": "thread_id",
    "Thread": "id",
    "Step": "threadId",
    "Element": "threadId",
    "cairn_runs": "thread_id",
}
"""Tables whose rows belong to one conversation and go with it (retention, delete)."""
RUN_TABLES = ("cairn_usage", "procrastinate_jobs", "procrastinate_events")
"""Tables that grow by run and outlive the conversation."""
NODE_METRICS = {"steps": "execute_step", "replans": "replan", "critique_rounds": "reopen_claims"}
"""Node runs that count a Planner step, a replan, a Research critique round."""
INNER_NODE = "act"
"""The Planner executor's model node: one model call per run of it."""
STORE_KIND = sql.SQL(
    "CASE WHEN s.prefix LIKE 'memories.%%' THEN 'assistant'"
    " WHEN split_part(s.prefix, '.', 2) = 'plans' THEN 'planner'"
    " WHEN split_part(s.prefix, '.', 2) = 'research' THEN 'research'"
    " WHEN s.prefix LIKE 'research\\_corpus.%%' THEN 'shared' ELSE 'other' END"
)
"""Whose a store item is, by its namespace: an agent's per-user items, the shared corpus index."""
_AGES = sql.SQL(
    "SELECT t.thread_id, t.agent,"
    " coalesce(u.last, t.created_at) < now() - make_interval(secs => %(age)s) AS old"
    " FROM cairn_threads t LEFT JOIN (SELECT thread_id, max(created_at) AS last"
    " FROM cairn_usage GROUP BY thread_id) u ON u.thread_id = t.thread_id"
)
"""Each thread's agent and whether it has been idle past the pruning age (its last run, or its
creation)."""
_OLD_THREADS = sql.SQL("SELECT agent, count(*) AS n FROM ({}) a WHERE old GROUP BY agent").format(
    _AGES
)
_RUNS = (
    "SELECT agent, count(*) AS runs, count(DISTINCT user_id) AS users FROM cairn_usage"
    " WHERE status = ANY(%(ran)s) GROUP BY agent"
)
_FINISHED = (
    "SELECT model_calls, input_tokens, output_tokens, tool_calls, subagents, wall_s, nodes,"
    " roles, cost FROM cairn_usage WHERE agent = %(agent)s AND status = ANY(%(finished)s)"
    " ORDER BY created_at DESC LIMIT %(window)s"
)


async def measure(pool: Pool, *, prune_after_hours: float = 168.0) -> Pilot:
    """Read the pilot's figures. Read-only, but every row of the per-thread tables is read: run
    it on a replica of a large deployment. Threads idle longer than `prune_after_hours` are
    measured apart (the pruning job has shrunk them)."""
    async with pool.connection() as conn:
        sizes = await _table_sizes(conn)
        threads = await _threads(conn)
        cur = await conn.execute(_RUNS, {"ran": list(RAN)})
        runs = {row["agent"]: row for row in await cur.fetchall()}
        age = {"age": prune_after_hours * 3600}
        thread_bytes, thread_rows, old_bytes = await _thread_bytes(conn, sizes, age)
        cur = await conn.execute(_OLD_THREADS, age)
        old_threads = {row["agent"]: int(row["n"]) for row in await cur.fetchall()}
        store_sizes = await _store(conn, sizes)
        agents = {}
        for agent in sorted(set(threads) | set(runs)):
            cur = await conn.execute(
                _FINISHED, {"agent": agent, "finished": list(FINISHED), "window": WINDOW}
            )
            agents[agent] = figures(
                agent,
                await cur.fetchall(),
                runs=int(runs[agent]["runs"]) if agent in runs else 0,
                threads=threads.get(agent, 0),
                users=int(runs[agent]["users"]) if agent in runs else 0,
                thread_bytes=thread_bytes.get(agent, {}),
                thread_rows=thread_rows.get(agent, {}),
                old=(old_threads.get(agent, 0), old_bytes.get(agent, 0)),
                store=store_sizes.get(agent, (0, 0)),
            )
        run_bytes = sum([await _grown(conn, sizes, table) for table in RUN_TABLES])
        totals = await _totals(conn)
        vectors = await _vectors(conn)
    growing = run_bytes + sum(sum(b.values()) for b in thread_bytes.values())
    growing += sum(bytes_ for kind, (bytes_, _) in store_sizes.items() if kind != "shared")
    return Pilot(
        agents=agents,
        users=int(totals["users"]),
        total_runs=int(totals["runs"]),
        fixed_bytes=sum(size for size, _ in sizes.values()) - growing,
        run_bytes=run_bytes,
        other_store_bytes=store_sizes.get("other", (0, 0))[0],
        row_writes=int(totals["row_writes"]),
        transactions=int(totals["transactions"]),
        max_connections=int(totals["max_connections"]),
        embedding_dims=vectors["dims"],
        value_bytes=float(vectors["value_bytes"] or 0.0),
        vector_bytes=float(vectors["vector_bytes"] or 0.0),
    )


Sizes = Mapping[str, tuple[int, int]]
"""Per table: bytes with indexes and TOAST, and the first pages of those (see _table_sizes)."""


def grown(sizes: Sizes, table: str, row_bytes: int) -> int:
    """The part of a table's size that grows with its rows: its size beyond its first pages, but
    at least its rows' bytes (a table of a few rows fills part of those pages)."""
    size, first = sizes.get(table, (0, 0))
    return min(size, max(size - first, row_bytes))


def figures(
    agent: str,
    rows: Iterable[Mapping[str, Any]],
    *,
    runs: int,
    threads: int,
    users: int,
    thread_bytes: Mapping[str, int],
    thread_rows: Mapping[str, int] | None = None,
    old: tuple[int, int] = (0, 0),
    store: tuple[int, int] = (0, 0),
) -> AgentFigures:
    """One agent's figures from its finished runs' usage rows."""
    values: dict[str, list[float]] = defaultdict(list)
    roles: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    priced, unpriced_cost = 0, 0.0
    for row in rows:
        _collect(row, values)
        if row.get("roles"):
            priced += 1
            for role, (tin, tout) in row["roles"].items():
                roles[role][0] += int(tin)
                roles[role][1] += int(tout)
        else:
            unpriced_cost += float(row.get("cost") or 0.0)
    spreads = {m: s for m in METRICS if (s := Spread.of(values[m])) is not None}
    return AgentFigures(
        agent=agent,
        runs=runs,
        threads=threads,
        users=users,
        spreads=spreads,
        per_step_calls=Spread.of(values["per_step_calls"]),
        per_subagent_tool_calls=Spread.of(values["per_subagent_tool_calls"]),
        per_subagent_tokens=Spread.of(values["per_subagent_tokens"]),
        role_tokens={role: (pair[0], pair[1]) for role, pair in roles.items()},
        priced_runs=priced,
        unpriced_cost=unpriced_cost,
        thread_bytes=thread_bytes,
        thread_rows=thread_rows or {},
        old_threads=old[0],
        old_bytes=old[1],
        store_bytes=store[0],
        store_items=store[1],
    )


def _collect(row: Mapping[str, Any], values: dict[str, list[float]]) -> None:
    nodes = row.get("nodes") or {}
    for metric in ("model_calls", "input_tokens", "output_tokens", "tool_calls", "subagents"):
        values[metric].append(float(row[metric]))
    if row.get("wall_s") is not None:
        values["wall_s"].append(float(row["wall_s"]))
    for metric, node in NODE_METRICS.items():
        values[metric].append(float(nodes.get(node, 0)))
    steps = int(nodes.get(NODE_METRICS["steps"], 0))
    if steps:
        values["per_step_calls"].append(int(nodes.get(INNER_NODE, 0)) / steps)
    subagents = int(row["subagents"])
    if subagents:
        own_tools = int(row["tool_calls"]) - subagents
        values["per_subagent_tool_calls"].append(max(0, own_tools) / subagents)
        tokens = int(row["input_tokens"]) + int(row["output_tokens"])
        values["per_subagent_tokens"].append(tokens / subagents)


async def _table_sizes(conn: AsyncConnection[DictRow]) -> dict[str, tuple[int, int]]:
    """Every table of this database outside the catalogs: its bytes with indexes and TOAST, and
    what its first pages take (the heap's, two per index, the TOAST index's), which a table
    holding a row or two already fills."""
    cur = await conn.execute(
        "SELECT c.relname AS name, pg_total_relation_size(c.oid) AS bytes,"
        " 8192 * (1 + 2 * (SELECT count(*) FROM pg_index i WHERE i.indrelid = c.oid)"
        " + CASE WHEN c.reltoastrelid <> 0 THEN 1 ELSE 0 END) AS first_pages"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
        " AND n.nspname NOT LIKE 'pg_toast%%'"
    )
    sizes: dict[str, tuple[int, int]] = {}
    for row in await cur.fetchall():
        size, first = sizes.get(row["name"], (0, 0))
        sizes[row["name"]] = (size + int(row["bytes"]), first + int(row["first_pages"]))
    return sizes


async def _grown(conn: AsyncConnection[DictRow], sizes: Sizes, table: str) -> int:
    if table not in sizes:
        return 0
    query = sql.SQL("SELECT coalesce(sum(pg_column_size(x.*)), 0)::bigint AS bytes FROM {} x")
    cur = await conn.execute(query.format(sql.Identifier(table)))
    row = await cur.fetchone()
    return grown(sizes, table, int(row["bytes"]) if row is not None else 0)


async def _threads(conn: AsyncConnection[DictRow]) -> dict[str, int]:
    cur = await conn.execute("SELECT agent, count(*) AS n FROM cairn_threads GROUP BY agent")
    return {row["agent"]: int(row["n"]) for row in await cur.fetchall()}


async def _thread_bytes(
    conn: AsyncConnection[DictRow], sizes: Sizes, age: Mapping[str, float]
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]], dict[str, int]]:
    """Per agent and table, the table's size split by its rows' bytes, and the rows: rows of a
    thread no one owns any more (none, unless a delete was cut short) stay unattributed."""
    found: dict[str, dict[str, int]] = defaultdict(dict)
    counted: dict[str, dict[str, int]] = defaultdict(dict)
    old: dict[str, int] = defaultdict(int)
    for table, column in THREAD_TABLES.items():
        if table not in sizes:
            continue
        query = sql.SQL(
            "SELECT t.agent, sum(pg_column_size(x.*))::bigint AS bytes, count(*) AS n,"
            " coalesce(sum(pg_column_size(x.*)) FILTER (WHERE t.old), 0)::bigint AS old_bytes"
            " FROM {table} x LEFT JOIN ({ages}) t ON t.thread_id = x.{column}"
            " GROUP BY t.agent"
        ).format(table=sql.Identifier(table), column=sql.Identifier(column), ages=_AGES)
        cur = await conn.execute(query, age)
        rows = {row["agent"]: row for row in await cur.fetchall()}
        whole = sum(int(row["bytes"] or 0) for row in rows.values())
        size = grown(sizes, table, whole)
        for agent, row in rows.items():
            if agent is not None and whole:
                found[agent][table] = round(size * int(row["bytes"] or 0) / whole)
                counted[agent][table] = int(row["n"])
                old[agent] += round(size * int(row["old_bytes"]) / whole)
    return dict(found), dict(counted), dict(old)


async def _store(conn: AsyncConnection[DictRow], sizes: Sizes) -> dict[str, tuple[int, int]]:
    """Per kind of namespace: the store tables' growing size split by rows' bytes, and the item
    count."""
    query = sql.SQL(
        "SELECT {kind} AS kind, count(*) AS items, sum(pg_column_size(s.*))::bigint AS item_bytes,"
        " coalesce(sum(v.bytes), 0)::bigint AS vector_bytes FROM store s LEFT JOIN ("
        " SELECT prefix, key, sum(pg_column_size(sv.*)) AS bytes FROM store_vectors sv"
        " GROUP BY prefix, key) v ON v.prefix = s.prefix AND v.key = s.key GROUP BY 1"
    ).format(kind=STORE_KIND)
    cur = await conn.execute(query)
    rows = await cur.fetchall()
    items_whole = sum(int(r["item_bytes"] or 0) for r in rows)
    vectors_whole = sum(int(r["vector_bytes"] or 0) for r in rows)
    items_size = grown(sizes, "store", items_whole)
    vectors_size = grown(sizes, "store_vectors", vectors_whole)
    found = {}
    for row in rows:
        share = items_size * int(row["item_bytes"] or 0) / (items_whole or 1)
        share += vectors_size * int(row["vector_bytes"]) / (vectors_whole or 1)
        found[row["kind"]] = (round(share), int(row["items"]))
    return found


async def _totals(conn: AsyncConnection[DictRow]) -> dict[str, Any]:
    cur = await conn.execute(
        "SELECT (SELECT count(*) FROM cairn_usage) AS runs,"
        " (SELECT count(DISTINCT user_id) FROM cairn_usage) AS users,"
        " (SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables"
        "  WHERE schemaname NOT IN ('analytics_demo')) AS row_writes,"
        " (SELECT xact_commit + xact_rollback FROM pg_stat_database"
        "  WHERE datname = current_database()) AS transactions,"
        " current_setting('max_connections')::int AS max_connections"
    )
    row = await cur.fetchone()
    assert row is not None
    return dict(row)


async def _vectors(conn: AsyncConnection[DictRow]) -> dict[str, Any]:
    cur = await conn.execute(
        "SELECT (SELECT vector_dims(embedding) FROM store_vectors LIMIT 1) AS dims,"
        " (SELECT avg(pg_column_size(embedding)) FROM store_vectors) AS vector_bytes,"
        " (SELECT avg(pg_column_size(s.*)) FROM store s) AS value_bytes"
    )
    row = await cur.fetchone()
    assert row is not None
    return dict(row)
