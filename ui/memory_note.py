"""The code's account of what the memory tools did in a turn, shown to the user after the reply."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from langchain_core.messages import ToolMessage

NOTE_AUTHOR = "Cairn"
NOTE_KIND = "memory_note"
"""The stored note's metadata `kind`: a shared conversation hides notes unless asked not to."""
NOTE_PREFIX = "Memory: "
RECALL_STEP = "Memory recall"
"""The name of the step showing what recall took from memory (hidden in a shared conversation)."""
_MARKDOWN_RE = re.compile(r"([\\`*_{}\[\]()<>#+!|~-])")


def tool_messages(result: Any) -> list[ToolMessage]:
    """The ToolMessages a finished task wrote, from a `tasks` stream result: {"messages": …}
    holds one write (a message or a list) or several as {"$writes": [...]}."""
    written = result.get("messages") if isinstance(result, dict) else None
    if isinstance(written, dict):
        written = written.get("$writes", [])
    found: list[ToolMessage] = []
    for item in written if isinstance(written, list) else [written]:
        for message in item if isinstance(item, list) else [item]:
            if isinstance(message, ToolMessage):
                found.append(message)
    return found


def memory_note(results: Iterable[ToolMessage]) -> str | None:
    """One line per memory decision ("Saved: …", "Not saved: …", "Forgotten: …").

    Only the memory tools' artifacts count (graphs.assistant.tools.memory_result): they are
    set by code after its checks. The model's reply, its tool arguments and error texts never
    reach the note, so the note cannot be made to claim a write that did not happen.
    """
    lines: list[str] = []
    for message in results:
        line = memory_note_text(message)
        if line and line not in lines:
            lines.append(line)
    return "\n".join(f"{NOTE_PREFIX}{line}" for line in lines) or None


def memory_note_text(message: ToolMessage) -> str | None:
    """The code's verdict a memory tool attached to its answer ("Not saved: …"), escaped."""
    artifact = message.artifact
    if not isinstance(artifact, dict) or artifact.get("kind") != "memory":
        return None
    return plain(str(artifact.get("note", "")).strip()) or None


def plain(text: str) -> str:
    """Markdown-escaped: a fact's text shows as typed, never as a link or an image."""
    return _MARKDOWN_RE.sub(r"\\\1", " ".join(text.split()))


CATEGORY_LABELS: dict[str, str] = {
    "profile": "Profile",
    "preference": "Preferences",
    "fact": "Facts",
    "relationship": "Relationships",
    "work": "Work",
    "health": "Health (sensitive)",
    "religion": "Religion (sensitive)",
    "politics": "Politics (sensitive)",
    "sexuality": "Sexuality (sensitive)",
    "finance_sensitive": "Finance (sensitive)",
    "other": "Other",
}
"""What the page calls each category of graphs/memory/policy.py (a test keeps them in step)."""


def category_label(key: str) -> str:
    """The page's name for a category key; a key the policy does not know reads as "Other"."""
    return CATEGORY_LABELS.get(key, CATEGORY_LABELS["other"])
