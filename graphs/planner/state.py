"""State of the Planner graph, and the structured outputs its planner and replanner return."""

from __future__ import annotations

import operator
from typing import Annotated, Any, Literal, TypedDict

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)

from graphs.core.text import without_controls

MAX_STEP_CHARS = 500
"""The longest step a plan may hold, whoever wrote it (the reviewer or the model)."""
MAX_EDITED_STEPS = 12

StepRecord = tuple[int, str, str]
"""(index, step, result): one executed step. Indices count from 1 and are contiguous."""

Outcome = Literal["answered", "partial", "rejected", "failed"]


class State(TypedDict, total=False):
    """One goal at a time per thread; a new message starts a new goal (start_goal resets)."""

    input: str
    """The goal, as the user wrote it."""
    plan: list[str]
    """Remaining steps. No reducer: the replanner's list replaces it."""
    approved_plan: list[str]
    """The steps the reviewer approved last; replans are compared against them."""
    approved_steps: list[str]
    """Every step the reviewer approved for this goal, over all reviews: only these steps
    may go into the plan summary that later plans see as examples."""
    past_steps: Annotated[list[StepRecord], operator.add]
    """Append-only history: the executor returns exactly one new record per step."""
    response: str
    """Set when the run has its answer; routing ends the run."""
    plan_feedback: str
    """The reviewer's edit, read by the planner when it redrafts."""
    steps_taken: int
    """Executed steps, checked against the step budget."""
    review_rounds: int
    """Edits sent back to the planner so far."""
    needs_review: bool
    """The replanner added steps unrelated to the approved plan: review again before running."""
    outcome: Outcome
    """How the run ended, stored with the plan summary."""


def _bounded_step(step: str) -> str:
    # Checked in code, not in the JSON schema the model sees: a 10,000-character "step" is
    # refused (and the call retried once) instead of reaching the review or the executor.
    # Control characters go first, so the reviewer approves the text that is kept.
    step = without_controls(step)
    if not step.strip() or len(step) > MAX_STEP_CHARS:
        msg = f"each step must be 1 to {MAX_STEP_CHARS} characters"
        raise ValueError(msg)
    return step


class Plan(BaseModel):
    """An ordered list of steps that together answer the goal."""

    steps: list[Annotated[str, AfterValidator(_bounded_step)]] = Field(
        description="Short, ordered steps (at most 6). Each step must be self-contained: the "
        "executor sees one step at a time, so name tables, columns, time ranges and regions "
        "explicitly; never write 'do the same for ...'. Do not include steps already "
        "completed in past_steps.",
    )


class Response(BaseModel):
    """The final answer to the goal."""

    response: Annotated[str, AfterValidator(without_controls)] = Field(
        description="The answer for the user, with the key figures from past_steps copied "
        "verbatim. Respond only when past_steps contain enough evidence to answer the goal."
    )


class Act(BaseModel):
    """The replanner's one decision: the remaining steps, or the final answer."""

    action: Plan | Response = Field(
        description="Response when the goal can be answered from past_steps; otherwise a Plan "
        "that lists ONLY the remaining steps (never the completed ones)."
    )


class ReviewDecision(BaseModel):
    """A reviewer's answer to the plan-review interrupt; anything else is refused."""

    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "edit", "reject"]
    steps: (
        list[
            Annotated[
                str,
                StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_STEP_CHARS),
            ]
        ]
        | None
    ) = Field(default=None, max_length=MAX_EDITED_STEPS)
    """Edit: the reviewer's own steps. They become the plan verbatim; no model rewrites them."""
    feedback: str | None = Field(default=None, max_length=2000)
    """Edit: what to change, in the reviewer's words; the planner model redrafts from it."""

    @model_validator(mode="after")
    def _edit_says_what(self) -> ReviewDecision:
        has_feedback = bool((self.feedback or "").strip())
        if self.decision == "edit" and not (self.steps or has_feedback):
            msg = "an edit needs new steps or feedback"
            raise ValueError(msg)
        if self.steps and has_feedback:
            # Which one would win is exactly what must never be guessed: steps are the plan
            # verbatim, feedback is advice for a redraft. An edit says one or the other.
            msg = "an edit sends either steps or feedback, not both"
            raise ValueError(msg)
        return self


def step_parts(record: Any) -> StepRecord:
    """A past_steps entry as (index, step, result); checkpoints may hand back lists."""
    index, step, result = record
    return int(index), str(step), str(result)


def step_failed(result: str) -> bool:
    """A step's result says it failed: code puts ERROR first (graph.step_result)."""
    return result.startswith("ERROR")
