"""The app's migrations are one list: unique ids, numbered in the order they apply."""

from __future__ import annotations

import re

from graphs.core.migrations import MIGRATIONS, Migration

ID = re.compile(r"(\d{4})_[a-z0-9_]+")

# Ids some database already recorded: each keeps its name and meaning for good.
RELEASED = (
    "0001_core",
    "0002_chainlit",
    "0003_local_auth",
    "0004_procrastinate",
    "0005_memory_dead_letters",
    "0006_privacy",
    "0007_research_fetch_log",
    "0100_analytics_demo",
)


def numbers(migrations: tuple[Migration, ...]) -> list[int]:
    found = []
    for migration in migrations:
        match = ID.fullmatch(migration.id)
        assert match is not None, f"{migration.id!r} is not NNNN_name"
        found.append(int(match[1]))
    return found


def problems(migrations: tuple[Migration, ...]) -> list[str]:
    ids = [m.id for m in migrations]
    found = [f"duplicate id {i}" for i in sorted({i for i in ids if ids.count(i) > 1})]
    nums = numbers(migrations)
    found += [f"duplicate number {n:04d}" for n in sorted({n for n in nums if nums.count(n) > 1})]
    found += [
        f"{b} after {a}: numbers must increase"
        for (a, na), (b, nb) in zip(zip(ids, nums), zip(ids[1:], nums[1:]), strict=False)
        if nb <= na
    ]
    return found


def test_ids_are_unique_and_increase_in_the_order_they_apply() -> None:
    assert problems(MIGRATIONS) == []


def test_the_check_catches_a_duplicate_and_an_out_of_order_entry() -> None:
    misordered = (MIGRATIONS[0], MIGRATIONS[5], MIGRATIONS[2])
    assert problems(misordered) == ["0003_local_auth after 0006_privacy: numbers must increase"]
    assert "duplicate id 0001_core" in problems((MIGRATIONS[0], MIGRATIONS[0]))
    assert "duplicate number 0001" in problems((MIGRATIONS[0], Migration("0001_other", "")))


def test_released_ids_are_all_still_there_in_their_order() -> None:
    ids = [m.id for m in MIGRATIONS]
    assert [i for i in ids if i in RELEASED] == list(RELEASED)


def test_every_script_is_there() -> None:
    for migration in MIGRATIONS:
        assert migration.script().strip(), migration.id
    by_id = {m.id: m.script() for m in MIGRATIONS}
    assert "local_accounts" in by_id["0003_local_auth"]
    assert "procrastinate_jobs" in by_id["0004_procrastinate"]
    assert "research_fetch_log" in by_id["0007_research_fetch_log"]


def test_each_layers_script_is_found_where_the_list_names_it() -> None:
    # Named, not imported, by core: a renamed module or constant must fail here, not at start-up.
    scripts = {m.id: m.script() for m in MIGRATIONS}
    assert all(isinstance(s, str) and s.strip() for s in scripts.values())
    assert '"Thread"' in scripts["0002_chainlit"]
    assert "cairn_workspaces" in scripts["0112_workspaces"]


def test_core_lists_the_layers_scripts_without_importing_the_layers() -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, graphs.core.migrations; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('auth', 'ui')))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]"
