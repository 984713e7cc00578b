"""The chat profiles and the graph behind each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from graphs.assistant.graph import DURABILITY as ASSISTANT_DURABILITY
from graphs.assistant.graph import build_graph as build_assistant
from graphs.planner.graph import build_graph as build_planner
from graphs.research.graph import build_graph as build_research

if TYPE_CHECKING:
    from collections.abc import Callable

    from langgraph.types import Durability


@dataclass(frozen=True)
class Agent:
    key: str
    """Stable name stored with each thread (cairn_threads.agent)."""
    profile: str
    """Chainlit chat profile name shown to users."""
    description: str
    build: Callable[..., Any] | None
    """build_graph(*, checkpointer, store, model=None); None while the agent is not built yet."""
    reply_node: str = "assistant"
    """The node whose tokens are streamed as the reply."""
    durability: Durability = "async"
    """When runs are checkpointed: after every step, or once when the run ends ("exit")."""


AGENTS: tuple[Agent, ...] = (
    Agent(
        key="assistant",
        profile="Assistant",
        description="A personal assistant that remembers you across conversations.",
        build=build_assistant,
        durability=ASSISTANT_DURABILITY,
    ),
    Agent(
        key="research",
        profile="Research",
        description="Deep research with sources you can check: you approve the topics, every "
        "citation in the report is checked against a page Cairn actually fetched.",
        build=build_research,
        reply_node="finalize",
    ),
    Agent(
        key="planner",
        profile="Planner",
        description="Plans an analysis as steps you approve or edit, then runs them with "
        "read-only SQL (on a bundled demo dataset unless configured), replanning as results "
        "come in, and answers with tables and charts.",
        build=build_planner,
        reply_node="finalize",
    ),
)


def agent_for_profile(profile: str | None) -> Agent:
    return next((a for a in AGENTS if a.profile == profile), AGENTS[0])


def agent_by_key(key: str) -> Agent:
    return next((a for a in AGENTS if a.key == key), AGENTS[0])
