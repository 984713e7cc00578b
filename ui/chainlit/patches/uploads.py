"""Uploads: one private folder per process under the data dir, and the folders of dead processes swept."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import chainlit.config
import chainlit.element
import chainlit.emitter

log = logging.getLogger("cairn.security")

UPLOAD_PINS = {
    "chainlit.session.BaseSession.files_dir": "97c55ce5b37ab2b8",
    "chainlit.session.WebsocketSession.delete": "b6a06e7409d9fdba",
}
"""The Chainlit code this module relies on (qualified name: digest of its source as checked),
tripped by tests/unit/test_chainlit_patches.py when an upgrade changes it."""


def relocate_files(parent: Path) -> Path:
    """One private uploads folder per process, outside the source tree.

    Chainlit keeps uploads in `chainlit.config.FILES_DIRECTORY` (`<cwd>/.files`, shared by
    every process started there) and `rmtree`s a session's folder when the session ends.
    `BaseSession.files_dir` reads the name from chainlit.config at each call. The empty
    `<cwd>/.files` Chainlit made on import goes (no process uses it any more), and so do the
    folders of processes that ended without cleaning up (`sweep_stale_instances`).
    """
    parent.mkdir(parents=True, exist_ok=True)
    folder = claim_instance_folder(parent)
    sweep_stale_instances(parent)
    chainlit_default = Path(chainlit.config.FILES_DIRECTORY)
    if chainlit_default.name == ".files":
        with contextlib.suppress(OSError):  # not empty (an older Cairn's uploads) or gone: kept
            chainlit_default.rmdir()
    chainlit.config.FILES_DIRECTORY = folder
    return folder


_INSTANCE_LOCKS: list[int] = []
"""The open lock files of this process's folders: held until the process ends, however it ends."""


def claim_instance_folder(parent: Path) -> Path:
    """A new `instance-*` folder with its `instance-*.lock` beside it, locked by this process.

    The lock (flock) is the liveness check: the kernel drops it when the process ends, even
    by kill -9, and unlike a pid it cannot be mistaken for a later process. The lock file is
    locked under a temporary name and then renamed, so no sweep ever sees it unlocked.
    """
    fd, temp = tempfile.mkstemp(prefix=".claiming-", dir=parent)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    folder = Path(tempfile.mkdtemp(prefix="instance-", dir=parent))
    os.rename(temp, folder.with_name(folder.name + ".lock"))
    _INSTANCE_LOCKS.append(fd)
    return folder


def sweep_stale_instances(parent: Path) -> list[Path]:
    """Remove the folders (and lock files) of processes that are gone; returns those removed.

    A folder counts as stale only when its lock file can be locked, i.e. no live process
    holds it. A folder without a lock file (made by a Cairn before these locks) is left.
    """
    removed = []
    for lock_path in sorted(parent.glob("instance-*.lock")) + sorted(parent.glob(".claiming-*")):
        try:
            if lock_path.suffix != ".lock" and time.time() - lock_path.stat().st_mtime < 60:
                continue  # being claimed right now: locked a moment after it is made
            fd = os.open(lock_path, os.O_RDWR)
        except FileNotFoundError:  # another sweep got there first
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # its process is alive
            os.close(fd)
            continue
        try:
            if lock_path.suffix == ".lock":
                folder = lock_path.with_suffix("")
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
            with contextlib.suppress(FileNotFoundError):
                lock_path.unlink()
        finally:
            os.close(fd)
    return removed
