"""Search providers, the shared rate limiter and the subagent caps: clear errors, never invented results."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from graphs.core.ratelimit import TokenBucket
from graphs.research import SAMPLE_CORPUS_DIR
from graphs.research.agents import SubagentSlots
from graphs.tools.ratelimit import RateLimited, call_limited
from graphs.tools.search import (
    LocalCorpus,
    SearchError,
    SearchResult,
    SearxngSearch,
    TavilySearch,
    make_search_tool,
)


async def test_local_corpus_ranks_by_topic_and_serves_only_its_documents():
    corpus = LocalCorpus(SAMPLE_CORPUS_DIR)
    results = await corpus.search("waggle dance direction of food", max_results=3)
    assert results[0].url == "corpus://sample/bees-waggle-dance.md"
    assert "waggle" in results[0].snippet.lower()
    title, text = await corpus.open("corpus://sample/seed-vault-design.html")
    assert title == "Inside the seed vault: design and cooling"
    assert "minus 18 degrees Celsius" in text
    assert "Copyright notice" not in text  # boilerplate stripped by trafilatura
    with pytest.raises(LookupError):
        await corpus.open("corpus://sample/../../../etc/passwd")
    assert await corpus.search("quantum chromodynamics lattice") == []


async def test_token_bucket_spaces_calls_beyond_the_burst():
    bucket = TokenBucket(rate=20.0, capacity=1)
    started = time.monotonic()
    for _ in range(3):
        await bucket.acquire()
    assert time.monotonic() - started >= 0.08  # two refills at 20/s
    with pytest.raises(ValueError, match="positive"):
        TokenBucket(rate=0, capacity=1)


async def test_rate_limited_calls_are_retried_then_reported():
    attempts = 0

    async def flaky() -> str:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise RateLimited("slow down")
        return "ok"

    bucket = TokenBucket(rate=1000.0, capacity=10)
    assert await call_limited(bucket, flaky, attempts=3, max_wait_s=0.01) == "ok"
    assert attempts == 3

    async def always_limited() -> str:
        raise RateLimited("slow down")

    with pytest.raises(RateLimited):
        await call_limited(bucket, always_limited, attempts=2, max_wait_s=0.01)


def _transport(responses: list[httpx.Response]) -> httpx.MockTransport:
    queue = list(responses)
    return httpx.MockTransport(lambda request: queue.pop(0))


async def test_tavily_and_searxng_results_are_parsed():
    tavily = TavilySearch(
        "key",
        transport=_transport(
            [
                httpx.Response(
                    200,
                    json={"results": [{"title": "T", "url": "https://t.example/", "content": "c"}]},
                )
            ]
        ),
    )
    assert await tavily.search("q", max_results=1) == [SearchResult("T", "https://t.example/", "c")]
    searx = SearxngSearch(
        "http://searx.internal",
        transport=_transport(
            [
                httpx.Response(
                    200,
                    json={"results": [{"title": "S", "url": "https://s.example/", "content": "d"}]},
                )
            ]
        ),
    )
    assert (await searx.search("q", max_results=3))[0].url == "https://s.example/"
    broken = TavilySearch("key", transport=_transport([httpx.Response(500)]))
    with pytest.raises(SearchError, match="HTTP 500"):
        await broken.search("q")


async def test_a_failing_provider_gives_the_model_a_clear_error_not_results():
    limited = TavilySearch("key", transport=_transport([httpx.Response(429)] * 3))
    tool = make_search_tool(limited, TokenBucket(rate=1000.0, capacity=10))
    text = await tool.ainvoke({"query": "seed vault"})
    assert text.startswith("Error: search failed")
    assert "do not invent" in text
    assert (await tool.ainvoke({"query": "   "})).startswith("Error")


async def test_subagent_slots_cap_concurrency_per_thread_and_per_user():
    slots = SubagentSlots(1)
    running = 0
    peak = 0

    async def work(user: str, thread: str) -> None:
        nonlocal running, peak
        async with slots.hold(user_id=user, thread_id=thread):
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.01)
            running -= 1

    # Same thread, and two threads of the same user: one at a time.
    await asyncio.gather(work("u", "t1"), work("u", "t1"), work("u", "t2"))
    assert peak == 1
    # Different users on different threads do run together.
    peak = 0
    await asyncio.gather(work("a", "ta"), work("b", "tb"))
    assert peak == 2
