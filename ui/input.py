"""Checks on what users send, before anything is stored or run."""

from __future__ import annotations

import fnmatch
import html
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graphs.core.settings import Settings

TEXT_MIME_PATTERNS = ("text/*",)


class InputRejected(ValueError):
    """A message or upload the app refuses; the text is shown to the user as is."""


@dataclass(frozen=True)
class Attachment:
    name: str
    text: str


def check_text(content: str, *, max_chars: int, attached: bool = False) -> None:
    """Refuse an empty (unless files are attached) or oversize message text."""
    if not content.strip() and not attached:
        msg = "Your message is empty. Type something and send it again."
        raise InputRejected(msg)
    if len(content) > max_chars:
        msg = (
            f"Your message is {len(content):,} characters long; the limit is "
            f"{max_chars:,}. Shorten it or attach it as a text file."
        )
        raise InputRejected(msg)


def check_message(content: str, elements: list[Any], settings: Settings) -> list[Attachment]:
    """Refuse empty, oversize or disallowed input; returns the readable attachments."""
    check_text(content, max_chars=settings.max_message_chars, attached=bool(elements))
    if len(elements) > settings.max_upload_files:
        msg = (
            f"Your message has {len(elements)} files attached; the limit is "
            f"{settings.max_upload_files}. Send the rest in another message."
        )
        raise InputRejected(msg)
    return [_read_attachment(element, settings) for element in elements]


def _read_attachment(element: Any, settings: Settings) -> Attachment:
    name = str(getattr(element, "name", "file"))
    mime = str(getattr(element, "mime", "") or "")
    if not any(fnmatch.fnmatch(mime, pattern) for pattern in settings.upload_mime_types):
        msg = f"{name}: files of type {mime or 'unknown'} are not accepted here."
        raise InputRejected(msg)
    path = getattr(element, "path", None)
    size = Path(path).stat().st_size if path else len(getattr(element, "content", b"") or b"")
    if size > settings.max_upload_mb * 1024 * 1024:
        msg = f"{name} is larger than the {settings.max_upload_mb} MB limit."
        raise InputRejected(msg)
    raw = Path(path).read_bytes() if path else bytes(getattr(element, "content", b"") or b"")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        msg = f"{name} is not UTF-8 text."
        raise InputRejected(msg) from None
    if "\x00" in text:
        # Valid UTF-8, but binary: and what the model reads of it may be stored (Postgres
        # text and jsonb hold no NUL).
        msg = f"{name} is not a text file (it contains NUL characters)."
        raise InputRejected(msg)
    if len(text) > settings.max_message_chars:
        msg = (
            f"{name} has {len(text):,} characters of text; attachments are limited to "
            f"{settings.max_message_chars:,}. Attach a shorter excerpt."
        )
        raise InputRejected(msg)
    return Attachment(name=name, text=text)


def compose(content: str, attachments: list[Attachment]) -> str:
    """The user's text followed by each attachment, clearly delimited."""
    parts = [content.strip()]
    for attachment in attachments:
        name = html.escape(attachment.name, quote=True)
        # The file cannot close its own block early.
        body = attachment.text.replace("</attachment>", "</ attachment>")
        parts.append(f'<attachment name="{name}">\n{body}\n</attachment>')
    return "\n\n".join(part for part in parts if part)


MAX_JSON_DEPTH = 64
"""Deeper than any body Cairn or Chainlit takes; Python's parser recurses per level."""
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_JSON_BRACKET = re.compile(rb"[\[\]{}]")


def json_too_deep(raw: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when a JSON text nests arrays and objects deeper than `limit`, read without parsing
    it (tens of thousands of levels make `json.loads` and everything after it recurse out)."""
    depth = 0
    for bracket in _JSON_BRACKET.findall(_JSON_STRING.sub(b"", raw)):
        if bracket in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        else:
            depth = max(depth - 1, 0)
    return False
