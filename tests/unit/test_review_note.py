"""The line a requester reads about a reviewer's decision: who, what, when; the name as text."""

from __future__ import annotations

from datetime import UTC, datetime

from auth.reviews import Review
from ui.recovery import note_for


def review(status: str) -> Review:
    at = datetime(2026, 12, 4, 18, 5, tzinfo=UTC)
    return Review("rv-1", "w-1", "t-1", "i-1", "planner", "u-1", "Bob", {}, status, "u-2", at, at)


def test_the_note_says_who_decided_what_and_when() -> None:
    assert note_for(review("approve"), "Carol") == (
        "Approved by Carol (reviewer) on 2026-12-04 18:05 UTC."
    )
    assert note_for(review("reject"), "Carol").startswith("Rejected by Carol")
    assert note_for(review("edit"), "Carol").startswith("Edited by Carol")


def test_a_reviewers_name_never_becomes_markup_in_the_chat() -> None:
    hostile = "[click me](https://evil.example/?steal=1) <img src=x> **loud**"
    shown = note_for(review("approve"), hostile)
    assert "\\[click me\\]\\(https://evil.example/?steal=1\\)" in shown
    assert "\\<img src=x\\>" in shown
    assert "\\*\\*loud\\*\\*" in shown
    # A toast is plain text: the name as given.
    assert hostile in note_for(review("approve"), hostile, markdown=False)
