"""requirements.lock is what pyproject.toml asks for, what is installed, and pins the Chainlit the patches were checked against."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from ui.chainlit.patches import CHAINLIT_VERSION

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements.lock"
PYPROJECT = ROOT / "pyproject.toml"
_PIN = re.compile(r"^(?P<requirement>[A-Za-z0-9][^\s\\]*==[^\s\\]+(?: ?;[^\\]+)?)\s*\\?$")


def locked(text: str) -> dict[str, Version]:
    """Every pin of a pip-compile lock that applies here (name, version); each must be hashed."""
    pins: dict[str, Version] = {}
    lines = text.splitlines()
    for number, line in enumerate(lines):
        match = _PIN.match(line)
        if match is None:
            continue
        requirement = Requirement(match["requirement"])
        if number + 1 >= len(lines) or "--hash=sha256:" not in lines[number + 1]:
            msg = f"requirements.lock: {requirement.name} has no hash (pip would refuse it)"
            raise ValueError(msg)
        if requirement.marker is None or requirement.marker.evaluate():
            (spec,) = requirement.specifier
            pins[canonicalize_name(requirement.name)] = Version(spec.version)
    return pins


def wanted() -> list[Requirement]:
    """pyproject.toml's dependencies and its dev extra, as they apply here."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    requirements = [Requirement(r) for r in project["dependencies"]]
    requirements += [Requirement(r) for r in project["optional-dependencies"]["dev"]]
    return [r for r in requirements if r.marker is None or r.marker.evaluate()]


@pytest.fixture(scope="module")
def pins() -> dict[str, Version]:
    return locked(LOCK.read_text())


def test_the_lock_meets_every_requirement_of_pyproject(pins: dict[str, Version]) -> None:
    # pyproject.toml edited without `make lock`: `make install` would not install the change.
    unmet = [
        f"{r} (locked: {pins.get(canonicalize_name(r.name), 'nothing')})"
        for r in wanted()
        if not r.specifier.contains(pins.get(canonicalize_name(r.name), Version("0")), True)
    ]
    assert not unmet, f"requirements.lock is stale, run `make lock`: {unmet}"


def test_the_lock_pins_the_chainlit_the_patches_were_checked_against(
    pins: dict[str, Version],
) -> None:
    checked = Version(CHAINLIT_VERSION)
    (pin,) = [r for r in wanted() if canonicalize_name(r.name) == "chainlit"]
    assert str(pin.specifier) == f"=={checked}", (
        "pyproject.toml must pin exactly the Chainlit of CHAINLIT_VERSION (ui/chainlit/patches/__init__.py)"
    )
    assert pins["chainlit"] == checked
    assert Version(metadata.version("chainlit")) == checked


def test_what_is_installed_is_what_is_locked(pins: dict[str, Version]) -> None:
    # A venv installed before the lock last changed tests something else: `make install`.
    differ = {}
    for name, version in pins.items():
        try:
            installed = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            differ[name] = (str(version), str(installed))
    assert not differ, (
        f"installed packages differ from requirements.lock (locked, installed): {differ}"
    )


def test_a_stale_or_unhashed_lock_is_caught() -> None:
    stale = "chainlit==2.11.0 \\\n    --hash=sha256:00\n"
    assert locked(stale) == {"chainlit": Version("2.11.0")}
    (chainlit,) = [r for r in wanted() if canonicalize_name(r.name) == "chainlit"]
    assert not chainlit.specifier.contains(locked(stale)["chainlit"], True)
    with pytest.raises(ValueError, match="no hash"):
        locked("chainlit==2.12.0\nclick==8.5.1 \\\n    --hash=sha256:00\n")


def test_markers_in_the_lock_are_evaluated() -> None:
    text = (
        'uvloop==0.23.0 ; sys_platform == "win32" \\\n    --hash=sha256:00\n'
        "torch==2.13.0+cpu \\\n    --hash=sha256:00\n"
    )
    assert locked(text) == {"torch": Version("2.13.0+cpu")}
