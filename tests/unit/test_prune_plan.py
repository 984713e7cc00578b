"""graphs.core.prune.plan_prune: which checkpoints of a thread stay, and where the rest's writes go."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from graphs.core.prune import Row, plan_prune

OLD = datetime(2026, 1, 1, tzinfo=UTC)
CUTOFF = OLD + timedelta(days=1)


def row(cid: str, parent: str | None, step: int, *, version: str = "1", young: bool = False) -> Row:
    ts = CUTOFF + timedelta(hours=1) if young else OLD
    return Row(id=cid, parent=parent, ts=ts, step=step, versions={"messages": version})


def chain(*ids: str, start: str | None = None, step: int = 0) -> list[Row]:
    rows, parent = [], start
    for n, cid in enumerate(ids):
        rows.append(row(cid, parent, step + n, version=cid))
        parent = cid
    return rows


def test_a_straight_thread_keeps_root_fork_points_and_head_and_moves_writes_to_the_anchor():
    rows = chain("a", "b", "c", "d", "e", "f")

    plan = plan_prune(rows, cutoff=CUTOFF, fork_points={"d"}, snapshots=set())

    assert plan.kept == {"a", "d", "f"}
    assert plan.deleted == ["b", "c", "e"]
    assert plan.parents == {"d": "a", "f": "d"}
    assert plan.anchors == {"b": ("a", 2), "c": ("a", 3), "e": ("d", 5)}


def test_young_checkpoints_and_snapshot_holders_stay():
    rows = chain("a", "b", "c", "d")
    rows[2] = row("c", "b", 2, version="c", young=True)

    plan = plan_prune(rows, cutoff=CUTOFF, fork_points=set(), snapshots={("messages", "b")})

    assert plan.kept == {"a", "b", "c", "d"}
    assert plan.deleted == []


def test_a_snapshot_a_kept_checkpoint_reads_keeps_no_extra_checkpoint():
    rows = [
        row("a", None, 0, version="1"),
        row("b", "a", 1, version="2"),
        row("c", "b", 2, version="2"),
    ]

    plan = plan_prune(rows, cutoff=CUTOFF, fork_points=set(), snapshots={("messages", "2")})

    assert plan.kept == {"a", "c"}


def test_each_branch_below_a_fork_point_keeps_its_first_checkpoint():
    # a - b - c - d (old branch) and b - x - y (an edit forked from b)
    rows = [*chain("a", "b", "c", "d"), *chain("x", "y", start="b", step=2)]

    plan = plan_prune(rows, cutoff=CUTOFF, fork_points={"b"}, snapshots=set())

    assert plan.kept == {"a", "b", "c", "d", "x", "y"}
    assert plan.deleted == []


def test_a_branch_point_itself_may_go_when_both_branches_start_below_it():
    rows = [*chain("a", "b", "c", "d"), *chain("x", "y", start="c", step=3)]

    plan = plan_prune(rows, cutoff=CUTOFF, fork_points=set(), snapshots=set())

    assert plan.kept == {"a", "d", "x", "y"}
    assert plan.parents == {"d": "a", "x": "a"}
    assert plan.anchors == {"b": ("a", 2), "c": ("a", 3)}
