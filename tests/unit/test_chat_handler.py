"""Chat events fail closed: an unexpected error shows a fixed text, never the exception's own."""

from __future__ import annotations

import pytest

from auth.sessions import SessionRevoked
from ui.chainlit import chat


@pytest.fixture
def shown(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    texts: list[str] = []

    async def refuse(text: str) -> None:
        texts.append(text)

    monkeypatch.setattr(chat, "refuse", refuse)
    return texts


async def test_an_unexpected_error_shows_a_fixed_message(shown: list[str]) -> None:
    @chat.chat_handler
    async def handler(payload: object) -> None:
        raise KeyError("id")  # what a malformed frame raised deep inside a handler

    await handler({"not": "a message"})

    assert shown == [chat.HANDLER_FAILED]
    assert "id" not in shown[0].split()


async def test_an_ended_session_gets_its_notice(shown: list[str]) -> None:
    @chat.chat_handler
    async def handler() -> None:
        raise SessionRevoked("You were signed out.")

    await handler()

    assert shown == ["You were signed out."]
