"""The Planner's behaviour under the offline model: plain rules over the demo data, end to end."""

from __future__ import annotations

import re
from typing import Any

from langchain_core.messages import AIMessage

from graphs.core.offline import (
    NUMBERED_LINE,
    REPLY_PREFIX,
    OfflineChatModel,
    Turn,
    bullet_lines,
    fenced_blocks,
    say,
)
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


class OfflinePlannerModel(OfflineChatModel):
    """Asked for a Plan, drafts one for the goal; asked for an Act, continues with the steps
    not run yet or answers from the figures found; with the SQL tools bound, runs the query a
    plan step names and sums up its output in one line; with no tools, writes the partial answer.

    Prompts are not read: the steps and results come from the lists the graph renders (completed
    steps as "N. step" followed by a "Result:" line, steps still to run as bare "N. step")."""

    def answer(self, schema: Any, turn: Turn) -> Any:
        if schema is Plan:
            # A fenced block of free text (not a list, as past plans are) is the reviewer's note.
            notes = [
                b.strip() for b in fenced_blocks(turn.data) if b.strip() and not bullet_lines(b)
            ]
            note = [f"Take the reviewer's note into account: {n[:200]}" for n in notes[:1]]
            return Plan(steps=draft_plan(turn.request) + note)
        if schema is Act:
            _done, left = _rendered_steps(turn.data)
            if left:
                return Act(action=Plan(steps=left))
            return Act(action=Response(response=_answer(turn.data)))
        return None

    def respond(self, turn: Turn) -> AIMessage | None:
        if turn.results:
            # A one-line summary, not an echo: the executor keeps the output verbatim itself.
            name, result = turn.results[-1]
            output = re.sub(r"</?tool_output[^>]*>", "", result).strip()
            if output.startswith("ERROR:"):
                return say(f"{name} failed: {output.splitlines()[0]}")
            return say(f"{name} returned the data below.")
        if turn.tools:
            call = _query_for(turn.request)
            if call is not None and call[0] in turn.tools:
                return turn.calls(call)
            return say(f"No query matched this step, so it produced no data: {turn.request[:160]}")
        done, left = _rendered_steps(turn.data)  # no tools: the partial answer at the budget
        established, not_run = "; ".join(done) or "nothing yet", "; ".join(left) or "nothing"
        return say(f"Established so far: {established}. Not run: {not_run}.")


def offline_planner() -> OfflineChatModel:
    return OfflinePlannerModel()


def _query_for(step: str) -> tuple[str, dict[str, Any]] | None:
    """One plan step -> the query a careful analyst would run for it."""
    step = step.lower()
    if "list" in step and "table" in step:
        return "list_tables", {}
    if "describe" in step or "columns" in step:
        return "describe_table", {"table": next((t for t in TABLES if t in step), "churn_events")}
    if "churn" in step and "reason" in step:
        return "sql_query", {"query": CHURN_BY_REASON}
    if "churn" in step:
        return "sql_query", {"query": CHURN_BY_REGION}
    if "revenue" in step:
        return "sql_query", {"query": REVENUE_BY_REGION}
    return None


def _rendered_steps(data: str) -> tuple[list[str], list[str]]:
    """(completed steps, steps not run) from the step lists the graph renders into a prompt."""
    lines = data.splitlines()
    done: list[str] = []
    left: list[str] = []
    for i, line in enumerate(lines):
        if match := NUMBERED_LINE.match(line):
            completed = i + 1 < len(lines) and lines[i + 1].strip() == "Result:"
            (done if completed else left).append(match[1])
    return done, [step for step in left if step not in done]


def _answer(data: str) -> str:
    tables = markdown_tables(data)
    if not tables:
        return f"{REPLY_PREFIX}The plan ran, but found no table of figures."
    table = tables[-1]
    lines = [f"{REPLY_PREFIX}Here is what the plan found:", ""]
    lines += ["| " + " | ".join(table.columns) + " |", "|" + " --- |" * len(table.columns)]
    lines += ["| " + " | ".join(row) + " |" for row in table.rows]
    if (chart := table.numeric_by_category()) is not None:
        _, value_col, labels, values = chart
        top = max(range(len(values)), key=values.__getitem__)
        lines += ["", f"Highest {value_col}: {labels[top]} ({values[top]:g})."]
    return "\n".join(lines)
