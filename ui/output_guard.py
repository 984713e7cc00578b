"""The one door model text passes to reach a browser: every step, token and task title sent is sanitised.

The policy lives here; ui/chainlit/patches/output.py puts it in Chainlit's way out (the emitter, task
lists) and ui/data_layer.py applies it to what is stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, TypeVar, cast

from graphs.core.text import without_controls
from ui.render import RenderPolicy, origin_of, sanitise

TRUSTED_LINKS_KEY = "trusted_links"
"""Step metadata: exact URLs this conversation fetched itself (set by the app, never the model)."""

_policy = RenderPolicy()


def configure(*, public_url: str, image_origins: list[str]) -> None:
    """The origins whose links and images are the app's own or allowed."""
    global _policy
    own = origin_of(public_url)
    _policy = RenderPolicy(
        own_origins=frozenset({own} if own else ()),
        image_origins=frozenset(o for o in map(origin_of, image_origins) if o),
    )


def policy_for(step: Any) -> RenderPolicy:
    """A user's own message keeps its links whole; anything else loses data in links."""
    metadata = step.get("metadata")
    trusted = metadata.get(TRUSTED_LINKS_KEY) if isinstance(metadata, dict) else None
    return RenderPolicy(
        own_origins=_policy.own_origins,
        image_origins=_policy.image_origins,
        trusted_links=frozenset(str(u) for u in trusted)
        if isinstance(trusted, list)
        else frozenset(),
        strip_link_queries=step.get("type") != "user_message",
    )


StepT = TypeVar("StepT", bound=Mapping[str, Any])


def sanitise_step(step: StepT) -> StepT:
    """A copy of a step dict (sent or stored) whose shown text is inert."""
    clean: dict[str, Any] = dict(step)
    policy = policy_for(clean)
    for key in ("output", "input"):
        if isinstance(value := clean.get(key), str) and value:
            clean[key] = sanitise(value, policy)
    if isinstance(name := clean.get("name"), str):
        # A tool's or a plan step's name is the model's text too (shown as plain text).
        clean["name"] = without_controls(name)
    return cast("StepT", clean)


def sanitise_text(text: str) -> str:
    return sanitise(text, _policy)


def sanitise_report(text: str, trusted_links: list[str]) -> str:
    """A research report for attachments: as in the chat, with its cited sources kept whole."""
    return sanitise(text, replace(_policy, trusted_links=frozenset(trusted_links)))
