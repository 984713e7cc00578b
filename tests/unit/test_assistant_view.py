"""The Assistant's steps explain the turn: what recall used, which tool ran with what, what code decided."""

from __future__ import annotations

from typing import Any

import chainlit as cl
import pytest
from langchain_core.messages import AIMessage
from langchain_core.messages.tool import tool_call

from tests.fakes import ScriptedChatModel
from tests.unit.test_runner import RecordingSurface, make_runner, send
from ui.agents.assistant import SPEC as ASSISTANT
from ui.chainlit.agents import assistant
from ui.chainlit.agents.assistant import AssistantView, recall_output

shown: list[Any] = []


class FakeStep:
    def __init__(self, name: str = "", type: str = "", **_: Any) -> None:
        self.name, self.type, self.input, self.output, self.is_error = name, type, "", "", False
        self.language = None

    async def send(self) -> FakeStep:
        shown.append(("step", self))
        return self

    async def update(self) -> None:
        return None


class FakeMessage:
    def __init__(self, content: str = "", author: str = "", **_: Any) -> None:
        self.content, self.author = content, author

    async def stream_token(self, text: str) -> None:
        if not self.content:
            shown.append(("reply", self))
        self.content += text

    async def send(self) -> FakeMessage:
        if ("reply", self) not in shown:
            shown.append(("message", self))
        return self


@pytest.fixture(autouse=True)
def fake_chat(monkeypatch):
    shown.clear()
    monkeypatch.setattr(cl, "Step", FakeStep)
    monkeypatch.setattr(cl, "Message", FakeMessage)
    monkeypatch.setattr(assistant, "new_reply", lambda **_: FakeMessage())


class ChatSpecSurface(RecordingSurface):
    def view(self, spec: Any, context: Any) -> Any:
        return AssistantView()


def steps() -> list[FakeStep]:
    return [item for kind, item in shown if kind == "step"]


async def test_each_tool_step_shows_the_tool_its_arguments_and_the_codes_verdict():
    card = "User's card number is 4111 1111 1111 1111"
    model = ScriptedChatModel(
        [
            AIMessage(
                "",
                tool_calls=[
                    tool_call(name="remember", args={"fact": card, "category": "fact"}, id="c1")
                ],
            ),
            "I will remember that.",
        ]
    )
    runner = make_runner(ASSISTANT, model=model)

    await send(runner, ChatSpecSurface(), "remember that my card number is 4111 1111 1111 1111")

    names = [s.name for s in steps()]
    assert names == ["Memory recall", "Thinking", "remember", "Thinking"]
    recall, first, tool, _second = steps()
    assert recall.output == "Nothing relevant."
    assert first.output == "Asked to use: remember"
    assert '"category": "fact"' in tool.input
    assert tool.output.startswith("Not saved: it looks like a password, code, card")
    # The reply comes after every step that led to it, then the code's memory note.
    kinds = [kind for kind, _ in shown]
    assert kinds.index("reply") > max(i for i, k in enumerate(kinds) if k == "step")
    assert shown[-1][1].content.startswith("Memory: Not saved")


def test_recall_lists_the_facts_it_used_each_linking_to_the_memory_page():
    text = recall_output(
        [
            {"key": "k/1", "content": "Allergic to peanuts"},
            {"key": "k2", "content": "[x](http://e)"},
        ]
    )
    assert text.startswith("Used 2 fact(s) from memory:")
    assert "- [Allergic to peanuts](/memory#memory-k%2F1)" in text
    assert "](http://e)" not in text  # a fact's text is shown as typed, never as a link
    assert recall_output([]) == "Nothing relevant."


async def test_the_sensitive_memory_question_names_the_category_as_people_read_it(monkeypatch):
    asked: list[str] = []

    async def ask(_id: str, _thread: str, text: str, _choices: dict[str, str]) -> None:
        asked.append(text)

    monkeypatch.setattr(assistant, "ask_question", ask)
    pending = type("Pending", (), {"id": "i-1"})()
    pending.value = {
        "kind": "confirm_memory",
        "content": "My salary is 90k",
        "category": "finance_sensitive",
    }
    await assistant.show_confirm_memory(pending, "t-1")
    pending.value = {"kind": "confirm_memory", "content": "x", "category": "<b>made up</b>"}
    await assistant.show_confirm_memory(pending, "t-1")

    assert "Category: Finance (sensitive)." in asked[0]
    assert "finance_sensitive" not in asked[0]
    assert "Category: Other." in asked[1]


async def test_in_a_temporary_chat_the_recall_step_says_memory_is_off(fake_chat):
    from graphs.core.context import Context

    view = assistant.PRESENTATION.view(Context(user_id="u", thread_id="t", memory=False))
    await view.task((), {"id": "r1", "name": "recall_memories", "input": {}, "triggers": []})
    await view.task((), {"id": "r1", "name": "recall_memories", "result": {"recalled": []}})
    on = assistant.PRESENTATION.view(Context(user_id="u", thread_id="t2", memory=True))
    await on.task((), {"id": "r2", "name": "recall_memories", "input": {}, "triggers": []})
    await on.task((), {"id": "r2", "name": "recall_memories", "result": {"recalled": []}})

    steps = [item for kind, item in shown if kind == "step"]
    assert [s.output for s in steps[-2:]] == [assistant.MEMORY_OFF, "Nothing relevant."]
