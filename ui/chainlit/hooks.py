"""Chainlit's hooks, wired to one worker's handlers.

`register` is called by the adapter (ui/chainlit/adapter.py) before it mounts Chainlit.
chainlit.utils.mount_chainlit also loads this file by path as its "target" module; executing
it again only defines `register`, which nothing then calls, so the hooks are registered once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from chainlit.data.base import BaseDataLayer

    from ui.chainlit.chat import ChatHandlers


def register(handlers: ChatHandlers, *, data_layer: Callable[[], BaseDataLayer]) -> None:
    import chainlit as cl

    from ui.chainlit.actions import ANSWER_ACTION, RETRY_ACTION
    from ui.chainlit.oauth import audited_oauth_callback
    from ui.chainlit.patches.edits import on_message_edit

    cl.data_layer(data_layer)
    cl.oauth_callback(audited_oauth_callback(handlers.runtime))
    cl.set_chat_profiles(handlers.chat_profiles)
    cl.set_starters(handlers.starters)
    cl.on_chat_start(handlers.start_chat)
    cl.on_chat_resume(handlers.resume_chat)
    cl.on_message(handlers.handle_message)
    on_message_edit(handlers.edit_message)
    cl.on_settings_update(handlers.update_settings)
    cl.action_callback(RETRY_ACTION)(handlers.retry_turn)
    cl.action_callback(ANSWER_ACTION)(handlers.answer_question)
