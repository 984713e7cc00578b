"""Graphs as LangGraph Studio / `langgraph dev` loads them: its server supplies persistence."""

from graphs.assistant.graph import build_graph as _build_assistant
from graphs.planner.graph import build_graph as _build_planner
from graphs.research.graph import build_graph as _build_research

assistant = _build_assistant(checkpointer=None, store=None)
research = _build_research(checkpointer=None, store=None)
planner = _build_planner(checkpointer=None, store=None)
