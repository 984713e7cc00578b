"""The checkpoint writes carry the wipe's check in the statement: the library's INSERTs rewritten."""

from __future__ import annotations

import pytest
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from graphs.core.saver import CairnSaver, fenced_insert

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
    with pytest.raises(RuntimeError, match="unexpected checkpoint SQL shape"):
        fenced_insert("INSERT INTO checkpoints SELECT * FROM elsewhere")
