"""How many of a model reply's tool calls may run: code decides, never the model."""

from __future__ import annotations

import logging

from langchain_core.messages import AIMessage

log = logging.getLogger("cairn.models")

_RAW_CALL_KEYS = frozenset({"tool_calls", "function_call"})


def limit_tool_calls(reply: AIMessage, allowed: int) -> AIMessage:
    """`reply` with at most its first `allowed` tool calls; calls with unreadable arguments and
    the rest are dropped, so a reply asking for a thousand calls runs `allowed` of them.

    A trimmed reply loses the provider's raw copy of the calls too: Chat Completions would
    otherwise be sent calls that never got an answer and refuse every later request of the
    thread.
    """
    calls = list(reply.tool_calls)
    kept = calls[: max(allowed, 0)]
    dropped = len(calls) - len(kept) + len(reply.invalid_tool_calls)
    if not dropped:
        return reply
    log.warning(
        "dropped %d of the model's %d tool calls (%d allowed)",
        dropped,
        len(calls) + len(reply.invalid_tool_calls),
        allowed,
    )
    extra = {k: v for k, v in reply.additional_kwargs.items() if k not in _RAW_CALL_KEYS}
    return AIMessage(
        content=reply.content,
        tool_calls=kept,
        additional_kwargs=extra,
        response_metadata=reply.response_metadata,
        usage_metadata=reply.usage_metadata,
        name=reply.name,
        id=reply.id,
    )
