"""Action-button payloads: schema-checked, and only ever about the session's own thread."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import chainlit as cl
import pytest

from ui.chainlit.actions import ActionRejected, RetryPayload, parse_payload

SESSION_THREAD = "thread-of-this-session"


def retry(payload: dict[str, Any]) -> cl.Action:
    return cl.Action(name="retry", payload=payload, label="Retry")


def test_a_good_payload_is_parsed() -> None:
    parsed = parse_payload(
        RetryPayload, retry({"thread_id": SESSION_THREAD}), thread_id=SESSION_THREAD
    )

    assert parsed == RetryPayload(thread_id=SESSION_THREAD)


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"thread_id": SESSION_THREAD, "user_id": "someone-else"},
        {"thread_id": 42},
        {"thread_id": None},
        {"thread_id": [SESSION_THREAD]},
    ],
    ids=["missing-field", "extra-field", "number", "null", "list"],
)
def test_a_malformed_payload_is_rejected(payload: dict[str, Any]) -> None:
    with pytest.raises(ActionRejected, match="malformed"):
        parse_payload(RetryPayload, retry(payload), thread_id=SESSION_THREAD)


@pytest.mark.parametrize("payload", ["retry", [SESSION_THREAD], None, 7], ids=str)
def test_a_payload_that_is_not_an_object_is_rejected(payload: object) -> None:
    # cl.Action refuses non-dict payloads itself; a raw socket message might not.
    action = SimpleNamespace(name="retry", payload=payload)

    with pytest.raises(ActionRejected, match="malformed"):
        parse_payload(RetryPayload, action, thread_id=SESSION_THREAD)  # type: ignore[arg-type]


def test_a_payload_for_another_thread_is_rejected() -> None:
    with pytest.raises(ActionRejected, match="another conversation"):
        parse_payload(
            RetryPayload, retry({"thread_id": "someone-elses-thread"}), thread_id=SESSION_THREAD
        )


def test_rejections_are_logged_as_security_events(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="cairn.security"), pytest.raises(ActionRejected):
        parse_payload(RetryPayload, retry({"thread_id": "elsewhere"}), thread_id=SESSION_THREAD)

    assert any(record.name == "cairn.security" for record in caplog.records)
