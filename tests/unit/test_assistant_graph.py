"""Assistant graph: the checkpoint keeps the whole conversation, the model sees a trimmed window."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langgraph.checkpoint.memory import InMemorySaver

from graphs.assistant.graph import MAX_STATE_MESSAGES, build_graph
from graphs.assistant.prompts import SYSTEM_PROMPT
from graphs.core.context import Context
from tests.fakes import ScriptedChatModel


def run_config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}


async def ask(graph: Any, text: str, *, thread_id: str = "t1") -> dict[str, Any]:
    return await graph.ainvoke(
        {"messages": [HumanMessage(text)]},
        run_config(thread_id),
        context=Context(user_id="u1", thread_id=thread_id),
    )


def long_history(pairs: int, chars: int) -> list[BaseMessage]:
    history: list[BaseMessage] = []
    for i in range(pairs):
        history.append(HumanMessage(f"question {i} " + "q" * chars))
        history.append(AIMessage(f"answer {i} " + "a" * (chars * 2)))
    return history


async def test_two_turns_on_one_thread_keep_four_messages() -> None:
    model = ScriptedChatModel(["Hello Alice.", "You said your name is Alice."])
    graph = build_graph(checkpointer=InMemorySaver(), store=None, model=model)

    await ask(graph, "Hi, I'm Alice.")
    await ask(graph, "What is my name?")

    state = await graph.aget_state(run_config("t1"))
    messages = state.values["messages"]
    assert [type(m) for m in messages] == [HumanMessage, AIMessage, HumanMessage, AIMessage]
    assert [m.text for m in messages] == [
        "Hi, I'm Alice.",
        "Hello Alice.",
        "What is my name?",
        "You said your name is Alice.",
    ]


async def test_threads_do_not_share_history() -> None:
    model = ScriptedChatModel(["one", "two"])
    graph = build_graph(checkpointer=InMemorySaver(), store=None, model=model)

    await ask(graph, "secret for thread A", thread_id="a")
    await ask(graph, "hello from thread B", thread_id="b")

    seen_in_b = " ".join(str(m.text) for m in model.seen[1])
    assert "secret for thread A" not in seen_in_b


async def test_the_model_sees_the_system_prompt_first_then_the_conversation() -> None:
    model = ScriptedChatModel(["first", "second"])
    graph = build_graph(checkpointer=InMemorySaver(), store=None, model=model)

    await ask(graph, "one")
    await ask(graph, "two")

    for call in model.seen:
        assert isinstance(call[0], SystemMessage)
        # The prompt may end with per-turn data (recalled memories); its fixed part comes first.
        assert call[0].text.startswith(SYSTEM_PROMPT.split("{", 1)[0])
        assert sum(isinstance(m, SystemMessage) for m in call) == 1
    assert [m.text for m in model.seen[1][1:]] == ["one", "first", "two"]


async def test_a_long_history_is_trimmed_for_the_model_but_kept_in_the_checkpoint_history() -> None:
    model = ScriptedChatModel(["short answer"])
    graph = build_graph(checkpointer=InMemorySaver(), store=None, model=model)
    history = long_history(pairs=40, chars=1000)  # ~30,000 tokens, far over the window

    await graph.ainvoke(
        {"messages": [*history, HumanMessage("and the latest question?")]},
        run_config("long"),
        context=Context(user_id="u1", thread_id="long"),
    )

    window = model.seen[0][1:]
    state = await graph.aget_state(run_config("long"))
    # The live state keeps whole recent turns only; the rest stays in the checkpoint history.
    live = state.values["messages"]
    assert len(live) <= MAX_STATE_MESSAGES
    assert isinstance(live[0], HumanMessage)
    assert live[-1].text == "short answer"
    earlier = [s async for s in graph.aget_state_history(run_config("long"))]
    assert any(
        history[0].id in {m.id for m in snapshot.values.get("messages", [])} for snapshot in earlier
    )
    assert 0 < len(window) < len(history)
    assert isinstance(window[0], HumanMessage)
    assert window[-1].text == "and the latest question?"
    # The window is the most recent part of the conversation, in order.
    kept = [m.id for m in live[-1 - len(window) : -1]]
    assert [m.id for m in window] == kept


async def test_an_oversized_latest_message_still_reaches_the_model() -> None:
    # A message plus a few 8,000-character attachments (each allowed by ui/input.py) is more
    # than the model window on its own; trimming must not drop the question being asked.
    model = ScriptedChatModel(["answer"])
    graph = build_graph(checkpointer=InMemorySaver(), store=None, model=model)
    huge = "Please summarise the attached notes.\n" + "notes " * 6000  # ~36,000 chars

    await ask(graph, huge, thread_id="huge")

    window = model.seen[0][1:]
    assert any(isinstance(m, HumanMessage) for m in window)
    assert str(window[-1].text).startswith("Please summarise the attached notes.")


@pytest.mark.parametrize(
    ("user_id", "thread_id"),
    [("", "t1"), ("u1", ""), ("", "")],
    ids=["no-user", "no-thread", "none"],
)
def test_context_requires_user_and_thread(user_id: str, thread_id: str) -> None:
    with pytest.raises(ValueError, match="user_id and thread_id"):
        Context(user_id=user_id, thread_id=thread_id)


def test_context_is_immutable() -> None:
    context = Context(user_id="u1", thread_id="t1")

    with pytest.raises(AttributeError):
        context.user_id = "u2"  # type: ignore[misc]
