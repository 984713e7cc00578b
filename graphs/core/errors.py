"""Refusals every layer raises or catches the same way."""

from __future__ import annotations

NOT_FOUND = "Conversation not found"


class ThreadNotFound(LookupError):
    """Unknown or someone else's thread: the same refusal, so existence is never revealed.

    Raised by the ownership checks (auth/ownership.py) and by the privacy workflows
    (graphs/memory/privacy.py), which sit below auth and so cannot import it from there."""

    def __init__(self) -> None:
        super().__init__(NOT_FOUND)
