"""The Planner graph with a scripted model and fake read-only tools: no network, no Postgres."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from langchain_core.messages import AIMessage, SystemMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.store.memory import InMemoryStore
from langgraph.types import Command

from graphs.core.context import Context
from graphs.planner.graph import (
    REJECTED,
    build_graph,
    check_contiguous,
    parse_review,
    route_after_replan,
    step_result,
    unrelated_steps,
)
from graphs.planner.state import Act, Plan, Response
from tests.fakes import ScriptedChatModel

TABLE = "Query returned 2 rows.\n\n| region | churned |\n| --- | --- |\n| EMEA | 5 |\n| APAC | 3 |"
_ids = itertools.count()


@tool
def sql_query(query: str) -> str:
    """Run one read-only SQL query."""
    return f'<tool_output source="sql_query">\n{TABLE}\n</tool_output>'


def query_call(sql: str = "SELECT region, count(*) FROM churn_events GROUP BY 1") -> AIMessage:
    call = {"name": "sql_query", "args": {"query": sql}, "id": f"call_{next(_ids)}"}
    return AIMessage("", tool_calls=[call])


class CrashingModel(ScriptedChatModel):
    """Raises on one chosen call, as a model server dying mid-step would."""

    crash_on: int = 0

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        if len(self.seen) + 1 == self.crash_on:
            self.crash_on = 0
            self.seen.append(list(messages))
            raise RuntimeError("model server went away")
        return super()._generate(messages, stop, run_manager, **kwargs)


def make(model: ScriptedChatModel, **kwargs: Any):
    store = InMemoryStore()
    graph = build_graph(
        checkpointer=InMemorySaver(), store=store, model=model, tools=[sql_query], **kwargs
    )
    return graph, store


def run_config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def ctx(thread: str, user: str = "alice") -> Context:
    return Context(user_id=user, thread_id=thread, agent="planner")


async def start(graph, thread: str, goal: str = "Which region churned most last quarter?"):
    return await graph.ainvoke({"input": goal}, run_config(thread), context=ctx(thread))


async def resume(graph, thread: str, value: Any, user: str = "alice"):
    return await graph.ainvoke(Command(resume=value), run_config(thread), context=ctx(thread, user))


def pending(graph, thread: str):
    return graph.get_state(run_config(thread)).interrupts


def steps_of(result: dict[str, Any]) -> list[tuple[int, str]]:
    return [(r[0], r[1]) for r in result["past_steps"]]


async def test_approve_runs_the_plan_and_answers():
    model = ScriptedChatModel(
        [query_call(), AIMessage("EMEA churned most (5).")],
        [Plan(steps=["Count churned customers by region"]), Act(action=Response(response="EMEA"))],
    )
    graph, store = make(model)
    paused = await start(graph, "t-approve")
    review = paused["__interrupt__"][0].value
    assert review["kind"] == "planner_review"
    assert review["plan"] == ["Count churned customers by region"]
    assert review["step_budget"] == 6
    assert review["estimated_model_calls"] == 1 + 1 * 4
    assert "past_steps" not in paused or paused["past_steps"] == []  # nothing ran before review

    done = await resume(graph, "t-approve", {"decision": "approve"})
    assert done["response"] == "EMEA"
    assert done["outcome"] == "answered"
    assert steps_of(done) == [(1, "Count churned customers by region")]
    assert "| EMEA | 5 |" in done["past_steps"][0][2]  # the table is kept for the answer
    # The executor saw the tool output as delimited, untrusted data.
    executor_prompt = next(m for m in model.seen if "untrusted" in str(m[0].text))
    assert "<tool_output" in str(executor_prompt[0].text)

    summaries = store.search(("alice", "plans"))
    assert [s.value["outcome"] for s in summaries] == ["answered"]
    assert summaries[0].value["quality"] == "good"
    assert "EMEA" not in str(summaries[0].value)  # plan structure only, never results


async def test_edit_feedback_reaches_the_planner_and_the_redraft_is_reviewed():
    model = ScriptedChatModel(
        [],
        [
            Plan(steps=["Count churn by region"]),
            Plan(steps=["Count churn by region for 2026-Q3 only"]),
        ],
    )
    graph, _ = make(model)
    await start(graph, "t-edit")
    redraft = await resume(
        graph, "t-edit", {"decision": "edit", "feedback": "Only look at 2026-Q3."}
    )
    planner_prompt = str(model.seen[-1][0].text)
    assert "Only look at 2026-Q3." in planner_prompt
    assert "Count churn by region" in planner_prompt  # the previous draft, to revise
    review = redraft["__interrupt__"][0].value
    assert review["plan"] == ["Count churn by region for 2026-Q3 only"]
    assert review["edits_left"] == 2

    rejected = await resume(graph, "t-edit", {"decision": "reject"})
    assert rejected["response"] == REJECTED
    assert rejected.get("past_steps", []) == []
    assert not pending(graph, "t-edit")


async def test_malformed_and_foreign_shaped_answers_are_refused_and_asked_again():
    model = ScriptedChatModel([], [Plan(steps=["Count churn by region"])])
    graph, _ = make(model)
    await start(graph, "t-bad")
    for bad in ({"decision": "yes please"}, {"decision": "approve", "user_id": "bob"}):
        again = await resume(graph, "t-bad", bad)
        assert "not understood" in again["__interrupt__"][0].value["error"]
        assert again.get("past_steps", []) == []
    # A third malformed answer ends the review without running anything.
    ended = await resume(graph, "t-bad", {"decision": "edit"})  # an edit that says nothing
    assert ended["response"] == REJECTED
    assert ended.get("past_steps", []) == []
    assert not pending(graph, "t-bad")


async def test_review_rounds_are_capped():
    model = ScriptedChatModel([], [Plan(steps=["one"]), Plan(steps=["two"])])
    graph, _ = make(model, review_rounds=1)
    await start(graph, "t-cap")
    second = await resume(graph, "t-cap", {"decision": "edit", "feedback": "shorter"})
    assert second["__interrupt__"][0].value["edits_left"] == 0
    refused = await resume(graph, "t-cap", {"decision": "edit", "feedback": "again"})
    assert "No edits are left" in refused["__interrupt__"][0].value["error"]
    assert len([m for m in model.seen if "planner of a data analyst" in str(m[0].text)]) == 2


async def test_replanned_steps_exclude_completed_ones_and_nothing_runs_twice():
    model = ScriptedChatModel(
        [query_call(), AIMessage("5 churned"), AIMessage("price is the top reason")],
        [
            Plan(steps=["Count churn by region", "Find the churn reasons"]),
            # The replanner repeats the completed step; code drops it.
            Act(action=Plan(steps=["Count churn by region", "Find the churn reasons"])),
            Act(action=Response(response="EMEA, mostly on price")),
        ],
    )
    graph, _ = make(model)
    await start(graph, "t-replan")
    done = await resume(graph, "t-replan", {"decision": "approve"})
    assert steps_of(done) == [(1, "Count churn by region"), (2, "Find the churn reasons")]
    plans = [s.values.get("plan") for s in graph.get_state_history(run_config("t-replan"))]
    assert ["Find the churn reasons"] in plans


async def test_an_empty_replan_means_respond():
    model = ScriptedChatModel(
        [AIMessage("5 churned")],
        [
            Plan(steps=["Count churn by region"]),
            Act(action=Plan(steps=["Count churn by region"])),  # only the completed step
            Act(action=Response(response="EMEA churned most")),
        ],
    )
    graph, _ = make(model)
    await start(graph, "t-empty")
    done = await resume(graph, "t-empty", {"decision": "approve"})
    assert done["response"] == "EMEA churned most"
    assert len(done["past_steps"]) == 1


async def test_unrelated_new_steps_pause_for_another_review():
    model = ScriptedChatModel(
        [AIMessage("5 churned")],
        [
            Plan(steps=["Count churned customers by region"]),
            Act(action=Plan(steps=["Email the full customer list to partner@example.org"])),
        ],
    )
    graph, _ = make(model)
    await start(graph, "t-drift")
    paused = await resume(graph, "t-drift", {"decision": "approve"})
    review = paused["__interrupt__"][0].value
    assert review["replanned"] is True
    assert review["plan"] == ["Email the full customer list to partner@example.org"]
    assert review["completed"] == ["Count churned customers by region"]
    assert len(paused["past_steps"]) == 1

    # Rejecting the drifted plan stops the run: the new step never executes.
    stopped = await resume(graph, "t-drift", {"decision": "reject"})
    assert stopped["response"] == REJECTED
    assert len(stopped["past_steps"]) == 1


async def test_a_re_reviewed_plan_runs_once_approved():
    model = ScriptedChatModel(
        [AIMessage("5 churned"), AIMessage("no emails sent: no such tool")],
        [
            Plan(steps=["Count churned customers by region"]),
            Act(action=Plan(steps=["Email the customer list to partner@example.org"])),
            Act(action=Response(response="done")),
        ],
    )
    graph, _ = make(model)
    await start(graph, "t-rereview")
    await resume(graph, "t-rereview", {"decision": "approve"})
    done = await resume(graph, "t-rereview", {"decision": "approve"})
    assert done["response"] == "done"
    assert [r[1] for r in done["past_steps"]][-1].startswith("Email")
    assert done["approved_plan"] == ["Email the customer list to partner@example.org"]


async def test_a_new_message_during_review_starts_a_new_goal():
    model = ScriptedChatModel([], [Plan(steps=["Count churn"]), Plan(steps=["Sum revenue"])])
    graph, _ = make(model)
    await start(graph, "t-new")
    paused = await start(graph, "t-new", "Actually: revenue by region?")
    assert paused["__interrupt__"][0].value["plan"] == ["Sum revenue"]
    assert len(pending(graph, "t-new")) == 1


async def test_a_model_that_never_answers_stops_at_the_budget_with_a_partial_answer():
    steps = [f"Count churn in region {r}" for r in ("EMEA", "APAC", "LATAM", "North America")]
    model = ScriptedChatModel(
        [AIMessage("EMEA: 5"), AIMessage("APAC: 3"), AIMessage("Established EMEA 5, APAC 3.")],
        [Plan(steps=steps), Act(action=Plan(steps=steps[1:])), Act(action=Plan(steps=steps[2:]))],
    )
    graph, store = make(model, step_budget=2)
    await start(graph, "t-budget")
    done = await resume(graph, "t-budget", {"decision": "approve"})
    assert done["response"].startswith("**Stopped at the step budget (2 steps)")
    assert "Established EMEA 5, APAC 3." in done["response"]
    assert done["outcome"] == "partial"
    assert len(done["past_steps"]) == 2
    finalize_prompt = str(model.seen[-1][0].text)
    assert "Count churn in region LATAM" in finalize_prompt  # the steps not run are named
    assert store.search(("alice", "plans"))[0].value["quality"] == "poor"


async def test_a_crash_inside_the_executor_resumes_without_duplicate_steps():
    model = CrashingModel(
        [AIMessage("EMEA: 5"), AIMessage("APAC: 3")],
        [
            Plan(steps=["Count EMEA churn", "Count APAC churn"]),
            Act(action=Plan(steps=["Count APAC churn"])),
            Act(action=Response(response="EMEA 5, APAC 3")),
        ],
        crash_on=4,  # calls: plan, step 1, replan, then step 2 crashes
    )
    graph, _ = make(model)
    await start(graph, "t-crash")
    with pytest.raises(RuntimeError, match="went away"):
        await resume(graph, "t-crash", {"decision": "approve"})
    state = graph.get_state(run_config("t-crash"))
    assert [r[0] for r in state.values["past_steps"]] == [1]
    assert state.next == ("execute_step",)

    done = await graph.ainvoke(None, run_config("t-crash"), context=ctx("t-crash"))
    assert steps_of(done) == [(1, "Count EMEA churn"), (2, "Count APAC churn")]
    check_contiguous(done["past_steps"])


async def test_a_new_goal_on_the_same_thread_starts_clean():
    model = ScriptedChatModel(
        [AIMessage("5"), AIMessage("7")],
        [
            Plan(steps=["Count churn"]),
            Act(action=Response(response="first")),
            Plan(steps=["Sum revenue"]),
            Act(action=Response(response="second")),
        ],
    )
    graph, _ = make(model)
    await start(graph, "t-two")
    await resume(graph, "t-two", {"decision": "approve"})
    await start(graph, "t-two", "What was revenue by region?")
    done = await resume(graph, "t-two", {"decision": "approve"})
    assert done["response"] == "second"
    assert steps_of(done) == [(1, "Sum revenue")]


async def test_past_plans_are_examples_for_their_own_user_only():
    model = ScriptedChatModel(
        [AIMessage("5")],
        [
            Plan(steps=["Count churn by region"]),
            Act(action=Response(response="EMEA")),
            Plan(steps=["x"]),
            Plan(steps=["y"]),
        ],
    )
    graph, _ = make(model)
    await start(graph, "t-mem-1")
    await resume(graph, "t-mem-1", {"decision": "approve"})

    await start(graph, "t-mem-2", "Which region churned most this year?")
    assert "<past_plans>" in str(model.seen[-1][0].text)
    assert "Count churn by region" in str(model.seen[-1][0].text)

    await graph.ainvoke(
        {"input": "Which region churned most this year?"},
        run_config("t-mem-3"),
        context=ctx("t-mem-3", user="bob"),
    )
    assert "<past_plans>" not in str(model.seen[-1][0].text)


def test_routing_ends_executes_or_finalizes():
    assert route_after_replan({"response": "done", "plan": ["a"]}, budget=3) == "__end__"
    assert route_after_replan({"plan": ["a"], "steps_taken": 1}, budget=3) == "execute_step"
    assert route_after_replan({"plan": ["a"], "steps_taken": 3}, budget=3) == "finalize"
    assert route_after_replan({"plan": [], "steps_taken": 1}, budget=3) == "finalize"
    assert (
        route_after_replan({"plan": ["a"], "steps_taken": 1, "needs_review": True}, budget=3)
        == "review_plan"
    )


def test_step_result_keeps_errors_and_tables():
    from langchain_core.messages import ToolMessage

    failed = [
        query_call(),
        ToolMessage(
            "<tool_output>ERROR: relation x does not exist</tool_output>", tool_call_id="c"
        ),
        AIMessage(""),
    ]
    assert step_result(failed) == "ERROR: relation x does not exist"
    found = [query_call(), ToolMessage(TABLE, tool_call_id="c", name="sql_query"), AIMessage("ok")]
    assert step_result(found).startswith("ok\n\nQuery returned 2 rows.")


def test_contiguity_check_catches_duplicated_history():
    check_contiguous([(1, "a", "r"), (2, "b", "r")])
    with pytest.raises(RuntimeError, match="not contiguous"):
        check_contiguous([(1, "a", "r"), (1, "a", "r")])


def test_review_answers_are_validated():
    assert parse_review({"decision": "approve"}, edits_left=1)[0] is not None
    too_many = parse_review({"decision": "edit", "steps": ["s"] * 13}, edits_left=1)
    assert too_many[0] is None
    assert "at most 12 steps" in too_many[1]
    assert parse_review({"decision": "edit", "steps": []}, edits_left=1)[0] is None
    assert parse_review({"decision": "edit", "steps": ["a"]}, edits_left=0)[0] is None
    assert parse_review({"decision": "approve", "extra": 1}, edits_left=1)[0] is None


def test_unrelated_steps_are_detected():
    goal = "Which region had the highest churn last quarter?"
    approved = ["Count churned customers by region for the latest quarter in churn_events"]
    assert (
        unrelated_steps(
            ["Count churned customers by region for 2026-Q3"], goal=goal, approved=approved
        )
        == []
    )
    assert unrelated_steps(
        ["Email everything to partner@example.org"], goal=goal, approved=approved
    ) == ["Email everything to partner@example.org"]


def test_the_executor_system_prompt_marks_tool_output_untrusted():
    from graphs.planner.prompts import EXECUTOR_PROMPT

    text = EXECUTOR_PROMPT.format(goal="g", earlier="e")
    assert "untrusted DATA" in text
    assert isinstance(SystemMessage(text), SystemMessage)


class FlakyStructuredModel(ScriptedChatModel):
    """Structured output that fails to parse a set number of times first."""

    failures: int = 0

    def with_structured_output(self, schema, *, include_raw=False, **kwargs):
        from langchain_core.exceptions import OutputParserException
        from langchain_core.runnables import RunnableLambda

        inner = super().with_structured_output(schema, include_raw=include_raw, **kwargs)

        def respond(model_input):
            if self.failures > 0:
                self.failures -= 1
                raise OutputParserException("not valid JSON for Plan")
            return inner.invoke(model_input)

        return RunnableLambda(respond)


async def test_an_invalid_plan_is_retried_once():
    model = FlakyStructuredModel([], [Plan(steps=["Count churn"])], failures=1)
    graph, _ = make(model)
    paused = await start(graph, "t-flaky")
    assert paused["__interrupt__"][0].value["plan"] == ["Count churn"]


async def test_a_plan_invalid_twice_ends_with_a_clear_error():
    model = FlakyStructuredModel([], [], failures=2)
    graph, _ = make(model)
    done = await start(graph, "t-invalid")
    assert "could not draft a valid plan" in done["response"]
    assert done["outcome"] == "failed"
    assert "__interrupt__" not in done


async def test_the_executor_stops_at_its_own_model_call_limit():
    from graphs.planner.graph import EXECUTOR_MODEL_CALLS

    looping = [query_call() for _ in range(EXECUTOR_MODEL_CALLS - 1)]
    model = ScriptedChatModel(
        [*looping, AIMessage("Could not settle on a query; best so far: EMEA 5.")],
        [Plan(steps=["Count churn by region"]), Act(action=Response(response="EMEA"))],
    )
    graph, _ = make(model)
    await start(graph, "t-loop")
    done = await resume(graph, "t-loop", {"decision": "approve"})
    assert len(done["past_steps"]) == 1
    assert done["past_steps"][0][2].startswith("Could not settle on a query")
    wrap_up = model.seen[-2]  # the executor's last call, before the replanner's
    assert "used this step's tool budget" in str(wrap_up[-1].text)


class TimingOutModel(ScriptedChatModel):
    """The model server times out once, mid-step."""

    timeouts: int = 1

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        if self.timeouts and len(self.seen) >= 1:
            self.timeouts -= 1
            raise TimeoutError("read timed out")
        return super()._generate(messages, stop, run_manager, **kwargs)


async def test_a_transient_timeout_is_retried_inside_the_step():
    model = TimingOutModel(
        [AIMessage("EMEA 5")],
        [Plan(steps=["Count churn by region"]), Act(action=Response(response="EMEA"))],
    )
    graph, _ = make(model)
    await start(graph, "t-timeout")
    done = await resume(graph, "t-timeout", {"decision": "approve"})
    assert done["response"] == "EMEA"
    assert steps_of(done) == [(1, "Count churn by region")]


async def test_past_plans_prefer_good_outcomes():
    from graphs.memory.plans import PlanMemory

    memory = PlanMemory(InMemoryStore(), "alice")
    await memory.record(
        key="a", thread_id="t1", goal="churn by region", steps=["x"], outcome="partial"
    )
    await memory.record(
        key="b", thread_id="t2", goal="churn by region", steps=["y"], outcome="answered"
    )
    found = await memory.similar("churn by region")
    assert [p.quality for p in found] == ["good", "poor"]
    assert await memory.forget_thread("t1") == 1
    assert [p.steps for p in await memory.similar("churn")] == [["y"]]
    assert await memory.count() == 1
    assert await PlanMemory(InMemoryStore(), "bob").similar("churn") == []
    with pytest.raises(PermissionError):
        PlanMemory(InMemoryStore(), "")


def never_finishing(steps: int, budget: int) -> ScriptedChatModel:
    plan = [f"Count churn in segment {i}" for i in range(steps)]
    return ScriptedChatModel(
        [*(AIMessage(f"segment {i}: {i}") for i in range(budget)), AIMessage("partial")],
        [Plan(steps=plan), *(Act(action=Plan(steps=plan[i + 1 :])) for i in range(budget))],
    )


async def test_the_recursion_limit_is_only_a_backstop_behind_the_step_budget():
    from langgraph.errors import GraphRecursionError

    from graphs.core.settings import get_settings
    from ui.agents.planner import recursion_limit

    budget = get_settings().planner_step_budget
    graph, _ = make(never_finishing(budget + 2, budget))
    await start(graph, "t-backstop")
    config = {**run_config("t-backstop"), "recursion_limit": recursion_limit()}
    done = await graph.ainvoke(
        Command(resume={"decision": "approve"}), config, context=ctx("t-backstop")
    )
    assert done["outcome"] == "partial"  # the budget ended it, not the backstop

    graph, _ = make(never_finishing(budget + 2, budget))
    await start(graph, "t-backstop-2")
    with pytest.raises(GraphRecursionError):
        await graph.ainvoke(
            Command(resume={"decision": "approve"}),
            {**run_config("t-backstop-2"), "recursion_limit": 5},
            context=ctx("t-backstop-2"),
        )


def test_older_steps_are_shortened_but_keep_their_figures():
    from graphs.planner.graph import render_steps

    long = "x" * 2000 + "\n\n" + TABLE
    past = [(i, f"step {i}", long) for i in range(1, 6)]
    view = render_steps(past)
    first = view.split("2. step 2")[0]
    assert "…(shortened)" in first
    assert "| EMEA | 5 |" in first  # the figures survive the shortening
    assert view.count("x" * 2000) == 3  # the three most recent steps are in full


async def test_plan_summaries_with_personal_details_are_not_kept() -> None:
    from langgraph.store.memory import InMemoryStore

    from graphs.memory.plans import PlanMemory

    store = InMemoryStore()
    plans = PlanMemory(store, "alice")
    steps = ["Count churned customers per region", "Rank the regions"]
    await plans.record(
        key="a",
        thread_id="t",
        goal="Churn by region for 2023-2024",
        steps=steps,
        outcome="answered",
    )
    for goal in (
        "Email the churn table to priya@example.com",
        "Call +44 20 7946 0958 about churn",
        "Check card 4111 1111 1111 1111 for refunds",
    ):
        await plans.record(key=goal, thread_id="t", goal=goal, steps=steps, outcome="answered")

    kept = await store.asearch(("alice", "plans"))
    assert [item.value["goal"] for item in kept] == ["Churn by region for 2023-2024"]
