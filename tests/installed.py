"""Cairn as a user installs it: the wheel of a clean copy of the tree, installed away from the tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "graphs", "ui", "auth", "evals", "bench")
"""evals/ and bench/ are copied too: the wheel must leave them out, not merely not find them."""


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=240, check=False
    )


def build_wheel(workdir: Path) -> Path:
    """From a copy: a build in the tree would leave build/ and egg-info behind, and a later
    build would take its file list from them."""
    source = workdir / "source"
    source.mkdir(parents=True)
    for name in SOURCES:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__")
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        else:
            shutil.copy(ROOT / name, source / name)
    out = workdir / "dist"
    # Offline: no dependency resolved, the build backend from the (locked) environment.
    built = run(
        *("-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"),
        *("-w", str(out), str(source)),
        cwd=workdir,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = out.glob("cairn-*.whl")
    return wheel


def install(wheel: Path, site: Path) -> Path:
    """The wheel alone into `site`; its dependencies are this environment's."""
    installed = run(
        *("-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)),
        cwd=site.parent,
    )
    assert installed.returncode == 0, installed.stderr
    return site


def run_installed(site: Path, code: str) -> subprocess.CompletedProcess[str]:
    """`code` with the installed copy first on the path, in `site`'s parent. -I: neither the
    working directory nor PYTHONPATH nor the user site is on the path, so not the tree."""
    return run(
        "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r})\n{code}", cwd=site.parent
    )
