"""State of the Assistant graph."""

from __future__ import annotations

from typing import Annotated, TypedDict

from langchain_core.messages import AnyMessage
from langgraph.graph.message import add_messages


class State(TypedDict):
    """The conversation; the checkpoint keeps all of it, the model sees a trimmed window."""

    messages: Annotated[list[AnyMessage], add_messages]
