"""The one door model text passes to reach a browser: every step, token and task title sent is sanitised."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

import chainlit.element
import chainlit.emitter
from chainlit.config import config as chainlit_config
from chainlit.emitter import ChainlitEmitter
from chainlit.step import StepDict

from ui.render import RenderPolicy, StreamSanitiser, origin_of, sanitise

TRUSTED_LINKS_KEY = "trusted_links"
"""Step metadata: exact URLs this conversation fetched itself (set by the app, never the model)."""

_policy = RenderPolicy()
_original_task_content = chainlit.element.TaskList.preprocess_content


def configure(*, public_url: str, image_origins: list[str]) -> None:
    """Install the sanitising emitter and task list; raw HTML in Markdown stays off for good."""
    global _policy
    own = origin_of(public_url)
    _policy = RenderPolicy(
        own_origins=frozenset({own} if own else ()),
        image_origins=frozenset(o for o in map(origin_of, image_origins) if o),
    )
    chainlit_config.features.unsafe_allow_html = False
    chainlit.emitter.ChainlitEmitter = SanitisingEmitter  # type: ignore[misc]
    chainlit.element.TaskList.preprocess_content = _sanitised_task_content  # type: ignore[method-assign]


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


def sanitise_step(step: StepDict) -> StepDict:
    """A copy of a step dict (sent or stored) whose shown text is inert."""
    clean = cast("dict[str, Any]", dict(step))
    policy = policy_for(clean)
    for key in ("output", "input"):
        if isinstance(value := clean.get(key), str) and value:
            clean[key] = sanitise(value, policy)
    return cast("StepDict", clean)


def sanitise_text(text: str) -> str:
    return sanitise(text, _policy)


def sanitise_report(text: str, trusted_links: list[str]) -> str:
    """A research report for attachments: as in the chat, with its cited sources kept whole."""
    return sanitise(text, replace(_policy, trusted_links=frozenset(trusted_links)))


async def _sanitised_task_content(self: chainlit.element.TaskList) -> None:
    for task in self.tasks:
        task.title = sanitise(task.title, _policy)
    await _original_task_content(self)


class SanitisingEmitter(ChainlitEmitter):
    """Chainlit's emitter with model text sanitised on the way out, streamed tokens included."""

    @property
    def _streams(self) -> dict[str, StreamSanitiser]:
        # Chainlit makes an emitter per event; a stream belongs to the session.
        streams = getattr(self.session, "cairn_streams", None)
        if streams is None:
            streams = {}
            self.session.cairn_streams = streams  # type: ignore[attr-defined]
        return streams

    def send_step(self, step_dict):  # type: ignore[no-untyped-def]
        self._streams.pop(str(step_dict.get("id")), None)
        return super().send_step(sanitise_step(step_dict))

    def update_step(self, step_dict):  # type: ignore[no-untyped-def]
        self._streams.pop(str(step_dict.get("id")), None)
        return super().update_step(sanitise_step(step_dict))

    def stream_start(self, step_dict):  # type: ignore[no-untyped-def]
        stream = StreamSanitiser(policy_for(step_dict))
        self._streams[str(step_dict.get("id"))] = stream
        stream.feed(str(step_dict.get("output") or ""))
        return super().stream_start({**step_dict, "output": stream.shown})

    async def send_token(self, id: str, token: str, is_sequence=False, is_input=False):  # type: ignore[no-untyped-def]
        stream = self._streams.get(id)
        if stream is None:
            # A stream this emitter never saw start: nothing of it is shown until its final send.
            return None
        out = stream.feed(token, replace=is_sequence)
        if out is None:
            return None
        text, replace = out
        return await super().send_token(id, text, is_sequence=replace, is_input=is_input)

    def send_ask_user(self, step_dict, spec, raise_on_timeout=False):  # type: ignore[no-untyped-def]
        return super().send_ask_user(sanitise_step(step_dict), spec, raise_on_timeout)
