"""The Planner's behaviour under the offline model: plain rules over the demo data, end to end."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
)
from langchain_core.messages.tool import tool_call

from graphs.core.offline import REPLY_PREFIX, OfflineChatModel
from graphs.planner.sql import markdown_tables
from graphs.planner.state import Act, Plan, Response

CHURN_BY_REGION = (
    "SELECT region, count(*) AS churned_customers, sum(lost_mrr) AS lost_mrr "
    "FROM churn_events WHERE quarter = (SELECT max(quarter) FROM churn_events) "
    "GROUP BY region ORDER BY churned_customers DESC"
)
CHURN_BY_REASON = (
    "SELECT reason, count(*) AS churned_customers FROM churn_events "
    "WHERE quarter = (SELECT max(quarter) FROM churn_events) "
    "GROUP BY reason ORDER BY churned_customers DESC"
)
REVENUE_BY_REGION = (
    "SELECT region, revenue FROM revenue WHERE quarter = (SELECT max(quarter) FROM revenue) "
    "ORDER BY revenue DESC"
)
TABLES = ("churn_events", "subscriptions", "customers", "revenue")
_NUMBERED = re.compile(r"^\d+[.)]\s+(.+?)\s*$")


def draft_plan(goal: str) -> list[str]:
    """A sensible plan for the demo data's usual questions."""
    text = goal.lower()
    steps = ["List the tables available in the analytics database"]
    if "churn" in text:
        steps.append("Describe the columns of the churn_events table")
        steps.append(
            "Count churned customers and lost MRR by region for the latest quarter in churn_events"
        )
        if "why" in text or "reason" in text:
            steps.append("Count churned customers by reason for the latest quarter")
    elif "revenue" in text:
        steps.append("Describe the columns of the revenue table")
        steps.append("Sum revenue by region for the latest quarter in the revenue table")
    else:
        steps.append(f"Find the table that holds data about: {goal[:120]}")
    return steps


def structured_answer(schema: Any, messages: list[BaseMessage]) -> Any:
    """Plan for the planner, Act for the replanner; None for other schemas."""
    system = _system_text(messages)
    if schema is Plan:
        return Plan(steps=_planned_steps(system, _last_human(messages)))
    if schema is Act:
        remaining = _section_steps(system, "Remaining plan:")
        if remaining:
            return Act(action=Plan(steps=remaining))
        return Act(action=Response(response=_answer(system)))
    return None


def route_tools(messages: list[BaseMessage], tool_names: tuple[str, ...]) -> ToolCall | None:
    """One plan step -> the query a careful analyst would run for it."""
    step = str(messages[-1].text).lower()
    call_id = "call_" + hashlib.sha256(f"{len(messages)}:{step}".encode()).hexdigest()[:24]
    call: tuple[str, dict[str, Any]] | None = None
    if "list" in step and "table" in step:
        call = ("list_tables", {})
    elif "describe" in step or "columns" in step:
        table = next((t for t in TABLES if t in step), "churn_events")
        call = ("describe_table", {"table": table})
    elif "churn" in step and "reason" in step:
        call = ("sql_query", {"query": CHURN_BY_REASON})
    elif "churn" in step:
        call = ("sql_query", {"query": CHURN_BY_REGION})
    elif "revenue" in step:
        call = ("sql_query", {"query": REVENUE_BY_REGION})
    if call is None or call[0] not in tool_names:
        return None
    return tool_call(name=call[0], args=call[1], id=call_id)


def reply_text(messages: list[BaseMessage]) -> str | None:
    """A step without a matching query, or the partial answer at the step budget."""
    system = _system_text(messages)
    if "step budget" in system and "partial answer" in system:
        done = _section_steps(system, "Completed steps:")
        left = _section_steps(system, "Steps not run:")
        return (
            "Established so far: "
            + ("; ".join(done) or "nothing yet")
            + ". Not run: "
            + ("; ".join(left) or "nothing")
            + "."
        )
    return f"No query matched this step, so it produced no data: {_last_human(messages)[:160]}"


class OfflinePlannerModel(OfflineChatModel):
    """After a tool call, a one-line step summary instead of echoing the raw tool output: the
    executor keeps the output itself verbatim in the step's result."""

    def _reply(self, messages: list[BaseMessage]) -> AIMessage:
        last = messages[-1] if messages else None
        if not isinstance(last, ToolMessage):
            return super()._reply(messages)
        name = last.name or "the tool"
        output = re.sub(r"</?tool_output[^>]*>", "", str(last.text)).strip()
        if output.startswith("ERROR:"):
            return AIMessage(f"{REPLY_PREFIX}{name} failed: {output.splitlines()[0]}")
        return AIMessage(f"{REPLY_PREFIX}{name} returned the data below.")


def offline_planner() -> OfflineChatModel:
    return OfflinePlannerModel(
        structured_responder=structured_answer, tool_router=route_tools, text_responder=reply_text
    )


def _planned_steps(system: str, goal: str) -> list[str]:
    feedback = system.split("<reviewer_feedback>")[-1] if "</reviewer_feedback>" in system else ""
    feedback = feedback.split("</reviewer_feedback>")[0].strip()
    steps = draft_plan(goal)
    if feedback:
        steps.append(f"Take the reviewer's note into account: {feedback[:200]}")
    return steps


def _answer(system: str) -> str:
    goal = next((line[6:] for line in system.splitlines() if line.startswith("Goal: ")), "")
    completed = system.split("Completed steps:")[-1].split("Remaining plan:")[0]
    tables = markdown_tables(completed)
    if not tables:
        return f"(offline model) The plan ran, but found no table of figures for: {goal}"
    table = tables[-1]
    lines = [f"(offline model) Here is what the plan found for: {goal}", ""]
    lines += ["| " + " | ".join(table.columns) + " |", "|" + " --- |" * len(table.columns)]
    lines += ["| " + " | ".join(row) + " |" for row in table.rows]
    if (chart := table.numeric_by_category()) is not None:
        _, value_col, labels, values = chart
        top = max(range(len(values)), key=values.__getitem__)
        lines += ["", f"Highest {value_col}: {labels[top]} ({values[top]:g})."]
    return "\n".join(lines)


def _section_steps(system: str, heading: str) -> list[str]:
    """The numbered step lines of one prompt section (results under them are not numbered)."""
    if heading not in system:
        return []
    section = system.split(heading, 1)[1]
    for later in ("Remaining plan:", "Steps not run:"):
        if later != heading:
            section = section.split(later)[0]
    return _numbered_lines(section)


def _numbered_lines(text: str) -> list[str]:
    return [m[1] for line in text.splitlines() if (m := _NUMBERED.match(line))]


def _system_text(messages: list[BaseMessage]) -> str:
    return "\n".join(str(m.text) for m in messages if isinstance(m, SystemMessage))


def _last_human(messages: list[BaseMessage]) -> str:
    human = next((m for m in reversed(messages) if isinstance(m, HumanMessage)), None)
    return str(human.text) if human else ""
