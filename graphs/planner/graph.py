"""Planner graph: start_goal -> plan -> review_plan -> execute_step <-> replan -> END or finalize."""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypedDict, TypeVar

from langchain_core.exceptions import ModelRefusalError, OutputParserException
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.runtime import Runtime
from langgraph.types import Command, Overwrite, RetryPolicy, interrupt
from pydantic import BaseModel, ValidationError

from graphs.core.context import Context
from graphs.core.models import chat_model
from graphs.core.nodes import bind, declare_subgraph, on_loop
from graphs.core.toolcalls import limit_tool_calls
from graphs.memory.gallery import plan_examples, remember_team_plan
from graphs.memory.plans import PlanMemory, summary_key
from graphs.planner import prompts
from graphs.planner.sql import markdown_tables
from graphs.planner.state import (
    Act,
    Outcome,
    Plan,
    ReviewDecision,
    State,
    StepRecord,
    step_failed,
    step_parts,
)

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langchain_core.runnables import Runnable
    from langchain_core.tools import BaseTool
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.graph.state import CompiledStateGraph
    from langgraph.store.base import BaseStore

log = logging.getLogger("cairn.planner")

M = TypeVar("M", bound=BaseModel)

MAX_PLAN_STEPS = 6
EXECUTOR_MODEL_CALLS = 6
"""Model calls inside one step (tool rounds plus the wrap-up)."""
TOOL_CALLS_PER_REPLY = 3
"""Tool calls one executor reply may run; the rest of a longer batch are dropped."""
INNER_CALLS_ESTIMATE = 3
"""Executor model calls per step for the estimate shown at review, until runs measured it."""
STEP_NODES = ("execute_step", "act")
"""The step node and the executor's model node (one call per run): usage counts both, and
their ratio over recent runs replaces INNER_CALLS_ESTIMATE (Context.step_model_calls)."""
MAX_INVALID_ANSWERS = 3
"""Malformed review answers before the review gives up and ends the run."""
RECENT_STEPS_IN_FULL = 3
OLDER_RESULT_CHARS = 600
OLDER_TABLE_CHARS = 2000
KEPT_OUTPUT_CHARS = 6000
"""Tool output up to this size is kept verbatim in a step's result."""
MAX_PROBLEM_CHARS = 200
REJECTED = "Plan rejected: nothing was run. Send a new goal whenever you like."


class PlanningFailed(RuntimeError):
    """The model returned no valid structured output, even after one retry."""


class ExecutorState(TypedDict):
    """The executor's own ReAct loop; only its final (step, result) reaches the outer state."""

    step_messages: Annotated[list[AnyMessage], add_messages]
    model_calls: int


@dataclass(frozen=True)
class PlannerDeps:
    """What the planner nodes need, bound once when the graph is built."""

    planner: BaseChatModel
    """Plans, replans and writes the partial answer."""
    executor: CompiledStateGraph[Any, Any, Any, Any]
    """The inner ReAct loop that runs one step with the read-only tools."""
    budget: int
    """Steps run per goal before finalize writes a partial answer."""
    max_rounds: int
    """Edits the reviewer may ask for on one plan."""


def build_graph(
    *,
    checkpointer: BaseCheckpointSaver | None,
    store: BaseStore | None,
    model: BaseChatModel | None = None,
    executor_model: BaseChatModel | None = None,
    tools: list[BaseTool] | None = None,
    step_budget: int | None = None,
    review_rounds: int | None = None,
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """The Planner. `model` plans and replans (and executes unless executor_model is given)."""
    from graphs.core.settings import get_settings

    settings = get_settings()
    executor_llm = executor_model or model or planner_model("executor")
    deps = PlannerDeps(
        planner=model or planner_model("planner"),
        executor=build_executor(executor_llm, tools if tools is not None else default_tools(store)),
        budget=step_budget or settings.planner_step_budget,
        max_rounds=review_rounds or settings.planner_review_rounds,
    )
    builder = StateGraph(State, context_schema=Context)
    builder.add_node(on_loop(start_goal))
    builder.add_node(bind(plan, deps=deps))
    builder.add_node(
        bind(review_plan, deps=deps),
        destinations=("plan", "review_plan", "execute_step", "__end__"),
    )
    builder.add_node(bind(execute_step, deps=deps), retry_policy=TRANSIENT_RETRY)
    builder.add_node(bind(replan, deps=deps), retry_policy=TRANSIENT_RETRY)
    builder.add_node(bind(finalize, deps=deps))
    builder.add_edge(START, "start_goal")
    builder.add_edge("start_goal", "plan")
    builder.add_conditional_edges("plan", on_loop(route_after_plan))
    builder.add_edge("execute_step", "replan")
    builder.add_conditional_edges("replan", on_loop(bind(route_after_replan, budget=deps.budget)))
    builder.add_edge("finalize", END)
    graph = builder.compile(checkpointer=checkpointer, store=store, name="planner")
    return declare_subgraph(graph, "execute_step", deps.executor)


async def plan(state: State, runtime: Runtime[Context], *, deps: PlannerDeps) -> dict[str, Any]:
    """Draft (or redraft after an edit) a short list of self-contained steps."""
    goal = state.get("input", "").strip()
    if not goal:
        return {"response": "Tell me what you would like analysed.", "outcome": "failed"}
    feedback = state.get("plan_feedback", "")
    examples = await plan_examples(runtime, goal)
    past = [step_parts(r) for r in state.get("past_steps", [])]
    system = prompts.PLANNER_PROMPT.format(
        max_steps=MAX_PLAN_STEPS,
        budget=deps.budget,
        examples=_examples_block(examples),
        completed=_completed_block(past),
        feedback=_feedback_block(feedback, state.get("plan", [])),
    )
    try:
        drafted = await structured(deps.planner, Plan, [SystemMessage(system), HumanMessage(goal)])
    except PlanningFailed as exc:
        return {"response": f"I could not draft a valid plan ({exc}).", "outcome": "failed"}
    steps = _clean_steps(drafted.steps, past)
    if not steps:
        return {"response": "I could not draft a plan for that goal.", "outcome": "failed"}
    return {"plan": steps}


async def review_plan(
    state: State, runtime: Runtime[Context], *, deps: PlannerDeps
) -> Command[Literal["plan", "review_plan", "execute_step", "__end__"]]:
    """Pause for the reviewer. Nothing before interrupt() has side effects: it re-runs."""
    rounds = state.get("review_rounds", 0)
    request = review_request(
        state,
        budget=deps.budget,
        max_rounds=deps.max_rounds,
        inner_calls=runtime.context.step_model_calls if runtime.context else None,
        per_call=(
            (runtime.context.call_tokens, runtime.context.call_cost or 0.0)
            if runtime.context and runtime.context.call_tokens
            else None
        ),
    )
    decision: ReviewDecision | None = None
    for _ in range(MAX_INVALID_ANSWERS):
        decision, error = parse_review(interrupt(request), edits_left=deps.max_rounds - rounds)
        if decision is not None:
            break
        request = {**request, "error": error}
    if decision is None:
        return Command(goto="__end__", update={"response": REJECTED, "outcome": "rejected"})
    if decision.decision == "approve":
        steps = list(state["plan"])
        approved = [*state.get("approved_steps", []), *steps]
        update = {"approved_plan": steps, "approved_steps": approved, "needs_review": False}
        return Command(goto="execute_step", update=update)
    if decision.decision == "edit" and decision.steps:
        # The reviewer's steps are the plan, word for word: no model gets to reword or
        # ignore them. They come back for review, so what runs is what was approved.
        update = {"plan": list(decision.steps), "review_rounds": rounds + 1}
        return Command(goto="review_plan", update=update)
    if decision.decision == "edit":
        feedback = (decision.feedback or "").strip()
        return Command(goto="plan", update={"plan_feedback": feedback, "review_rounds": rounds + 1})
    await _remember(runtime, state, "rejected")
    return Command(goto="__end__", update={"response": REJECTED, "outcome": "rejected", "plan": []})


async def execute_step(state: State, *, deps: PlannerDeps) -> dict[str, Any]:
    """Run plan[0] in the executor subgraph; return exactly one new (index, step, result)."""
    remaining = state.get("plan") or []
    if not remaining:
        msg = "execute_step needs a non-empty plan"
        raise ValueError(msg)
    past = [step_parts(r) for r in state.get("past_steps", [])]
    step, index = remaining[0], len(past) + 1
    system = prompts.EXECUTOR_PROMPT.format(
        goal=state.get("input", ""), earlier=render_steps(past) or "(none yet)"
    )
    done = await deps.executor.ainvoke(
        {"step_messages": [SystemMessage(system), HumanMessage(step)], "model_calls": 0}
    )
    record: StepRecord = (index, step, step_result(done["step_messages"]))
    return {"past_steps": [record], "steps_taken": state.get("steps_taken", 0) + 1}


async def replan(state: State, runtime: Runtime[Context], *, deps: PlannerDeps) -> dict[str, Any]:
    """One structured decision: the remaining steps, or the answer."""
    past = [step_parts(r) for r in state.get("past_steps", [])]
    check_contiguous(past)
    used = state.get("steps_taken", 0)
    remaining = state.get("plan", [])[1:]
    system = prompts.REPLANNER_PROMPT.format(
        budget_note=prompts.BUDGET_NOTE.format(used=used, budget=deps.budget),
        goal=state.get("input", ""),
        completed=render_steps(past),
        remaining=_numbered(remaining) or "(nothing left)",
    )
    messages = [SystemMessage(system), HumanMessage("Decide: Response or the remaining Plan.")]
    try:
        act = await structured(deps.planner, Act, messages)
    except PlanningFailed as exc:
        return _stopped(past, exc)
    if isinstance(act.action, Plan):
        steps = _clean_steps(act.action.steps, past)
        if steps:
            approved = state.get("approved_plan", [])
            unrelated = unrelated_steps(steps, goal=state.get("input", ""), approved=approved)
            if unrelated:
                log.warning("replan added steps unrelated to the goal: %s", unrelated)
            return {"plan": steps, "needs_review": bool(unrelated)}
        # An empty plan (or only completed steps) means: respond now.
        messages.append(HumanMessage("Nothing is left to do: answer with a Response now."))
        try:
            answer = await structured(deps.planner, Act, messages)
        except PlanningFailed as exc:
            return _stopped(past, exc)
        if isinstance(answer.action, Plan):
            return {"plan": [], "needs_review": False}  # route_after_replan sends it to finalize
        act = answer
    assert not isinstance(act.action, Plan)
    await _remember(runtime, state, "answered")
    return {"response": act.action.response, "plan": [], "outcome": "answered"}


def _stopped(past: list[StepRecord], problem: PlanningFailed) -> dict[str, Any]:
    """The run ends with a clear error when the replanner's answers are unusable: what ran is
    listed, nothing more runs and nothing is remembered."""
    done = "\n".join(f"{index}. {step}" for index, step, _ in past) or "(none)"
    text = f"I had to stop: {problem}. Steps completed before that:\n{done}"
    return {"response": text, "plan": [], "outcome": "failed"}


async def finalize(state: State, runtime: Runtime[Context], *, deps: PlannerDeps) -> dict[str, Any]:
    """The honest partial answer at the step budget: established, missing, not run."""
    budget = deps.budget
    past = [step_parts(r) for r in state.get("past_steps", [])]
    system = prompts.FINALIZE_PROMPT.format(
        budget=budget,
        goal=state.get("input", ""),
        completed=render_steps(past) or "(none)",
        remaining=_numbered(state.get("plan", [])) or "(none)",
    )
    reply = await deps.planner.ainvoke(
        [SystemMessage(system), HumanMessage("Write the partial answer.")]
    )
    if state.get("steps_taken", 0) >= budget:
        header = f"**Stopped at the step budget ({budget} steps); this answer is partial.**"
    else:
        header = "**The planner ran out of steps to try; this answer is partial.**"
    await _remember(runtime, state, "partial")
    return {"response": f"{header}\n\n{reply.text}", "outcome": "partial"}


def start_goal(state: State) -> dict[str, Any]:
    """A new message is a new goal: the last goal's plan, history and answer are cleared."""
    return {
        "past_steps": Overwrite([]),
        "plan": [],
        "approved_plan": [],
        "approved_steps": [],
        "response": "",
        "plan_feedback": "",
        "steps_taken": 0,
        "review_rounds": 0,
        "needs_review": False,
    }


def route_after_plan(state: State) -> Literal["review_plan", "__end__"]:
    return "__end__" if state.get("response") else "review_plan"


def route_after_replan(
    state: State, *, budget: int
) -> Literal["__end__", "finalize", "review_plan", "execute_step"]:
    """END once answered; finalize at the budget (or with nothing left); review new steps."""
    if state.get("response"):
        return "__end__"
    if state.get("steps_taken", 0) >= budget or not state.get("plan"):
        return "finalize"
    if state.get("needs_review"):
        return "review_plan"
    return "execute_step"


@dataclass(frozen=True)
class ExecutorDeps:
    """The executor's model, with and without the step's tools."""

    model: BaseChatModel
    with_tools: Runnable[Any, Any]


def build_executor(
    model: BaseChatModel, tools: list[BaseTool]
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """The inner ReAct loop of one step, with its own messages key and model-call limit."""
    deps = ExecutorDeps(model=model, with_tools=model.bind_tools(tools))
    builder = StateGraph(ExecutorState)
    builder.add_node(bind(act, deps=deps))
    builder.add_node(
        "tools", ToolNode(tools, messages_key="step_messages", handle_tool_errors=True)
    )
    builder.add_edge(START, "act")
    builder.add_conditional_edges("act", on_loop(route_tools))
    builder.add_edge("tools", "act")
    return builder.compile(name="executor")


async def act(state: ExecutorState, *, deps: ExecutorDeps) -> dict[str, Any]:
    """One model call of the step; the last allowed call gets no tools, so the step ends."""
    calls = state.get("model_calls", 0)
    messages = state["step_messages"]
    if calls >= EXECUTOR_MODEL_CALLS - 1:
        answer = await deps.model.ainvoke([*messages, HumanMessage(prompts.EXECUTOR_WRAP_UP)])
        reply = limit_tool_calls(answer, 0)  # no further tool calls, whatever the model asks
    else:
        answer = await deps.with_tools.ainvoke(messages)
        reply = limit_tool_calls(answer, TOOL_CALLS_PER_REPLY)
    return {"step_messages": [reply], "model_calls": calls + 1}


def route_tools(state: ExecutorState) -> Literal["tools", "__end__"]:
    return tools_condition(state, messages_key="step_messages")  # type: ignore[arg-type]


def step_result(messages: list[AnyMessage]) -> str:
    """The executor's final words, plus the data they rest on kept verbatim: the last query's
    table (or the last tool output), so the answer can quote exact figures."""
    final = messages[-1] if messages and isinstance(messages[-1], AIMessage) else None
    text = str(final.text).strip() if final is not None else ""
    tool_messages = [m for m in messages if isinstance(m, ToolMessage)]
    outputs = [_unwrap(str(m.text)) for m in tool_messages]
    succeeded = [o for m, o in zip(tool_messages, outputs, strict=True) if not _tool_failed(m, o)]
    if outputs and not succeeded:
        # Every tool call failed or was refused: the step failed, whatever the model's
        # wrap-up claims. Code marks it, so the replanner and the UI see a failed step.
        last = outputs[-1]
        error = (
            last if step_failed(last) else "ERROR: " + re.sub(r"^error:\s*", "", last, flags=re.I)
        )
        return error if not text or text in error else f"{error}\n\n{text}"
    tables = [o for o in succeeded if markdown_tables(o)]
    data = (tables or succeeded or [""])[-1]
    if data and data not in text and not markdown_tables(text) and len(data) <= KEPT_OUTPUT_CHARS:
        text = f"{text}\n\n{data}".strip()
    if not text:
        text = (outputs or ["The step produced no result."])[-1]
    return text


_FAILED_OUTPUT = re.compile(r"^(?:error\b|refused\b)", re.IGNORECASE)


def _tool_failed(message: ToolMessage, output: str) -> bool:
    """A tool error (raised, or returned as text: "ERROR: ...", "Error: ...", "refused: ...")."""
    return message.status == "error" or bool(_FAILED_OUTPUT.match(output))


def render_steps(past: list[StepRecord]) -> str:
    """Recent steps in full; older ones shortened, but their tables of figures kept verbatim
    (the state keeps every result whole)."""
    lines = []
    for position, (index, step, result) in enumerate(past):
        recent = position >= len(past) - RECENT_STEPS_IN_FULL
        lines.append(f"{index}. {step}\nResult:\n{result if recent else _shortened(result)}")
    return "\n\n".join(lines)


def _shortened(result: str) -> str:
    if len(result) <= OLDER_RESULT_CHARS:
        return result
    head = result[:OLDER_RESULT_CHARS] + " …(shortened)"
    tables = [line for line in result.splitlines() if line.startswith("|")]
    kept = "\n".join(tables)[:OLDER_TABLE_CHARS]
    if kept and kept not in head:
        head += "\nFigures from this step:\n" + kept
    return head


def check_contiguous(past: list[StepRecord]) -> None:
    """Step indices run 1..n with no gap or repeat: a duplicated history is a bug, caught here."""
    indices = [index for index, _, _ in past]
    if indices != list(range(1, len(past) + 1)):
        msg = f"past_steps indices are not contiguous: {indices}"
        raise RuntimeError(msg)


def review_request(
    state: State,
    *,
    budget: int,
    max_rounds: int,
    inner_calls: float | None = None,
    per_call: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """What the reviewer sees: the plan, the budget and the expected number of model calls
    (each step's executor calls as measured, `inner_calls`, else the constant, plus a replan);
    with `per_call` (tokens and cost per model call, measured), what they come to."""
    plan = list(state.get("plan", []))
    rounds = state.get("review_rounds", 0)
    steps = min(len(plan), budget)
    per_step = INNER_CALLS_ESTIMATE if inner_calls is None else inner_calls
    calls = 1 + rounds + math.ceil(steps * (per_step + 1))
    estimate = (
        {"estimated_tokens": round(calls * per_call[0]), "estimated_cost": calls * per_call[1]}
        if per_call is not None
        else {}
    )
    return {
        "kind": "planner_review",
        "goal": state.get("input", ""),
        "plan": plan,
        "completed": [step for _, step, _ in map(step_parts, state.get("past_steps", []))],
        "replanned": bool(state.get("needs_review")),
        "step_budget": budget,
        "estimated_model_calls": calls,
        **estimate,
        "edits_left": max(0, max_rounds - rounds),
    }


def parse_review(answer: Any, *, edits_left: int) -> tuple[ReviewDecision | None, str]:
    """The resume value, validated: (decision, "") or (None, why it was refused)."""
    try:
        decision = ReviewDecision.model_validate(answer)
    except ValidationError as exc:
        errors = exc.errors(include_input=False)
        log.warning("refused a malformed plan review answer: %s", errors)
        if any(e["loc"][:1] in (("steps",), ("feedback",)) for e in errors):
            return None, (
                "That edit was not accepted: send at most 12 steps of up to 500 characters "
                "each, or up to 2000 characters of feedback."
            )
        if any("not both" in str(e.get("msg", "")) for e in errors):
            return None, "An edit sends either the new steps or a sentence of feedback, not both."
        return None, "That answer was not understood; choose Approve, Edit or Reject."
    if decision.decision == "edit" and edits_left <= 0:
        return None, "No edits are left for this plan; approve or reject it."
    return decision, ""


_STOP_WORDS = frozenset(
    """about above after again also answer based between calculate compare compute count data
    each every figure figures find from have into latest list most number query result results
    show step steps summarise summarize table tables than that their them then there these this
    those using what when where which with within would your""".split()  # noqa: SIM905
)


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z][a-z0-9_]{3,}", text.lower()) if w not in _STOP_WORDS}


def unrelated_steps(steps: list[str], *, goal: str, approved: list[str]) -> list[str]:
    """New steps sharing no meaningful word with the goal or the approved plan."""
    known = _words(goal).union(*(_words(s) for s in approved))
    return [s for s in steps if s not in approved and not (_words(s) & known)]


async def structured(model: BaseChatModel, schema: type[M], messages: list[Any]) -> M:
    """Structured output validated by schema; one retry, then PlanningFailed."""
    problem: Exception | None = None
    for _ in range(2):
        try:
            answer = await model.with_structured_output(schema).ainvoke(messages)
            # Validated again even when the parser built the object: code, not the parser's
            # leniency, decides what a valid Plan is.
            data = answer.model_dump() if isinstance(answer, BaseModel) else answer
            return schema.model_validate(data)
        except ModelRefusalError as exc:
            # A refusal is an answer, not a glitch: asking again would get the same one.
            log.warning("the model refused to give a %s: %s", schema.__name__, exc)
            msg = f"the model refused to give a {schema.__name__}"
            raise PlanningFailed(msg) from exc
        except (ValidationError, OutputParserException, ValueError, TypeError) as exc:
            problem = exc
            log.warning("invalid %s from the model: %s", schema.__name__, exc)
    # The parser's message quotes the model's output: a line of it is enough for the user.
    why = " ".join(str(problem).split())[:MAX_PROBLEM_CHARS]
    msg = f"the model returned an invalid {schema.__name__} twice: {why}"
    raise PlanningFailed(msg)


def _transient(exc: BaseException) -> bool:
    """Timeouts and rate limits are retried (with backoff); everything else fails the step."""
    import httpx
    import openai

    retryable = (
        TimeoutError,
        httpx.TimeoutException,
        openai.APITimeoutError,
        openai.APIConnectionError,
        openai.RateLimitError,
    )
    return isinstance(exc, retryable)


TRANSIENT_RETRY = RetryPolicy(
    max_attempts=3, initial_interval=1.0, backoff_factor=2.0, retry_on=_transient
)


async def _remember(runtime: Runtime[Context], state: State, outcome: Outcome) -> None:
    """Plan structure and outcome label for the user's future plans, and in a team
    conversation for the team's gallery (never results)."""
    memory = PlanMemory.from_runtime(runtime)
    if memory is None:
        return
    done = [step for _, step, _ in map(step_parts, state.get("past_steps", []))]
    # Only what the reviewer approved: a drafted plan they rejected, or a step the replanner
    # added and ran without review, is model text nobody vouched for.
    approved = set(state.get("approved_steps", []))
    steps = [s for s in done if s in approved]
    steps += [s for s in state.get("plan", []) if s in approved and s not in steps]
    if not steps:
        return
    goal = state.get("input", "")
    thread_id = runtime.context.thread_id
    key = summary_key(thread_id, goal)
    await memory.record(key=key, thread_id=thread_id, goal=goal, steps=steps, outcome=outcome)
    await remember_team_plan(runtime, key=key, goal=goal, steps=steps, outcome=outcome)


def planner_model(role: Literal["planner", "executor"]) -> BaseChatModel:
    from graphs.core.settings import get_settings
    from graphs.planner.offline import offline_planner

    return offline_planner() if get_settings().offline else chat_model(role)


def default_tools(store: BaseStore | None = None) -> list[BaseTool]:
    """Read-only SQL on the analytics database, plus the web search and fetch shared with
    Research (fetches logged per thread; no query strings, so nothing read leaves in a URL)."""
    from graphs.core.settings import get_settings
    from graphs.planner.sql import AnalyticsDatabase
    from graphs.planner.tools import make_tools
    from graphs.tools.web import step_tool_set, web_tools

    return [*make_tools(AnalyticsDatabase()), *step_tool_set(web_tools(store, get_settings()))]


def _clean_steps(steps: list[str], past: list[StepRecord]) -> list[str]:
    """Trimmed, non-empty, no duplicates, none identical to a completed step, capped."""
    completed = {_norm(step) for _, step, _ in past}
    cleaned: list[str] = []
    for step in steps:
        text = " ".join(str(step).split())
        if text and _norm(text) not in completed and text not in cleaned:
            cleaned.append(text)
    return cleaned[:MAX_PLAN_STEPS]


def _norm(step: str) -> str:
    return " ".join(step.lower().split()).rstrip(".")


def _numbered(steps: list[str]) -> str:
    return "\n".join(f"{i}. {s}" for i, s in enumerate(steps, 1))


def _unwrap(text: str) -> str:
    return re.sub(r"</?tool_output[^>]*>", "", text).strip()


def _examples_block(examples: list[Any]) -> str:
    if not examples:
        return ""
    plans = "\n".join(
        f"- goal: {p.goal} ({p.quality}: {p.outcome})\n  steps: " + " | ".join(p.steps)
        for p in examples
    )
    return prompts.EXAMPLES_BLOCK.format(plans=plans)


def _completed_block(past: list[StepRecord]) -> str:
    if not past:
        return ""
    return prompts.COMPLETED_BLOCK.format(steps=_numbered([step for _, step, _ in past]))


def _feedback_block(feedback: str, previous: list[str]) -> str:
    if not feedback:
        return ""
    return prompts.FEEDBACK_BLOCK.format(feedback=feedback, previous=_numbered(previous))
