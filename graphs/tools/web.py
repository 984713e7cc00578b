"""The web tools shared by Research and the Planner: one search provider and one SSRF-safe
fetcher whose every fetch lands in the thread's fetch log."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from langchain_core.tools import BaseTool, tool
from langgraph.prebuilt import ToolRuntime

from graphs.core.context import Context
from graphs.core.ratelimit import Bucket
from graphs.tools.fetch import Fetcher, FetchError, wrap_untrusted
from graphs.tools.fetchlog import fetch_log_for_store
from graphs.tools.netguard import BlockedAddress
from graphs.tools.ratelimit import shared_bucket
from graphs.tools.search import (
    LocalCorpus,
    SearchProvider,
    make_search_tool,
    provider_from_settings,
    search_rate,
)

if TYPE_CHECKING:
    from langgraph.store.base import BaseStore

    from graphs.core.settings import Settings


@dataclass(frozen=True)
class WebTools:
    search: SearchProvider
    fetcher: Fetcher
    limiter: Bucket | None = None
    """The search provider's rate limit (None: this process's bucket for it)."""


def web_tools(store: BaseStore | None, settings: Settings) -> WebTools:
    """The configured search provider (the local corpus by default), its rate limit shared by
    every worker on the app's Postgres, and a logged fetcher."""
    corpus = LocalCorpus(settings.research_corpus_dir, store=store)
    fetcher = Fetcher(log=fetch_log_for_store(store), openers={"corpus": corpus.open})
    search = provider_from_settings(settings, corpus)
    limiter = shared_bucket(store, f"search:{search.name}", rate=search_rate(search))
    return WebTools(search=search, fetcher=fetcher, limiter=limiter)


def step_tool_set(tools: WebTools) -> list[BaseTool]:
    """For the Planner's executor: search, and fetch without a query string, so a step cannot
    send data it read (SQL results) out to a server inside a URL."""
    fetcher = tools.fetcher

    @tool
    async def fetch_url(url: str, runtime: ToolRuntime[Context, Any]) -> str:
        """Fetch one web page (or a local corpus document) found by web_search; returns its text.

        Args:
            url: The http(s) or corpus:// URL exactly as web_search gave it, with no query string.
        """
        parts = urlsplit(url.strip())
        if parts.query or parts.fragment or parts.username or parts.password:
            return (
                "Error: the planner fetches plain page addresses only (no query string, "
                "fragment or credentials). Use web_search to find pages."
            )
        if runtime.context is None:
            return "Error: this run has no thread context; nothing was fetched."
        try:
            record = await fetcher.fetch(url, thread_id=runtime.context.thread_id)
        except (FetchError, BlockedAddress) as exc:
            return f"Error: could not fetch {url}: {exc}."
        return wrap_untrusted(record)

    return [make_search_tool(tools.search, tools.limiter), fetch_url]
