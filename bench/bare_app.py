"""Baseline for bench.ttft: a bare Chainlit handler streaming what the offline model would."""

import re

import chainlit as cl

from graphs.core.offline import REPLY_PREFIX


@cl.on_message
async def echo(message: cl.Message) -> None:
    """The offline model's reply, word by word as it chunks it; no auth, graph or data layer."""
    reply = cl.Message(content="")
    for word in re.findall(r"\S+\s*|\s+", f"{REPLY_PREFIX}You said: {message.content}"):
        await reply.stream_token(word)
    await reply.send()
