"""The empty chat's welcome: each agent's profile with its icon, what it does and its starters."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import chainlit as cl

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ui.runner import AgentSpec

PUBLIC = Path(__file__).resolve().parents[2] / "public"
FALLBACK_ICON = "/public/agents/agent.svg"


def icon(agent: AgentSpec) -> str:
    """`public/agents/<key>.svg`, or a plain one for an agent that has none."""
    own = PUBLIC / "agents" / f"{agent.key}.svg"
    return f"/public/agents/{agent.key}.svg" if own.is_file() else FALLBACK_ICON


def welcome(agent: AgentSpec, agents: Sequence[AgentSpec]) -> str:
    """What the agent does, then the others by name: Chainlit shows it under the icon of the
    chosen profile on an empty chat, and in the profile menu."""
    others = [a.profile for a in agents if a.key != agent.key]
    also = ""
    if others:
        names = " or ".join(f"**{name}**" for name in others)
        also = f"\n\nSwitch to {names} in the menu at the top to see what they do."
    return f"**{agent.profile}**: {agent.description}{also}"


def starters(agent: AgentSpec) -> list[cl.Starter]:
    return [cl.Starter(label=s.label, message=s.message) for s in agent.starters]


def chat_profiles(agents: Sequence[AgentSpec]) -> list[cl.ChatProfile]:
    return [
        cl.ChatProfile(
            name=agent.profile,
            markdown_description=welcome(agent, agents),
            icon=icon(agent),
            default=i == 0,
            starters=starters(agent) or None,
        )
        for i, agent in enumerate(agents)
    ]
