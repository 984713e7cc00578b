"""Graphs as LangGraph Studio / `langgraph dev` loads them: its server supplies persistence.

The Planner is a factory, called by the server before each run: the first call applies the
app's migrations to the app's database (embedded Postgres unless CAIRN_DATABASE_URL is set),
which create the demo tables and the read-only role its SQL tools query. Runs need the
context the app sets from the session: `{"user_id": ..., "thread_id": ...}`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graphs.assistant.graph import build_graph as _build_assistant
from graphs.planner.graph import build_graph as _build_planner
from graphs.research.graph import build_graph as _build_research

if TYPE_CHECKING:
    from langgraph.graph.state import CompiledStateGraph

assistant = _build_assistant(checkpointer=None, store=None)
research = _build_research(checkpointer=None, store=None)
_planner = _build_planner(checkpointer=None, store=None)
_analytics_ready = False


async def planner() -> CompiledStateGraph[Any, Any, Any, Any]:
    """The Planner, once the database its SQL tools read is set up."""
    global _analytics_ready
    if not _analytics_ready:
        await prepare_analytics()
        _analytics_ready = True
    return _planner


async def prepare_analytics() -> None:
    """Apply the migrations the app applies at start-up that the Planner's tools depend on.

    Safe to repeat and to race: migrate() takes an advisory lock and skips what is applied.
    """
    from graphs.core.migrations import migrate
    from graphs.core.persistence import database_url, make_pool
    from graphs.core.settings import get_settings

    pool = make_pool(await database_url(get_settings()), min_size=1, max_size=1)
    await pool.open(wait=True, timeout=30)
    try:
        # The app's one ordered list (pgvector and the demo dataset are in it).
        await migrate(pool)
    finally:
        await pool.close()
