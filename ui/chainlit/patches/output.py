"""Output: model text reaches the browser only sanitised (the policy is ui/output_guard.py)."""

from __future__ import annotations

import logging

import chainlit.config
import chainlit.element
import chainlit.emitter
from chainlit.config import config as chainlit_config
from chainlit.emitter import ChainlitEmitter

from ui.output_guard import policy_for, sanitise_step, sanitise_text
from ui.render import StreamSanitiser

log = logging.getLogger("cairn.security")


CHAINLIT_TASK_CONTENT = chainlit.element.TaskList.preprocess_content
"""Chainlit's own, which the sanitised one runs after cleaning the titles."""

OUTPUT_PINS = {
    "chainlit.context.ChainlitContext.__init__": "db4773091d52bf7c",
    "chainlit.emitter.ChainlitEmitter.send_step": "0e6ea166c8cd61d8",
    "chainlit.emitter.ChainlitEmitter.update_step": "9f1d88f4d70d73ef",
    "chainlit.emitter.ChainlitEmitter.stream_start": "57cc98ddf3106063",
    "chainlit.emitter.ChainlitEmitter.send_token": "2783e8a7947f8c6b",
    "chainlit.element.TaskList.preprocess_content": "ca9e5fd7b52bbbaf",
}
"""The Chainlit code this module relies on (qualified name: digest of its source as checked),
tripped by tests/unit/test_chainlit_patches.py when an upgrade changes it."""


def guard_output() -> None:
    """Chainlit's emitter and task list, replaced by sanitising ones.

    Chainlit builds `chainlit.emitter.ChainlitEmitter(session)` for every event, looking the
    name up in that module each time (context.py `ChainlitContext.__init__`); a task list's
    titles leave in `TaskList.preprocess_content`. Raw HTML in Markdown stays off for good,
    whatever config.toml says.
    """
    chainlit_config.features.unsafe_allow_html = False
    chainlit.emitter.ChainlitEmitter = SanitisingEmitter  # type: ignore[misc]
    chainlit.element.TaskList.preprocess_content = _sanitised_task_content  # type: ignore[method-assign]


async def _sanitised_task_content(self: chainlit.element.TaskList) -> None:
    for task in self.tasks:
        task.title = sanitise_text(task.title)
    await CHAINLIT_TASK_CONTENT(self)


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
