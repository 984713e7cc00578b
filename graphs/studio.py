"""Graphs as LangGraph Studio / `langgraph dev` loads them: its server supplies persistence."""

from graphs.assistant.graph import build_graph as _build_assistant

assistant = _build_assistant(checkpointer=None, store=None)
