"""Sidebar titles are plain text: a first message's Markdown is not printed as typed."""

from __future__ import annotations

import pytest

from ui.chainlit.data_layer import plain_title


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("# **Plan** my _week_ `now`", "Plan my week now"),
        ("see [the docs](https://example.com) and ![a cat](cat.png)", "see the docs and a cat"),
        ("> quoted | table", "quoted table"),
        ("C# notes", "C# notes"),
        ("***", "New conversation"),
        ("x" * 300, "x" * 100),
    ],
)
def test_a_conversation_title_is_plain_text(name: str, shown: str) -> None:
    assert plain_title(name) == shown
