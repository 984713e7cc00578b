"""Time travel on a thread's checkpoints: list them, read one, fork from one, and the records
that go with it (each user message's fork point, the support audit).

Every function here takes an already-checked thread: ownership and the support role are
decided above (ui/), and the fork itself runs through the one turn runner, under the run lock.

Support sees a conversation, never the user's memories: the state shown, digested and exported
here leaves out `recalled` (the memories recall put into the Assistant's prompt) and any file
under /memories/.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.messages import BaseMessage

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.types import StateSnapshot

    from graphs.core.pool import Pool

HIDDEN_KEYS = frozenset({"recalled"})
"""State keys holding long-term memories: never shown to support, digested or exported."""
HIDDEN_FILE_PREFIX = "/memories/"
MAX_HISTORY = 500
"""Checkpoints listed per thread (newest first)."""
MAX_STEPS = 12
MAX_STEP_CHARS = 500
MAX_FILE_CHARS = 100_000
MAX_REASON_CHARS = 1000
PREVIEW_CHARS = 160

Action = Literal["history", "state", "fork"]
EditField = Literal["none", "plan", "todos", "file"]


class ForkRefused(ValueError):
    """A fork that cannot be made as asked (no such field, bad text): shown to support."""


# -- reading ------------------------------------------------------------------------------


def visible(values: dict[str, Any]) -> dict[str, Any]:
    """The state support may see: everything but memories."""
    shown = {k: v for k, v in values.items() if k not in HIDDEN_KEYS}
    if isinstance(shown.get("files"), dict):
        shown["files"] = {
            path: data
            for path, data in shown["files"].items()
            if not str(path).startswith(HIDDEN_FILE_PREFIX)
        }
    return shown


def jsonable(value: Any) -> Any:
    """State as plain JSON: messages as {type, id, content, tool_calls, name}."""
    if isinstance(value, BaseMessage):
        out: dict[str, Any] = {"type": value.type, "id": value.id, "content": value.content}
        if getattr(value, "tool_calls", None):
            out["tool_calls"] = [
                {"name": c.get("name"), "args": c.get("args")}
                for c in value.tool_calls  # type: ignore[attr-defined]
            ]
        if getattr(value, "name", None):
            out["name"] = value.name
        return out
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def state_digest(values: dict[str, Any]) -> str:
    """sha256 of the visible state as canonical JSON: what the audit keeps instead of the state."""
    text = json.dumps(jsonable(visible(values)), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def checkpoint_id(config: RunnableConfig | None) -> str | None:
    return ((config or {}).get("configurable") or {}).get("checkpoint_id")


def _preview(text: Any) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= PREVIEW_CHARS else flat[: PREVIEW_CHARS - 1] + "…"


def summarise(values: dict[str, Any]) -> dict[str, Any]:
    """A line's worth of a state: messages, todos, notes files, plan, past steps."""
    out: dict[str, Any] = {}
    messages = values.get("messages")
    if isinstance(messages, list):
        out["messages"] = len(messages)
        if messages:
            last = messages[-1]
            text = last.text if isinstance(last, BaseMessage) else last
            kind = last.type if isinstance(last, BaseMessage) else "message"
            out["last_message"] = f"{kind}: {_preview(text)}"
    if isinstance(values.get("todos"), list):
        todos = values["todos"]
        done = sum(1 for t in todos if isinstance(t, dict) and t.get("status") == "completed")
        out["todos"] = f"{done}/{len(todos)} done"
    if isinstance(values.get("files"), dict):
        out["files"] = sorted(str(p) for p in visible(values)["files"])
    if isinstance(values.get("plan"), list):
        out["plan"] = [_preview(step) for step in values["plan"]]
    if isinstance(values.get("past_steps"), list):
        out["past_steps"] = len(values["past_steps"])
    if values.get("input"):
        out["goal"] = _preview(values["input"])
    return out


@dataclass(frozen=True)
class CheckpointSummary:
    checkpoint_id: str
    parent_id: str | None
    created_at: str | None
    step: int | None
    source: str | None
    node: str
    """What wrote it: the node(s) of the step before, `input`, or `fork` for update_state."""
    next: tuple[str, ...]
    summary: dict[str, Any] = field(default_factory=dict)


def _node(snapshot: StateSnapshot, parent: StateSnapshot | None) -> str:
    source = (snapshot.metadata or {}).get("source")
    if source == "input":
        return "input"
    if source == "update":
        return "fork (update_state)"
    if parent is not None and parent.tasks:
        return ", ".join(sorted({t.name for t in parent.tasks}))
    return str(source or "?")


async def history(
    graph: Any, thread_id: str, *, limit: int = MAX_HISTORY
) -> list[CheckpointSummary]:
    """Every checkpoint of the thread, every branch, newest first."""
    config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    snapshots = [s async for s in graph.aget_state_history(config, limit=limit)]
    by_id = {checkpoint_id(s.config): s for s in snapshots}
    found = []
    for s in snapshots:
        parent_id = checkpoint_id(s.parent_config)
        found.append(
            CheckpointSummary(
                checkpoint_id=str(checkpoint_id(s.config)),
                parent_id=parent_id,
                created_at=s.created_at,
                step=(s.metadata or {}).get("step"),
                source=(s.metadata or {}).get("source"),
                node=_node(s, by_id.get(parent_id)),
                next=tuple(s.next),
                summary=summarise(s.values),
            )
        )
    return found


async def snapshot_at(graph: Any, thread_id: str, checkpoint: str) -> StateSnapshot | None:
    """One checkpoint of the thread (None: no such checkpoint in this thread)."""
    config: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_id": checkpoint}}
    snapshot = await graph.aget_state(config)
    if snapshot.metadata is None or checkpoint_id(snapshot.config) != checkpoint:
        return None
    return snapshot


async def latest_checkpoint_id(graph: Any, thread_id: str) -> str | None:
    """The thread's newest checkpoint (the live branch's head), or None for a new thread."""
    saved = await graph.checkpointer.aget_tuple(
        {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    )
    return None if saved is None else checkpoint_id(saved.config)


async def root_checkpoint_id(graph: Any, thread_id: str) -> str | None:
    """The thread's first checkpoint (its first message's input), to fork a first message."""
    config: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    root = None
    async for saved in graph.checkpointer.alist(config, filter={"step": -1}):
        if saved.parent_config is None or checkpoint_id(saved.parent_config) is None:
            root = checkpoint_id(saved.config)
    return root


def _holds(values: dict[str, Any], message_id: str) -> bool:
    return any(getattr(m, "id", None) == message_id for m in values.get("messages") or [])


async def message_fork_point(
    graph: Any, thread_id: str, message_id: str
) -> tuple[bool, str | None]:
    """For a message sent before fork points were recorded: the checkpoint it was sent on,
    found by its id in the live branch's messages (found=False: not a message of this thread).

    Walks back from the head to the first checkpoint holding the message; its parent is the
    input checkpoint that brought it, and a fork from there replaces that input."""
    config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    snapshot = await graph.aget_state(config)
    if not _holds(snapshot.values, message_id):
        return False, None
    earliest = snapshot
    for _ in range(MAX_HISTORY):
        if snapshot.parent_config is None:
            break
        snapshot = await graph.aget_state(snapshot.parent_config)
        if not _holds(snapshot.values, message_id):
            break
        earliest = snapshot
    return True, checkpoint_id(earliest.parent_config)


# -- forking ------------------------------------------------------------------------------


def edit_fields(values: dict[str, Any]) -> list[str]:
    """What support may edit in a fork of this state (by its shape, whichever agent)."""
    found: list[str] = []
    if isinstance(values.get("plan"), list):
        found.append("plan")
    if isinstance(values.get("todos"), list):
        found.append("todos")
    if isinstance(values.get("files"), dict):
        found.append("file")
    return found


def _lines(text: str) -> list[str]:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines or len(lines) > MAX_STEPS or any(len(x) > MAX_STEP_CHARS for x in lines):
        msg = f"Give 1 to {MAX_STEPS} lines of at most {MAX_STEP_CHARS} characters."
        raise ForkRefused(msg)
    return lines


def fork_update(
    values: dict[str, Any], what: EditField, text: str, path: str = ""
) -> dict[str, Any]:
    """The update_state values for a fork: the edited plan, todo list or notes file (checked)."""
    if what == "none":
        return {}
    if what not in edit_fields(values):
        msg = f"This checkpoint has no {what} to edit."
        raise ForkRefused(msg)
    if what == "plan":
        return {"plan": _lines(text)}
    if what == "todos":
        old = {t.get("content"): t.get("status") for t in values["todos"] if isinstance(t, dict)}
        return {
            "todos": [
                {"content": line, "status": old.get(line, "pending")} for line in _lines(text)
            ]
        }
    path = path.strip()
    files = values["files"]
    if not path.startswith("notes/") and path not in files:
        msg = "Only an existing file or a notes/ file can be edited."
        raise ForkRefused(msg)
    if path.startswith(HIDDEN_FILE_PREFIX) or ".." in path or len(path) > 200:
        msg = "That path cannot be edited."
        raise ForkRefused(msg)
    if len(text) > MAX_FILE_CHARS:
        msg = f"A file holds at most {MAX_FILE_CHARS} characters."
        raise ForkRefused(msg)
    now = datetime.now(UTC).isoformat()
    old_file = files.get(path) if isinstance(files.get(path), dict) else {}
    return {
        "files": {
            path: {
                "content": text,
                "encoding": "utf-8",
                "created_at": old_file.get("created_at", now),
                "modified_at": now,
            }
        }
    }


def writer_node(snapshot: StateSnapshot, parent: StateSnapshot | None) -> str | None:
    """The node to write a fork's update as, so the fork continues where the original did."""
    if parent is not None and len({t.name for t in parent.tasks}) == 1:
        return parent.tasks[0].name
    return None


# -- records ------------------------------------------------------------------------------


class MessageCheckpoints:
    """Which checkpoint each user message was sent on (cairn_message_checkpoints)."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def record(self, thread_id: str, message_id: str, checkpoint: str | None) -> None:
        """`checkpoint` None: the thread's head now (NULL for a new thread), read in the same
        statement (one round trip; loading the head through the saver cost ~12 ms a turn)."""
        async with self.pool.connection() as conn:
            await conn.execute(
                "INSERT INTO cairn_message_checkpoints (thread_id, message_id, checkpoint_id) "
                "SELECT %(t)s, %(m)s, COALESCE(%(c)s, (SELECT checkpoint_id FROM checkpoints "
                " WHERE thread_id = %(t)s AND checkpoint_ns = '' "
                " ORDER BY checkpoint_id DESC LIMIT 1)) "
                "ON CONFLICT (thread_id, message_id) DO NOTHING",
                {"t": thread_id, "m": message_id, "c": checkpoint},
            )

    async def point(self, thread_id: str, message_id: str) -> tuple[bool, str | None]:
        """(found, checkpoint the message was sent on); not found for a message not in the thread."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT checkpoint_id FROM cairn_message_checkpoints "
                "WHERE thread_id = %s AND message_id = %s",
                (thread_id, message_id),
            )
            row = await cur.fetchone()
        return (False, None) if row is None else (True, row["checkpoint_id"])


@dataclass(frozen=True)
class AuditEntry:
    actor_id: str
    owner_id: str
    thread_id: str
    action: Action
    checkpoint_id: str | None = None
    reason: str | None = None
    before_digest: str | None = None
    after_digest: str | None = None
    new_checkpoint_id: str | None = None


AUDIT_COLUMNS = (
    "id, at, actor_id, owner_id, thread_id, action, checkpoint_id, reason, "
    "before_digest, after_digest, new_checkpoint_id"
)


class SupportAudit:
    """Every support access and fork (cairn_support_audit)."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def record(self, entry: AuditEntry) -> int:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "INSERT INTO cairn_support_audit (actor_id, owner_id, thread_id, action, "
                "checkpoint_id, reason, before_digest, after_digest, new_checkpoint_id) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
                (
                    entry.actor_id,
                    entry.owner_id,
                    entry.thread_id,
                    entry.action,
                    entry.checkpoint_id,
                    (entry.reason or "")[:MAX_REASON_CHARS] or None,
                    entry.before_digest,
                    entry.after_digest,
                    entry.new_checkpoint_id,
                ),
            )
            row = await cur.fetchone()
        assert row is not None
        return int(row["id"])

    async def for_thread(self, thread_id: str, *, limit: int = 200) -> list[dict[str, Any]]:
        return await self._rows("thread_id = %s", (thread_id,), limit)

    async def for_owner(self, owner_id: str, *, limit: int = 5000) -> list[dict[str, Any]]:
        return await self._rows("owner_id = %s", (owner_id,), limit)

    async def _rows(self, where: str, args: tuple[Any, ...], limit: int) -> list[dict[str, Any]]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {AUDIT_COLUMNS} FROM cairn_support_audit WHERE {where} "  # noqa: S608 (constants)
                "ORDER BY at DESC, id DESC LIMIT %s",
                (*args, limit),
            )
            rows = await cur.fetchall()
        return [{**row, "at": row["at"].isoformat()} for row in rows]
