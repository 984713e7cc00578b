"""Chainlit entry point: wires Chainlit's hooks to the handlers in ui/. Nothing else."""

import chainlit as cl
import chainlit.server
from chainlit.server import app

from auth.oauth import oauth_callback
from ui import chat, event_loop, runtime
from ui.actions import ANSWER_ACTION, RETRY_ACTION
from ui.data_layer import PostgresDataLayer, require_thread_author

_runtime = runtime.prepare(app)
event_loop.install()

# Unknown and foreign threads get the same refusal on every Chainlit thread endpoint.
chainlit.server.is_thread_author = require_thread_author  # type: ignore[assignment]

cl.on_app_startup(runtime.start)
cl.on_app_shutdown(runtime.stop)
cl.data_layer(lambda: PostgresDataLayer(_runtime.pool, on_delete=runtime.delete_thread_data))
cl.oauth_callback(oauth_callback)
cl.set_chat_profiles(chat.chat_profiles)
cl.on_chat_start(chat.start_chat)
cl.on_chat_resume(chat.resume_chat)
cl.on_message(chat.handle_message)
cl.on_settings_update(chat.update_settings)
cl.action_callback(RETRY_ACTION)(chat.retry_turn)
cl.action_callback(ANSWER_ACTION)(chat.answer_question)
