"""An installed Cairn (the built wheel, away from the source tree) has the data it reads at run time."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from graphs.memory.evaluation.retrieval import LABELLED_SET, load_retrieval_set
from tests.installed import ROOT, build_wheel, install, run_installed

# Run in the installed copy: the labelled set through importlib.resources, the modules' origin.
PROBE = """
import json, graphs, graphs.memory.reembed
from graphs.memory.evaluation.retrieval import LABELLED_SET, load_retrieval_set
from graphs.research import SAMPLE_CORPUS_DIR
labelled = load_retrieval_set()
print(json.dumps({
    "graphs": graphs.__file__,
    "labelled_set": str(LABELLED_SET),
    "queries": len(labelled.queries),
    "corpus": sorted(p.name for p in SAMPLE_CORPUS_DIR.iterdir()),
}))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("build"))


def test_the_wheel_ships_the_labelled_set_and_no_evals(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "graphs/memory/evaluation/data/retrieval.jsonl" in names
    assert "graphs/research/corpus/wild-bees.pdf" in names
    assert not [n for n in names if n.startswith(("evals/", "bench/", "tests/"))]


def test_an_installed_cairn_finds_the_labelled_set_without_the_source_tree(
    wheel: Path, tmp_path: Path
) -> None:
    site = install(wheel, tmp_path / "site")
    probe = run_installed(site, PROBE)
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    assert found["graphs"].startswith(str(site))
    assert found["labelled_set"].startswith(str(site))
    assert found["queries"] == len(load_retrieval_set().queries) > 0
    assert "wild-bees.pdf" in found["corpus"]


def test_the_labelled_set_is_package_data_read_through_importlib_resources() -> None:
    assert LABELLED_SET.is_file()
    assert Path(str(LABELLED_SET)).is_relative_to(ROOT / "graphs")
