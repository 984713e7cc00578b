"""Chat model factory: ChatOpenAI over Chat Completions, or the offline stand-in without a key."""

from __future__ import annotations

from langchain_core.language_models import BaseChatModel
from langchain_openai import ChatOpenAI

from graphs.core.offline import OfflineChatModel
from graphs.core.settings import ModelRole, Settings, get_settings

ROLE_KEY = "cairn_role"
"""The model's metadata key naming its role (seen by callbacks on every call)."""

OFFLINE_NOTICE = (
    "No model key is configured: Cairn is running its offline stand-in model. "
    "Replies are canned, not intelligent. Set OPENAI_API_KEY (and OPENAI_BASE_URL for "
    "another OpenAI-compatible server) and restart to use a real model."
)


def chat_model(
    role: ModelRole, settings: Settings | None = None, *, streaming: bool = True
) -> BaseChatModel:
    """The chat model for one role: the configured server, or the offline model without a key."""
    settings = settings or get_settings()
    # Every call says which role made it, so its tokens are priced as that role's
    # (graphs/core/usage.py).
    metadata = {ROLE_KEY: role}
    if settings.offline:
        return OfflineChatModel(metadata=metadata)
    return ChatOpenAI(
        metadata=metadata,
        model=settings.model_name(role),
        api_key=settings.openai_api_key,
        base_url=settings.openai_base_url,
        # Chat Completions is what every OpenAI-compatible server speaks.
        use_responses_api=False,
        streaming=streaming,
        timeout=settings.model_timeout_s,
        max_retries=settings.model_max_retries,
        stream_usage=True,
    )


def offline_notice(settings: Settings | None = None) -> str | None:
    """A sentence for the UI when the offline stand-in answers instead of a real model."""
    settings = settings or get_settings()
    return OFFLINE_NOTICE if settings.offline else None
