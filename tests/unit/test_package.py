"""An installed Cairn (the built wheel, away from the source tree) has the data it reads at run time."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from graphs.memory.evaluation.retrieval import LABELLED_SET, load_retrieval_set

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "graphs", "ui", "auth", "evals", "bench")

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


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=240, check=False
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of a clean copy of the tree: a build here would leave build/ and egg-info
    behind, and a later build would take its file list from them."""
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__")
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        else:
            shutil.copy(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    # Offline: no dependency resolved, the build backend from the (locked) environment.
    built = run(
        *("-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"),
        *("-w", str(out), str(source)),
        cwd=out,
    )
    assert built.returncode == 0, built.stderr
    (path,) = out.glob("cairn-*.whl")
    return path


def test_the_wheel_ships_the_labelled_set_and_no_evals(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "graphs/memory/evaluation/data/retrieval.jsonl" in names
    assert "graphs/research/corpus/wild-bees.pdf" in names
    assert not [n for n in names if n.startswith(("evals/", "bench/", "tests/"))]


def test_an_installed_cairn_finds_the_labelled_set_without_the_source_tree(
    wheel: Path, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    installed = run(
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--target",
        str(site),
        str(wheel),
        cwd=tmp_path,
    )
    assert installed.returncode == 0, installed.stderr
    # -I: neither the working directory nor PYTHONPATH nor user site; only the copy and the venv.
    probe = run("-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r})\n{PROBE}", cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    assert found["graphs"].startswith(str(site))
    assert found["labelled_set"].startswith(str(site))
    assert found["queries"] == len(load_retrieval_set().queries) > 0
    assert "wild-bees.pdf" in found["corpus"]


def test_the_labelled_set_is_package_data_read_through_importlib_resources() -> None:
    assert LABELLED_SET.is_file()
    assert Path(str(LABELLED_SET)).is_relative_to(ROOT / "graphs")
