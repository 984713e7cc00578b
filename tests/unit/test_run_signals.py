"""Per-run figures for /metrics: tool errors counted by the usage meter, the agents' quality
signals, and a memory job's run id on its traces."""

from __future__ import annotations

from collections import Counter

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from graphs.core.settings import Settings, get_settings
from graphs.core.tracing import APP_VERSION, configure_tracing, job_trace, reset_tracing
from graphs.core.usage import RunUsage, UsageMeter, metered
from ui.agents.planner import planner_signals
from ui.agents.research import research_signals


@tool
def broken(text: str) -> str:
    """Always fails."""
    msg = f"no luck with {text}"
    raise ValueError(msg)


@tool
def fine(text: str) -> str:
    """Always works."""
    return text


async def test_the_meter_counts_tool_errors_the_model_was_shown():
    meter = UsageMeter({})
    calls = [
        {"name": "broken", "args": {"text": "a"}, "id": "1", "type": "tool_call"},
        {"name": "fine", "args": {"text": "b"}, "id": "2", "type": "tool_call"},
    ]
    builder = StateGraph(MessagesState)
    builder.add_node("tools", ToolNode([broken, fine], handle_tool_errors=True))
    builder.add_edge(START, "tools")
    graph = builder.compile()
    with metered(meter):
        result = await graph.ainvoke({"messages": [AIMessage("", tool_calls=calls)]})
    result["messages"] = result["messages"][1:]
    assert [m.status for m in result["messages"]] == ["error", "success"]
    assert meter.usage.tool_calls == 2
    assert meter.usage.tool_errors == 1


def test_a_planner_run_that_stopped_at_its_step_budget_says_so():
    budget = get_settings().planner_step_budget
    at_budget = RunUsage(nodes=Counter({"replan": 3, "finalize": 1}))
    assert planner_signals({"steps_taken": budget}, at_budget) == {
        "runs": 1,
        "replans": 3,
        "step_budget_reached": 1,
    }
    answered = RunUsage(nodes=Counter({"replan": 2}))
    # An earlier goal's partial outcome in the state is not this run's.
    signals = planner_signals({"steps_taken": budget, "outcome": "partial"}, answered)
    assert signals["step_budget_reached"] == 0
    out_of_steps = RunUsage(nodes=Counter({"finalize": 1}))
    assert planner_signals({"steps_taken": 1}, out_of_steps)["step_budget_reached"] == 0


def test_research_signals_count_the_first_drafts_citations_of_a_run_that_wrote_a_report():
    metrics = {"citations_first_draft": 5, "citations_passing_first_draft": 4, "claims_removed": 1}
    wrote = RunUsage(nodes=Counter({"finalize": 1}))
    assert research_signals({"metrics": metrics}, wrote) == {
        "reports": 1,
        "citations_checked": 5,
        "citations_passed": 4,
        "claims_removed": 1,
    }
    assert research_signals({"metrics": metrics}, RunUsage()) == {}  # an earlier run's report


async def test_a_memory_jobs_model_calls_are_traced_with_its_run_id_and_the_version():
    exporter = InMemorySpanExporter()
    tracing = configure_tracing(Settings(), auth_secret="s" * 40, env={}, span_exporter=exporter)
    try:
        model = GenericFakeChatModel(messages=iter([AIMessage("ok")]))
        with job_trace("job-7-attempt-2"):
            await model.ainvoke("hi")
        tracing.flush()
    finally:
        tracing.shutdown()
        reset_tracing()
    values = {v for s in exporter.get_finished_spans() for v in (s.attributes or {}).values()}
    assert "job-7-attempt-2" in values
    assert APP_VERSION in values
