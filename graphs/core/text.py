"""Control characters out of model text before it is stored or shown (Postgres refuses NUL)."""

from __future__ import annotations

import re

_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
"""C0 and C1 controls except tab, newline and carriage return, and DEL."""
_BIDI = re.compile("[\u202a-\u202e\u2066-\u2069]")
"""The bidi embeddings, overrides and isolates that make text read otherwise than it holds."""


def without_controls(text: str) -> str:
    """text without control characters: NUL fails every Postgres text and jsonb write, an
    escape sequence rewrites a log line, a bidi override reverses what a reader sees.

    A control becomes a space and a bidi mark goes, as the memory checks' folding treats them
    (graphs.memory.policy.normalise_fact), so cleaning never makes a forgotten fact look new.
    """
    if not has_controls(text):
        return text
    return _BIDI.sub("", _CONTROL.sub(" ", text))


def has_controls(text: str) -> bool:
    return _CONTROL.search(text) is not None or _BIDI.search(text) is not None
