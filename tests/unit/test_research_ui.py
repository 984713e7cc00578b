"""Plan-review answers are validated before they resume anything; corpus citations become openable links."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from graphs.research.graph import PlanDecision, plan_from
from ui.agents.research import parse_topics, served_links
from ui.chainlit.actions import AnswerPayload


def test_edited_topics_are_one_per_line_with_list_markers_dropped():
    assert parse_topics("1. Seed vault opening\n\n- Bee dances\n  * Pollination value  ") == [
        "Seed vault opening",
        "Bee dances",
        "Pollination value",
    ]


@pytest.mark.parametrize(
    "answer",
    [
        {"decision": "sure"},
        {"decision": "approve", "user_id": "bob"},
        {"decision": "edit", "todos": ["ok topic", "x"]},
        {"decision": "edit", "todos": ["a topic"] * 9},
        {"decision": "reject", "reason": "r" * 501},
        "approve",
    ],
)
def test_malformed_plan_answers_are_refused(answer):
    with pytest.raises(ValidationError):
        PlanDecision.model_validate(answer)


def test_button_payload_is_a_closed_schema():
    ok = {"thread_id": "t", "interrupt_id": "i", "decision": "edit"}
    assert AnswerPayload.model_validate(ok).decision == "edit"
    with pytest.raises(ValidationError):
        AnswerPayload.model_validate({**ok, "todos": ["injected"]})


def test_an_invalid_plan_from_the_model_falls_back_to_the_question():
    class Reply:
        tool_calls = [{"name": "write_todos", "args": {"todos": [{"content": "x"}]}}]

    assert plan_from(Reply(), "What is the vault?") == [
        {"content": "What is the vault?", "status": "pending"}
    ]


def test_corpus_citations_link_to_where_the_app_serves_them():
    report = '- Opened ["The vault opened in 2008 exactly"](corpus://sample/seed-vault-overview.md) and ["x y z w v u t"](https://example.org/a)'
    shown = served_links(report, "https://cairn.example")
    assert "](https://cairn.example/research/corpus/sample/seed-vault-overview.md)" in shown
    assert "](https://example.org/a)" in shown
