"""Chainlit entry point: wires Chainlit's hooks to the handlers in ui/. Nothing else."""

import chainlit as cl
from chainlit.server import app

from auth.oauth import oauth_callback
from ui import chat, runtime
from ui.actions import ANSWER_ACTION, RETRY_ACTION
from ui.chainlit_patches import exit_if_startup_fails, on_message_edit
from ui.data_layer import PostgresDataLayer

# Also installs every Chainlit patch (ui/chainlit_patches.py) before Chainlit serves.
_runtime = runtime.prepare(app)

cl.on_app_startup(exit_if_startup_fails(runtime.start))
cl.on_app_shutdown(runtime.stop)
cl.data_layer(lambda: PostgresDataLayer(_runtime.pool, on_delete=runtime.delete_thread_data))
cl.oauth_callback(oauth_callback)
cl.set_chat_profiles(chat.chat_profiles)
cl.on_chat_start(chat.start_chat)
cl.on_chat_resume(chat.resume_chat)
cl.on_message(chat.handle_message)
on_message_edit(chat.edit_message)
cl.on_settings_update(chat.update_settings)
cl.action_callback(RETRY_ACTION)(chat.retry_turn)
cl.action_callback(ANSWER_ACTION)(chat.answer_question)
