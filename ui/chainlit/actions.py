"""Action-button payloads: validated by schema and by the session before they change anything."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

if TYPE_CHECKING:
    import chainlit as cl

log = logging.getLogger("cairn.security")

Payload = TypeVar("Payload", bound=BaseModel)

ANSWER_ACTION = "answer"
"""Every button under a paused run (its decision says which)."""
RETRY_ACTION = "retry"


class ActionRejected(ValueError):
    """A button press that cannot be honoured; the text is shown to the user."""


class RetryPayload(BaseModel):
    """Re-run the last turn of a thread after the model failed, or send again the message
    that failed while the database was away (its id: the text is read from the stored
    conversation, never from the payload)."""

    model_config = ConfigDict(extra="forbid")

    thread_id: str
    message_id: str | None = Field(default=None, max_length=100)


class AnswerPayload(BaseModel):
    """A button press answering one pending question of the session's thread. Which decisions
    are allowed depends on the question; the runner checks that against the checkpoint."""

    model_config = ConfigDict(extra="forbid")

    thread_id: str
    interrupt_id: str = Field(max_length=200)
    decision: str = Field(max_length=40)


def parse_payload(model: type[Payload], action: cl.Action, *, thread_id: str) -> Payload:
    """Schema-check a payload and make sure it speaks about the session's own thread."""
    try:
        payload = model.model_validate(action.payload)
    except ValidationError as exc:
        log.warning("malformed %s payload: %s", action.name, exc.errors(include_input=False))
        msg = "That button's request was malformed and has been ignored."
        raise ActionRejected(msg) from None
    if getattr(payload, "thread_id", thread_id) != thread_id:
        log.warning("refused: %s payload for a thread other than the session's", action.name)
        msg = "That button belongs to another conversation."
        raise ActionRejected(msg)
    return payload
