"""The checkpoint writes carry the wipe's check in the statement: the library's INSERTs rewritten."""

from __future__ import annotations

import pytest
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from graphs.core.fence import fenced_insert
from graphs.core.saver import CairnSaver

LIBRARY = (
    "UPSERT_CHECKPOINT_BLOBS_SQL",
    "UPSERT_CHECKPOINTS_SQL",
    "UPSERT_CHECKPOINT_WRITES_SQL",
    "INSERT_CHECKPOINT_WRITES_SQL",
)


@pytest.mark.parametrize("name", LIBRARY)
def test_every_checkpoint_write_reads_the_fence_and_takes_its_two_parameters_first(
    name: str,
) -> None:
    library, ours = getattr(AsyncPostgresSaver, name), getattr(CairnSaver, name)
    assert ours.startswith("WITH fence AS (SELECT cairn_fence(%s::text, %s::float8) AS ok) ")
    assert "FROM fence WHERE fence.ok" in ours
    assert "VALUES" not in ours
    assert ours.count("%s") == library.count("%s") + 2
    # What follows the values (the conflict rule) is the library's, unchanged.
    assert ours.endswith(library.partition(")")[2].partition(")")[2].strip())


def test_a_library_insert_of_another_shape_stops_the_import() -> None:
    with pytest.raises(RuntimeError, match="unexpected INSERT shape"):
        fenced_insert("INSERT INTO checkpoints SELECT * FROM elsewhere")


async def test_the_cursor_prepends_the_fence_to_fenced_statements_only_and_still_iterates() -> None:
    from graphs.core.saver import _FencingCursor

    class Recorder:
        def __init__(self) -> None:
            self.calls: list[tuple[str, object]] = []

        async def execute(self, query: str, params: object = None) -> None:
            self.calls.append((query, params))

        async def executemany(self, query: str, params_seq: object) -> None:
            self.calls.append((query, params_seq))

        def __aiter__(self) -> object:
            async def rows() -> object:
                yield {"checkpoint_id": "a"}

            return rows()

    fenced = CairnSaver.UPSERT_CHECKPOINTS_SQL
    inner = Recorder()
    cur = _FencingCursor(inner, CairnSaver._FENCED, ("user-1", 12.5))  # type: ignore[arg-type]
    await cur.execute(fenced, ("t", "", "c"))
    await cur.executemany(CairnSaver.UPSERT_CHECKPOINT_BLOBS_SQL, [("t", "x"), ("t", "y")])
    await cur.execute("SELECT 1", ("p",))
    assert inner.calls == [
        (fenced, ("user-1", 12.5, "t", "", "c")),
        (
            CairnSaver.UPSERT_CHECKPOINT_BLOBS_SQL,
            [("user-1", 12.5, "t", "x"), ("user-1", 12.5, "t", "y")],
        ),
        ("SELECT 1", ("p",)),
    ]
    assert [row async for row in cur] == [{"checkpoint_id": "a"}]


def test_the_stores_put_with_a_ttl_keeps_its_nested_parentheses() -> None:
    from langgraph.store.base import PutOp
    from langgraph.store.postgres import AsyncPostgresStore

    store = AsyncPostgresStore.__new__(AsyncPostgresStore)
    store.index_config, store.ttl_config = None, None
    for ttl in (None, 5.0):
        ((sql, args),), _ = store._prepare_batch_PUT_queries(
            [(0, PutOp(("m",), "k", {}, False, ttl))]
        )
        ours = fenced_insert(sql)
        assert "FROM fence WHERE fence.ok" in ours
        assert "VALUES" not in ours
        assert ours.count("%s") == len(args) + 2 == sql.count("%s") + 2
        assert ours.count("(") == ours.count(")")
        assert ours.strip().endswith("ttl_minutes = EXCLUDED.ttl_minutes")


def test_an_insert_of_several_rows_is_refused() -> None:
    with pytest.raises(RuntimeError, match="one row"):
        fenced_insert("INSERT INTO t (a) VALUES (%s), (%s)")
