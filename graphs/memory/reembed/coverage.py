"""What the new index still lacks: read by the backfill's passes and by the ready check."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from graphs.core.embeddings import DEFAULT_TABLE
from graphs.memory.policy import Tombstone, is_tombstoned
from graphs.memory.scoped import MEMORY_KINDS, ROOT, TOMBSTONES

if TYPE_CHECKING:
    from graphs.core.pool import Pool

_MEMORY_PREFIX = re.compile(rf"^{ROOT}\.([^.]+)\.({'|'.join(MEMORY_KINDS)})$")
_PAGE = 500

IN_OLD_INDEX = (
    f"EXISTS (SELECT 1 FROM {DEFAULT_TABLE} v WHERE v.prefix = s.prefix AND v.key = s.key)"  # noqa: S608 (constants only)
)
# Items whose new vector is missing or older than the item: written by a worker that did not
# write both indexes yet (or whose second write failed).
STALE_BATCH = (
    "SELECT s.prefix, s.key, s.value, s.updated_at FROM store s"  # noqa: S608 (constants only)
    f" WHERE {IN_OLD_INDEX} AND (%(after_prefix)s::text IS NULL"
    " OR (s.prefix, s.key) > (%(after_prefix)s, %(after_key)s))"
    " AND NOT EXISTS (SELECT 1 FROM {table} n WHERE n.prefix = s.prefix AND n.key = s.key"
    " AND n.updated_at >= s.updated_at)"
    " ORDER BY s.prefix, s.key LIMIT %(limit)s"
)


async def uncovered(pool: Pool, table: str) -> list[tuple[str, str]]:
    """(prefix, key) of the live items of the current index without a current vector in the
    new one (`table`): what a catch-up pass would still redo. Forgotten facts are never
    carried over, so they are not missing."""
    select = STALE_BATCH.replace("{table}", table)
    missing: list[tuple[str, str]] = []
    after: tuple[str, str] | None = None
    while rows := await select_after(pool, select, after, _PAGE):
        forgotten = await forget_records(pool, rows)
        missing += [(r["prefix"], r["key"]) for r in rows if not is_forgotten(r, forgotten)]
        after = (rows[-1]["prefix"], rows[-1]["key"])
    return missing


async def select_after(
    pool: Pool, select: str, after: tuple[str, str] | None, limit: int
) -> list[dict[str, Any]]:
    """One page of a select in (prefix, key) order, after the given item (or from the first)."""
    params = {
        "after_prefix": after[0] if after else None,
        "after_key": after[1] if after else None,
        "limit": limit,
    }
    async with pool.connection() as conn:
        cur = await conn.execute(select, params)
        return [dict(r) for r in await cur.fetchall()]


async def forget_records(pool: Pool, rows: list[dict[str, Any]]) -> dict[str, list[Tombstone]]:
    """The forget records of every user whose memories are in the batch, by user label."""
    labels = {m[1] for r in rows if (m := _MEMORY_PREFIX.match(r["prefix"]))}
    if not labels:
        return {}
    prefixes = [f"{ROOT}.{label}.{TOMBSTONES}" for label in labels]
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT prefix, value FROM store WHERE prefix = ANY(%s)", (prefixes,)
        )
        found: dict[str, list[Tombstone]] = {label: [] for label in labels}
        for row in await cur.fetchall():
            label = row["prefix"].split(".")[1]
            value = row["value"]
            found[label].append(Tombstone(key=value.get("key"), fact=value.get("fact")))
    return found


def is_forgotten(row: dict[str, Any], forgotten: dict[str, list[Tombstone]]) -> bool:
    match = _MEMORY_PREFIX.match(row["prefix"])
    if match is None or not forgotten.get(match[1]):
        return False
    content = str(row["value"].get("content", ""))
    return is_tombstoned(key=row["key"], content=content, tombstones=forgotten[match[1]])
