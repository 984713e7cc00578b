"""Per-run research metrics: citation precision and relevance, claims removed, critique rounds, tool calls, tokens, wall time."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graphs.research.state import State


def run_metrics(state: State, *, removed: int, off_topic: int, answered: bool) -> dict[str, Any]:
    verifications = state.get("verifications") or []
    first = verifications[0] if verifications else {"citations": 0, "passing": 0}
    usage = state.get("usage") or []
    started = state.get("started_at") or time.time()
    return {
        # Share of the first draft's citations that passed, before any removal or revision.
        "citation_precision": (first["passing"] / first["citations"])
        if first["citations"]
        else 1.0,
        "citations_first_draft": first["citations"],
        "citations_passing_first_draft": first["passing"],
        # Of the first draft's passing citations, those on claims that answer the question.
        "relevant_citations_first_draft": first.get("relevant_passing", 0),
        "answered": answered,
        "claims_removed": removed,
        "claims_off_topic": off_topic,
        "critique_rounds": state.get("critique_round", 0),
        "tool_calls": sum(u["tool_calls"] for u in usage),
        "subagent_runs": sum(u["agent"] == "researcher" for u in usage),
        "tokens": sum(u["tokens"] for u in usage),
        "wall_time_s": round(time.time() - started, 3),
    }
