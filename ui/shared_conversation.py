"""A shared conversation as its teammates see it: what the owner saw, read-only, escaped.

The source is Chainlit's stored steps of the conversation (ui/chainlit/data_layer.py), the
messages the owner was shown, in order. Tool calls, the model's thinking and usage steps are
never shown; memory notes, the facts recall took from the owner's memory and attachments only
when the share includes them. Every value goes into server-made HTML through html.escape, as
plain text (no Markdown is rendered), so a message's markup shows as typed.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ui.memory_note import NOTE_AUTHOR, NOTE_KIND, NOTE_PREFIX, RECALL_STEP

if TYPE_CHECKING:
    from datetime import datetime

    from auth.shares import Include
    from graphs.core.persistence import Pool

USER, REPLY, NOTE, RECALL = "user", "reply", "note", "recall"
MAX_STEPS = 2000
_UNESCAPE = re.compile(r"\\([\\`*_{}\[\]()<>#+!|~-])")

_STEPS = """
SELECT s.id, s.type, s.name, s.output, s.metadata, s."startTime"
FROM "Step" s JOIN "Thread" t ON t.id = s."threadId"
WHERE s."threadId" = %(thread)s AND t."deletedAt" IS NULL
  AND (s.type IN ('user_message', 'assistant_message')
       OR (s.type = 'run' AND s.name = %(recall)s AND %(with_recall)s))
ORDER BY s."startTime", s."createdAt", s.id
LIMIT %(limit)s
"""

_ELEMENTS = """
SELECT e.id, e."stepId", e.name, e.mime FROM "Element" e
JOIN cairn_element_files f ON f.object_key = e."objectKey" AND f.thread_id = e."threadId"
WHERE e."threadId" = %s ORDER BY e."createdAt", e.id
"""
"""Attachments whose bytes Cairn keeps (ui/chainlit/elements.py); others cannot be opened."""

_FILE = """
SELECT e.name, f.mime, f.data FROM "Element" e
JOIN cairn_element_files f ON f.object_key = e."objectKey" AND f.thread_id = e."threadId"
WHERE e.id = %s AND e."threadId" = %s
"""


@dataclass(frozen=True)
class Attachment:
    id: str
    name: str
    mime: str


@dataclass
class Entry:
    kind: str
    author: str
    text: str
    at: datetime | None
    attachments: list[Attachment] = field(default_factory=list)


@dataclass(frozen=True)
class Transcript:
    name: str
    entries: list[Entry]


def is_memory_note(name: str | None, output: str, metadata: dict[str, Any]) -> bool:
    """The code's memory note (ui/memory_note.py): marked so when it was stored; an older one
    by its author and shape. Either way it is hidden unless the share includes notes."""
    if metadata.get("kind") == NOTE_KIND:
        return True
    lines = [line for line in output.splitlines() if line.strip()]
    return name == NOTE_AUTHOR and bool(lines) and all(x.startswith(NOTE_PREFIX) for x in lines)


def _metadata(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    try:
        loaded = json.loads(value or "{}")
    except (TypeError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _entry(row: dict[str, Any], include: Include, owner_name: str) -> Entry | None:
    # Stored text is sanitised Markdown, raw HTML turned into entities (ui/output_guard.py); as
    # plain text it reads as the chat showed it, and html.escape on the way out keeps it text.
    output = html.unescape(str(row["output"] or ""))
    name = row["name"]
    if row["type"] == "run":
        return Entry(RECALL, "Memory recall", _UNESCAPE.sub(r"\1", output), row["startTime"])
    if row["type"] == "user_message":
        return Entry(USER, owner_name, output, row["startTime"])
    if is_memory_note(name, output, _metadata(row["metadata"])):
        if not include.memory_notes:
            return None
        return Entry(NOTE, NOTE_AUTHOR, _UNESCAPE.sub(r"\1", output), row["startTime"])
    return Entry(REPLY, str(name or "Assistant")[:60], output, row["startTime"])


async def transcript(pool: Pool, thread_id: str, include: Include, owner_name: str) -> Transcript:
    """The conversation's messages in order, with only what the share includes."""
    params = {
        "thread": thread_id,
        "recall": RECALL_STEP,
        "with_recall": include.recall,
        "limit": MAX_STEPS,
    }
    async with pool.connection() as conn:
        cur = await conn.execute(_STEPS, params)
        rows = await cur.fetchall()
        cur = await conn.execute('SELECT name FROM "Thread" WHERE id = %s', (thread_id,))
        thread = await cur.fetchone()
        files = []
        if include.attachments:
            cur = await conn.execute(_ELEMENTS, (thread_id,))
            files = await cur.fetchall()
    entries: dict[str, Entry] = {}
    for row in rows:
        if (entry := _entry(row, include, owner_name)) is not None:
            entries[str(row["id"])] = entry
    for file in files:
        if (owner := entries.get(str(file["stepId"]))) is not None:
            owner.attachments.append(
                Attachment(str(file["id"]), str(file["name"]), str(file["mime"] or ""))
            )
    name = str(thread["name"]) if thread and thread["name"] else "Untitled conversation"
    return Transcript(name=name, entries=list(entries.values()))


async def conversation_names(pool: Pool, thread_ids: list[str]) -> dict[str, str]:
    async with pool.connection() as conn:
        cur = await conn.execute('SELECT id, name FROM "Thread" WHERE id = ANY(%s)', (thread_ids,))
        return {
            str(r["id"]): str(r["name"] or "Untitled conversation") for r in await cur.fetchall()
        }


async def attachment(pool: Pool, thread_id: str, element_id: str) -> tuple[str, str, bytes] | None:
    """An attachment's name, type and bytes, when it is one of this conversation's."""
    async with pool.connection() as conn:
        cur = await conn.execute(_FILE, (element_id, thread_id))
        row = await cur.fetchone()
    return None if row is None else (str(row["name"]), str(row["mime"]), bytes(row["data"]))


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _when(at: datetime | None) -> str:
    return at.strftime("%Y-%m-%d %H:%M UTC") if at is not None else ""


def _entry_html(share_url: str, entry: Entry) -> str:
    files = "".join(
        f"<li><a href='{_e(share_url)}/files/{_e(a.id)}' download>{_e(a.name)}</a>"
        f" <span class='meta'>{_e(a.mime)}</span></li>"
        for a in entry.attachments
    )
    return (
        f"<li class='message {entry.kind}' data-kind='{entry.kind}'>"
        f"<div class='meta'>{_e(entry.author)} · {_e(_when(entry.at))}</div>"
        f"<div class='text'>{_e(entry.text)}</div>"
        + (f"<ul class='attachments'>{files}</ul>" if files else "")
        + "</li>"
    )


def render(share_url: str, conversation: Transcript, include: Include, shared_by: str) -> str:
    """The page's main content: who shared it, what is left out, then the messages."""
    hidden = [
        what
        for what, shown in (
            ("memory notes", include.memory_notes),
            ("recall details", include.recall),
            ("attachments", include.attachments),
        )
        if not shown
    ]
    note = f" Not included: {', '.join(hidden)}." if hidden else ""
    items = "".join(_entry_html(share_url, e) for e in conversation.entries)
    return (
        f"<p class='hint'>Shared read-only by {_e(shared_by)}.{_e(note)}</p>"
        f"<h2 id='conversation-name'>{_e(conversation.name)}</h2>"
        f"<ol class='list' id='messages'>{items or '<li class=hint>No messages.</li>'}</ol>"
    )
