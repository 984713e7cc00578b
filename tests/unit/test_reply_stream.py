"""A streamed reply's tokens are coalesced per window, and nothing held is sent after the end."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from chainlit.context import init_http_context

from ui.chainlit import surface
from ui.chainlit.surface import STREAM_WINDOW_S, new_reply

WORDS = [f"w{i} " for i in range(30)]


class Emitter:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    async def stream_start(self, step: dict[str, Any]) -> None:
        self.events.append(("start", step["output"]))

    async def send_token(self, id: str, token: str, is_sequence: bool = False) -> None:
        self.events.append(("sequence" if is_sequence else "token", token))

    async def send_step(self, step: dict[str, Any]) -> None:
        self.events.append(("send", step["output"]))

    async def update_step(self, step: dict[str, Any]) -> None:
        self.events.append(("update", step["output"]))

    def shown(self) -> str:
        """What the browser shows, built from the stream as Chainlit's client builds it."""
        text = ""
        for kind, value in self.events:
            text = value if kind in ("start", "sequence", "send", "update") else text + value
        return text


@pytest.fixture
def chainlit_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("chainlit.message.get_data_layer", lambda: None)


def listen() -> Emitter:
    """A fake emitter in this task's Chainlit context (contexts are per task)."""
    fake = Emitter()
    init_http_context().emitter = fake  # type: ignore[assignment]
    return fake


async def test_a_burst_goes_out_as_the_first_token_then_one_message(chainlit_off: None) -> None:
    emitter = listen()
    reply = new_reply()
    for word in WORDS:
        await reply.stream_token(word)
    assert emitter.events == [("start", "w0 ")], "only the first token may go out at once"
    assert reply.content == "".join(WORDS)
    await asyncio.sleep(STREAM_WINDOW_S * 3)
    assert [kind for kind, _ in emitter.events] == ["start", "token"]
    assert emitter.shown() == "".join(WORDS)


async def test_tokens_further_apart_than_the_window_each_go_at_once(chainlit_off: None) -> None:
    emitter = listen()
    reply = new_reply()
    for word in WORDS[:4]:
        await reply.stream_token(word)
        await asyncio.sleep(STREAM_WINDOW_S * 1.5)
    assert emitter.events == [("start", "w0 ")] + [("token", w) for w in WORDS[1:4]]


async def test_the_final_send_carries_what_was_held_and_nothing_follows(chainlit_off: None) -> None:
    emitter = listen()
    reply = new_reply()
    for word in WORDS:
        await reply.stream_token(word)
    await reply.send()
    await asyncio.sleep(STREAM_WINDOW_S * 3)
    assert emitter.events[-1] == ("send", "".join(WORDS))
    assert [kind for kind, _ in emitter.events] == ["start", "send"]


async def test_replaced_content_is_not_followed_by_stale_tokens(chainlit_off: None) -> None:
    emitter = listen()
    reply = new_reply()
    for word in WORDS:
        await reply.stream_token(word)
    reply.content = "The final answer."
    await reply.update()
    await asyncio.sleep(STREAM_WINDOW_S * 3)
    assert emitter.events[-1] == ("update", "The final answer.")
    assert emitter.shown() == "The final answer."


async def test_a_sequence_replaces_what_was_held(chainlit_off: None) -> None:
    emitter = listen()
    reply = new_reply()
    for word in WORDS[:5]:
        await reply.stream_token(word)
    await reply.stream_token("Replaced.", is_sequence=True)
    await asyncio.sleep(STREAM_WINDOW_S * 3)
    assert emitter.shown() == "Replaced." == reply.content


def test_the_window_is_short_enough_to_read_as_streaming() -> None:
    assert 0 < surface.STREAM_WINDOW_S <= 0.1
