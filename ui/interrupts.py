"""Paused runs in the chat: an interrupt becomes buttons; a press resumes it with Command(resume=...)."""

from __future__ import annotations

from typing import Any, Literal

import chainlit as cl
from pydantic import BaseModel, ConfigDict

RESUME_ACTION = "resume"


class ResumePayload(BaseModel):
    """A button press answering one pending interrupt of the session's thread."""

    model_config = ConfigDict(extra="forbid")

    thread_id: str
    interrupt_id: str
    decision: Literal["confirm", "reject"]


def _buttons(thread_id: str, interrupt_id: str, labels: dict[str, str]) -> list[cl.Action]:
    return [
        cl.Action(
            name=RESUME_ACTION,
            label=label,
            payload={"thread_id": thread_id, "interrupt_id": interrupt_id, "decision": decision},
        )
        for decision, label in labels.items()
    ]


async def show_interrupt(interrupt: Any, *, thread_id: str) -> None:
    """Render a pending interrupt as a question with buttons (again after a restart too)."""
    value = interrupt.value if isinstance(interrupt.value, dict) else {}
    if value.get("kind") == "review_plan":
        from ui.research import show_plan_review

        await show_plan_review(interrupt, thread_id=thread_id)
        return
    if value.get("kind") == "confirm_memory":
        text = (
            "You asked me to remember something sensitive. Should I store it?\n\n"
            f"> {value.get('content', '')}\n\n"
            f"Category: {value.get('category', 'unknown')}. You can delete it any time."
        )
        labels = {"confirm": "Remember it", "reject": "Don't store it"}
    else:
        text = "The assistant is waiting for your answer."
        labels = {"confirm": "Continue", "reject": "Cancel"}
    message = cl.Message(
        content=text, author="Cairn", actions=_buttons(thread_id, interrupt.id, labels)
    )
    await message.send()
    prompts: dict[str, cl.Message] = cl.user_session.get("interrupt_prompts") or {}
    prompts[interrupt.id] = message
    cl.user_session.set("interrupt_prompts", prompts)


async def clear_prompt(interrupt_id: str) -> None:
    prompts: dict[str, cl.Message] = cl.user_session.get("interrupt_prompts") or {}
    if (message := prompts.pop(interrupt_id, None)) is not None:
        await message.remove_actions()
