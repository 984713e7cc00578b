"""The Planner's chat pieces: button payloads, edits, the review text and charts."""

from __future__ import annotations

from typing import Any

import chainlit as cl
import pytest

from graphs.planner.sql import Table
from ui.agents.planner import edit_value
from ui.chainlit.actions import ActionRejected, AnswerPayload, parse_payload
from ui.chainlit.agents.planner import bar_chart, review_text

THREAD = "thread-of-this-session"


def press(payload: dict[str, Any]) -> cl.Action:
    return cl.Action(name="answer", payload=payload, label="Approve")


def test_a_press_on_this_threads_plan_is_accepted():
    payload = {"thread_id": THREAD, "interrupt_id": "i-1", "decision": "approve"}
    parsed = parse_payload(AnswerPayload, press(payload), thread_id=THREAD)
    assert parsed.decision == "approve"


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (
            {"thread_id": "another-users-thread", "interrupt_id": "i", "decision": "approve"},
            "another conversation",
        ),
        (
            {"thread_id": THREAD, "interrupt_id": "i", "decision": "approve", "user_id": "bob"},
            "malformed",
        ),
        ({"thread_id": THREAD, "decision": "approve"}, "malformed"),
    ],
    ids=["foreign-thread", "client-identity", "no-interrupt"],
)
def test_foreign_or_malformed_presses_are_refused(payload, match):
    with pytest.raises(ActionRejected, match=match):
        parse_payload(AnswerPayload, press(payload), thread_id=THREAD)


def test_an_edited_list_becomes_steps_and_a_sentence_becomes_feedback():
    assert edit_value("1. List tables\n2) Count churn by region\n\n- Chart it") == {
        "decision": "edit",
        "steps": ["List tables", "Count churn by region", "Chart it"],
    }
    assert edit_value("Only look at EMEA please") == {
        "decision": "edit",
        "feedback": "Only look at EMEA please",
    }


def test_the_review_shows_budget_estimate_and_problems():
    text = review_text(
        {
            "goal": "churn?",
            "plan": ["a", "b"],
            "step_budget": 6,
            "estimated_model_calls": 9,
            "edits_left": 0,
            "error": "No edits are left for this plan; approve or reject it.",
            "replanned": True,
        }
    )
    assert "1. a\n2. b" in text
    assert "Step budget: 6 steps · about 9 model calls · 0 edits left" in text
    assert "No edits are left" in text
    assert "added steps that were not in the plan you approved" in text


def test_numbers_by_category_become_a_bar_chart():
    table = Table(["region", "churned", "lost_mrr"], [["EMEA", "5", "1,200"], ["APAC", "3", "900"]])
    figure = bar_chart(table)
    assert figure is not None
    assert list(figure.data[0].x) == ["EMEA", "APAC"]
    assert list(figure.data[0].y) == [5.0, 3.0]
    assert figure.layout.title.text == "churned by region"
    assert bar_chart(Table(["region", "note"], [["EMEA", "high"], ["APAC", "low"]])) is None
    assert bar_chart(Table(["region", "n"], [["EMEA", "5"]])) is None  # one bar is no chart


def test_the_answer_streams_out_of_the_replanners_json():
    from ui.chainlit.agents.planner import AnswerStream

    stream = AnswerStream()
    tokens = ['{"action": {"resp', 'onse": "EMEA ', "had the ", "most churn", ' (5)."}}']
    pieces = [stream.feed("m1", t) for t in tokens]
    assert "".join(pieces) == "EMEA had the most churn (5)."
    assert pieces[0] == ""
    # A Plan decision streams nothing; a new model call starts afresh.
    assert stream.feed("m2", '{"action": {"steps": ["Count churn"]}}') == ""
    assert stream.feed("m3", '{"action": {"response": "Done"}}') == "Done"


def test_the_analyst_connects_as_its_own_role_without_the_apps_password():
    from psycopg.conninfo import conninfo_to_dict

    from graphs.planner.sql import ANALYST_ROLE, analyst_url

    embedded = conninfo_to_dict(analyst_url("postgresql://postgres:@/cairn?host=/data/pg"))
    assert embedded["user"] == ANALYST_ROLE
    assert embedded["host"] == "/data/pg"
    assert embedded["dbname"] == "cairn"
    remote = conninfo_to_dict(analyst_url("postgresql://app:s3cret@db.internal:5432/cairn"))
    assert remote["user"] == ANALYST_ROLE
    assert "password" not in remote
