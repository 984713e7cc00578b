"""The Planner: plan-and-execute with the plan approved by the user (graphs/planner/)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from graphs.core.settings import get_settings
from graphs.planner.graph import STEP_NODES, build_graph
from ui.runner import AgentSpec, AnswerRejected, InterruptKind, McpTool, Starter

if TYPE_CHECKING:
    from graphs.core.usage import RunUsage
    from ui.runner import Ask


EDIT_TIMEOUT_S = 900


RECURSION_BACKSTOP = (
    "The plan went round in circles and hit its safety limit, so I stopped it. Nothing was "
    "changed anywhere; send the goal again, perhaps narrower, to start a fresh plan."
)


_BULLET = re.compile(r"^\s*(?:\d+[.)]|[-*•])\s+")


def goal_inputs(text: str, _message_id: str = "") -> dict[str, Any]:
    """A chat message to the Planner is a new goal."""
    return {"input": text}


def recursion_limit() -> int:
    """Generous for the step budget and review rounds: a backstop, not the budget."""
    settings = get_settings()
    return 4 * settings.planner_step_budget + 3 * settings.planner_review_rounds + 12


async def review_answer(decision: str, _value: dict[str, Any], ask: Ask) -> dict[str, Any]:
    """The resume value for a checked button press; Edit first asks for the new steps."""
    if decision != "edit":
        return {"decision": decision}
    text = await ask(
        "Send the plan as you want it, one step per line (you can copy the steps above and "
        "change them), or describe what to change.",
        EDIT_TIMEOUT_S,
    )
    if not text:
        msg = "No edit arrived, so the plan is still waiting for your review."
        raise AnswerRejected(msg)
    return edit_value(text)


def edit_value(text: str) -> dict[str, Any]:
    """Several lines or a numbered/bulleted list are the new steps; one sentence is feedback."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) > 1 or any(_BULLET.match(line) for line in lines):
        return {"decision": "edit", "steps": [_BULLET.sub("", line).strip() for line in lines]}
    return {"decision": "edit", "feedback": text}


def low_risk(value: dict[str, Any], max_model_calls: int) -> str | None:
    """Why a pending Planner plan may not be pre-approved, or None when it may.

    The Planner's tools only read (a SELECT-only role), so the risk is cost: only a first
    review of a plan the model drew up, within the step budget and the token's model-call
    budget, with nothing changed since a human last looked, is low-risk.
    """
    if value.get("kind") != "planner_review":
        return "only Planner plans can be pre-approved"
    if value.get("replanned") or value.get("completed"):
        return "the plan changed after steps ran; a person must review it"
    if value.get("error"):
        return "the plan review reported a problem"
    plan = value.get("plan") or []
    if not plan or len(plan) > int(value.get("step_budget") or 0):
        return "the plan is empty or longer than the step budget"
    if int(value.get("estimated_model_calls") or 0) > max_model_calls:
        return "the plan needs more model calls than this token's budget"
    return None


def describe_plan_review(value: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "goal",
        "plan",
        "completed",
        "replanned",
        "step_budget",
        "estimated_model_calls",
        "estimated_tokens",
        "estimated_cost",
    )
    shown = {k: value.get(k) for k in (*keys, "edits_left", "error")}
    shown["edit"] = "the new steps, one per line, or one sentence of feedback"
    return shown


def planner_signals(values: dict[str, Any], usage: RunUsage) -> dict[str, float]:
    """Replans, and whether the run ended at the step budget with a partial answer (finalize
    ran in this run, after the last allowed step)."""
    at_budget = usage.nodes["finalize"] > 0 and (
        values.get("steps_taken", 0) >= get_settings().planner_step_budget
    )
    return {
        "runs": 1,
        "replans": usage.nodes["replan"],
        "step_budget_reached": int(at_budget),
    }


SPEC = AgentSpec(
    key="planner",
    profile="Planner",
    description="Plans an analysis as steps you approve or edit, then runs them with "
    "read-only SQL (on a bundled demo dataset unless configured), replanning as results "
    "come in, and answers with tables and charts.",
    build=build_graph,
    inputs=goal_inputs,
    interrupts=(
        InterruptKind(
            name="planner_review",
            decisions=frozenset({"approve", "edit", "reject"}),
            resume_value=review_answer,
            describe=describe_plan_review,
            reviewable=True,
        ),
    ),
    stream_modes=("messages",),
    recursion_limit=recursion_limit,
    recursion_notice=RECURSION_BACKSTOP,
    reply_text=lambda values: str(values.get("response") or "") or None,
    signals=planner_signals,
    order=20,
    # Questions the bundled demo dataset answers (churn, subscriptions, customers, revenue).
    starters=(
        Starter(
            label="Churn by region", message="Which region had the highest churn last quarter?"
        ),
        Starter(label="Why customers left", message="Why did customers churn last quarter?"),
        Starter(label="Revenue by region", message="What was revenue by region last quarter?"),
    ),
    step_nodes=STEP_NODES,
    mcp=McpTool(
        name="run_planner",
        title="Plan and run an analysis",
        description=(
            "Plan an analysis of the configured data and run it with read-only SQL. The run\n"
            "pauses with the proposed plan (status 'paused') for answer_approval.\n"
            "pre_approve=true approves a low-risk plan at once, if the token's owner allowed\n"
            "that."
        ),
        summary="plans an analysis and runs it with read-only SQL",
        text_arg="goal",
        pre_approve=low_risk,
        pauses=True,
    ),
)
