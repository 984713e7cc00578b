"""The research agents' virtual filesystem: per-thread files in state, /memories/ in the store, who may write where."""

from __future__ import annotations

import posixpath
import re
from typing import TYPE_CHECKING, Any, Literal

from deepagents.backends import CompositeBackend, StateBackend, StoreBackend
from deepagents.backends.protocol import (
    DeleteResult,
    EditResult,
    FileUploadResponse,
    ReadResult,
    WriteResult,
)
from langgraph.config import get_config
from langgraph.runtime import get_runtime

from graphs.memory.team_sources import source_namespace

if TYPE_CHECKING:
    from langgraph.runtime import Runtime

Role = Literal["orchestrator", "researcher", "critic"]

REPORT_PATH = "/final_report.md"
NOTES_DIR = "/notes/"
MEMORIES_DIR = "/memories/"
NOTE_PATH = re.compile(r"^/notes/[a-z0-9][a-z0-9_-]{0,63}\.md$")
MAX_NOTE_CHARS = 20_000
MAX_REPORT_CHARS = 60_000
MAX_MEMORY_CHARS = 1_000


class PathRefused(PermissionError):
    """A file operation outside what the caller's role may do."""


def research_memory_namespace(runtime: Runtime[Any] | None) -> tuple[str, ...]:
    """From the run's verified context, never from arguments: the team's source memory in a
    team conversation, else `(user_id, "research", "memories")` (graphs.memory.team_sources)."""
    return source_namespace(getattr(runtime, "context", None))


class MemoriesBackend(StoreBackend):
    """/memories/ in the store, under the run's own research memory namespace.

    deepagents checks a namespace factory's labels against a character set meant for raw ids,
    which refuses Cairn's own labels: a team's root is "%team" and user_label writes "." and "%"
    as "%2E"/"%25". Those labels are built here from the verified context only, and the store
    checks them itself, so this backend takes the namespace as built."""

    def __init__(self) -> None:
        super().__init__(namespace=research_memory_namespace)

    def _get_namespace(self) -> tuple[str, ...]:
        try:
            runtime: Runtime[Any] | None = get_runtime()
        except (RuntimeError, KeyError):
            runtime = None
        return research_memory_namespace(runtime)


def normalise_path(path: str) -> str:
    """An absolute, normalised virtual path; traversal and odd spellings are refused, not fixed."""
    if not isinstance(path, str) or not path.strip():
        msg = "a file path is required"
        raise PathRefused(msg)
    path = path.strip()
    if "\x00" in path or "\\" in path or "~" in path:
        msg = f"refused: {path!r} contains characters paths may not have"
        raise PathRefused(msg)
    if ".." in path.split("/"):
        msg = f"refused: {path!r} climbs out of its folder ('..')"
        raise PathRefused(msg)
    if not path.startswith("/"):
        path = "/" + path
    return posixpath.normpath(path)


def in_subagent() -> bool:
    """True inside a `task` subagent: deepagents marks the subagent's config this way."""
    try:
        config = get_config()
    except RuntimeError:
        return False
    return config.get("configurable", {}).get("ls_agent_type") == "subagent"


def check_write(path: str, content: str, role: Role) -> str:
    """The normalised path if `role` may write `content` there; PathRefused otherwise."""
    path = normalise_path(path)
    if role == "orchestrator" and in_subagent():
        role = "researcher"  # any subagent, whatever backend it inherited, writes notes only
    if role == "researcher":
        if not NOTE_PATH.match(path):
            msg = f"refused: research subagents write only notes/<topic>.md, not {path}"
            raise PathRefused(msg)
        _cap(content, MAX_NOTE_CHARS, path)
        return path
    if role == "orchestrator":
        if path == REPORT_PATH:
            _cap(content, MAX_REPORT_CHARS, path)
            return path
        if path.startswith(MEMORIES_DIR):
            # Learnings are recorded by code after the report passed the check
            # (graphs/memory/research.py), from evidence, never from a model's say-so.
            msg = "refused: research memories are recorded by Cairn after the report is checked"
            raise PathRefused(msg)
        msg = f"refused: the orchestrator writes only final_report.md and memories/, not {path}"
        raise PathRefused(msg)
    msg = "refused: the critic has read-only access"
    raise PathRefused(msg)


def check_read(path: str, role: Role) -> str:
    path = normalise_path(path)
    if path.startswith(MEMORIES_DIR) and (role != "orchestrator" or in_subagent()):
        msg = "refused: only the orchestrator reads memories"
        raise PathRefused(msg)
    return path


def _cap(content: str, limit: int, path: str) -> None:
    if len(content) > limit:
        msg = f"refused: {path} would be {len(content)} characters; the limit is {limit}"
        raise PathRefused(msg)


class GuardedBackend(CompositeBackend):
    """A CompositeBackend that enforces the role's paths and sizes before any write or read."""

    def __init__(
        self,
        default: StateBackend,
        routes: dict[str, Any],
        *,
        role: Role,
    ) -> None:
        super().__init__(default, routes)
        self.role: Role = role

    def write(self, file_path: str, content: str) -> WriteResult:
        try:
            path = check_write(file_path, content, self.role)
        except PathRefused as exc:
            return WriteResult(error=str(exc))
        return super().write(path, content)

    async def awrite(self, file_path: str, content: str) -> WriteResult:
        try:
            path = check_write(file_path, content, self.role)
        except PathRefused as exc:
            return WriteResult(error=str(exc))
        return await super().awrite(path, content)

    def edit(
        self, file_path: str, old_string: str, new_string: str, replace_all: bool = False
    ) -> EditResult:
        try:
            path = self._check_edit(file_path, new_string)
        except PathRefused as exc:
            return EditResult(error=str(exc))
        return super().edit(path, old_string, new_string, replace_all)

    async def aedit(
        self, file_path: str, old_string: str, new_string: str, replace_all: bool = False
    ) -> EditResult:
        try:
            path = self._check_edit(file_path, new_string)
        except PathRefused as exc:
            return EditResult(error=str(exc))
        return await super().aedit(path, old_string, new_string, replace_all)

    def _check_edit(self, file_path: str, new_string: str) -> str:
        path = check_write(file_path, new_string, self.role)
        if path.startswith(MEMORIES_DIR):
            msg = "refused: memories are written whole with write_file, so they are checked whole"
            raise PathRefused(msg)
        return path

    def delete(self, file_path: str) -> DeleteResult:
        return DeleteResult(error="refused: research files are not deleted")

    async def adelete(self, file_path: str) -> DeleteResult:
        return self.delete(file_path)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        return [FileUploadResponse(path=p, error="permission_denied") for p, _ in files]

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        return self.upload_files(files)

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        try:
            path = check_read(file_path, self.role)
        except PathRefused as exc:
            return ReadResult(error=str(exc))
        return super().read(path, offset, limit)

    async def aread(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        try:
            path = check_read(file_path, self.role)
        except PathRefused as exc:
            return ReadResult(error=str(exc))
        return await super().aread(path, offset, limit)


def orchestrator_backend() -> GuardedBackend:
    """Per-thread files in graph state; /memories/ in the store under the run's namespace."""
    return GuardedBackend(
        StateBackend(),
        {MEMORIES_DIR: MemoriesBackend()},
        role="orchestrator",
    )


def researcher_backend() -> GuardedBackend:
    """Per-thread files in graph state only: a research subagent has no route to the store at all."""
    return GuardedBackend(StateBackend(), {}, role="researcher")
