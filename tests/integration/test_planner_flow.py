"""The Planner end to end on Postgres with the offline model: demo data, checkpoints, plan memory."""

from __future__ import annotations

import pytest
from langgraph.types import Command

from auth.ownership import ThreadNotFound, claim_thread, require_owner
from graphs.core.context import Context
from graphs.planner.graph import build_graph
from graphs.planner.offline import offline_planner
from graphs.planner.sql import AnalyticsDatabase, analyst_url, markdown_tables
from graphs.planner.tools import make_tools

pytestmark = pytest.mark.integration

GOAL = "Which region had the highest churn last quarter?"


@pytest.fixture(scope="module")
async def planner(persistence, database_url):
    # The demo dataset is a migration: the persistence fixture applied it.
    tools = make_tools(AnalyticsDatabase(analyst_url(database_url), timeout_ms=3000))
    return build_graph(
        checkpointer=persistence.checkpointer,
        store=persistence.store,
        model=offline_planner(),
        tools=tools,
    )


def config(thread: str) -> dict:
    return {"configurable": {"thread_id": thread}}


async def test_a_churn_question_gets_a_plan_real_queries_and_an_answer(planner, persistence):
    ctx = Context(user_id="alice", thread_id="flow-1", agent="planner")
    paused = await planner.ainvoke({"input": GOAL}, config("flow-1"), context=ctx)
    plan = paused["__interrupt__"][0].value["plan"]
    assert any("churn" in step.lower() and "region" in step.lower() for step in plan)

    done = await planner.ainvoke(
        Command(resume={"decision": "approve"}), config("flow-1"), context=ctx
    )
    results = [r[2] for r in done["past_steps"]]
    assert "analytics_demo.churn_events" in results[0]  # list_tables ran as the analyst role
    assert "lost_mrr" in results[1]  # describe_table
    assert results[2].startswith("(offline model) sql_query returned the data below.")
    table = markdown_tables(results[2])[0]
    assert table.columns == ["region", "churned_customers", "lost_mrr"]
    assert table.numeric_by_category() is not None
    assert "| region |" in done["response"]
    assert done["outcome"] == "answered"

    # The summary landed in alice's plan namespace, searchable by meaning, without rows.
    found = await persistence.store.asearch(("alice", "plans"), query="churn per region")
    assert [f.value["outcome"] for f in found] == ["answered"]
    assert "churned_customers" not in str(found[0].value)
    assert await persistence.store.asearch(("bob", "plans"), query="churn per region") == []


async def test_the_pause_is_durable_and_another_user_cannot_reach_it(planner, persistence):
    thread = "flow-owned"
    await claim_thread(persistence.pool, thread_id=thread, user_id="alice", agent="planner")
    ctx = Context(user_id="alice", thread_id=thread, agent="planner")
    await planner.ainvoke({"input": GOAL}, config(thread), context=ctx)

    # A graph compiled afresh (a restarted worker) still sees the pending review.
    rebuilt = build_graph(
        checkpointer=persistence.checkpointer, store=persistence.store, model=offline_planner()
    )
    state = await rebuilt.aget_state(config(thread))
    assert state.interrupts[0].value["kind"] == "planner_review"

    # Every UI path (resume, button, state read) asks require_owner first: bob is refused,
    # exactly as for a thread that does not exist.
    with pytest.raises(ThreadNotFound) as foreign:
        await require_owner(persistence.pool, thread_id=thread, user_id="bob")
    with pytest.raises(ThreadNotFound) as unknown:
        await require_owner(persistence.pool, thread_id="no-such-thread", user_id="bob")
    assert str(foreign.value) == str(unknown.value)
    with pytest.raises(ThreadNotFound):
        await claim_thread(persistence.pool, thread_id=thread, user_id="bob", agent="planner")
    owned = await require_owner(persistence.pool, thread_id=thread, user_id="alice")
    assert owned.agent == "planner"


async def test_deleting_the_conversation_deletes_its_plan_summary(planner, persistence):
    from auth.sessions import SessionRevocations
    from graphs.memory.plans import PlanMemory
    from graphs.memory.privacy import Privacy

    thread = "flow-deleted"
    await claim_thread(persistence.pool, thread_id=thread, user_id="dora", agent="planner")
    ctx = Context(user_id="dora", thread_id=thread, agent="planner")
    await planner.ainvoke({"input": GOAL}, config(thread), context=ctx)
    await planner.ainvoke(Command(resume={"decision": "approve"}), config(thread), context=ctx)
    plans = PlanMemory(persistence.store, "dora")
    assert await plans.count() == 1  # only approved plans are remembered

    privacy = Privacy(
        pool=persistence.pool,
        store=persistence.store,
        checkpointer=persistence.checkpointer,
        memory_jobs=None,
        revocations=SessionRevocations(persistence.pool),
        default_retention_days=365,
    )
    await privacy.delete_conversation(user_id="dora", thread_id=thread, forget=False)
    assert await plans.count() == 0
