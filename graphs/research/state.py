"""State of the Research graph: the plan, the per-thread files, the critique loop and the run's metrics."""

from __future__ import annotations

import operator
from typing import Annotated, Any, Literal, NotRequired, TypedDict

from deepagents.graph import DeepAgentState
from langchain_core.messages import AnyMessage
from langgraph.graph.message import add_messages


class Todo(TypedDict):
    content: str
    status: Literal["pending", "in_progress", "completed"]


def merge_files(current: dict[str, Any] | None, update: dict[str, Any] | None) -> dict[str, Any]:
    """Files by path; an update replaces a file, None deletes it."""
    merged = dict(current or {})
    for path, data in (update or {}).items():
        if data is None:
            merged.pop(path, None)
        else:
            merged[path] = data
    return merged


def append_or_reset(current: list[Any] | None, update: list[Any] | None) -> list[Any]:
    """Appends; an update of None starts the list afresh (a new question in the thread)."""
    return [] if update is None else [*(current or []), *update]


class Usage(TypedDict):
    """What one agent (orchestrator or subagent) used in one call."""

    agent: str
    tool_calls: int
    tokens: int


class ClaimRelevance(TypedDict):
    """Whether one claim's cited passage answers the question, as code read the critic's verdict."""

    line: int
    """0-based line of the claim in the checked draft."""
    claim: str
    relevant: bool
    reason: str
    """Why it does not count as an answer (empty when it does)."""


class Verification(TypedDict):
    """One check of the draft: the deterministic citation check plus the critic's reading."""

    round: int
    citations: int
    passing: int
    """Citations whose quote is in a page this thread fetched."""
    relevant_passing: int
    """Passing citations on claims the critic judged to answer the question."""
    relevance_checked: bool
    """False when the critic's reading was unusable: then no claim counts as relevant."""
    relevance: list[ClaimRelevance]
    failing_claims: list[str]
    critic_flags: list[str]


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    """The conversation: the question and the agent's replies (never raw pages)."""
    question: str
    todos: list[Todo]
    """The plan: written by the planner, approved or edited by the user, extended by critique."""
    plan_feedback: str
    """Why the user rejected the last plan (for the next one)."""
    plan_rejections: int
    files: Annotated[dict[str, Any], merge_files]
    """The thread's virtual filesystem: notes/<topic>.md and final_report.md."""
    critique_round: int
    """Critique rounds done; at research_critique_rounds the unsupported claims are removed."""
    unsupported: list[str]
    """Claims of the current draft that failed the check or the critic, with reasons."""
    verifications: Annotated[list[Verification], append_or_reset]
    """This question's checks, one per critique round."""
    usage: Annotated[list[Usage], append_or_reset]
    """This question's model and tool use, per agent call."""
    report: str
    """The delivered report: only claims whose citations pass the check."""
    not_verified: list[str]
    """Claims removed at the cap, shown to the user outside the report."""
    off_topic: list[str]
    """Claims whose quote passed but whose passage does not answer the question, removed."""
    answered: bool
    """Whether the delivered report has a checked claim that answers the question."""
    metrics: dict[str, Any]
    started_at: float


class OrchestratorState(DeepAgentState):
    """The deep agent's state plus the usage its subagents report back through `task`."""

    usage: NotRequired[Annotated[list[Usage], operator.add]]
