"""Rate limits for outside services: one token bucket per provider (in Postgres, shared by every worker), retries with backoff and jitter."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from graphs.core.ratelimit import Bucket, PgTokenBucket, TokenBucket

T = TypeVar("T")


class RateLimited(RuntimeError):
    """The provider said slow down (HTTP 429 or its equivalent); worth retrying after a wait."""


_buckets: dict[str, TokenBucket] = {}


def bucket_for(provider: str, *, rate: float = 1.0, capacity: int = 3) -> TokenBucket:
    """The process-wide bucket of one provider (created on first use)."""
    if provider not in _buckets:
        _buckets[provider] = TokenBucket(rate, capacity)
    return _buckets[provider]


def shared_bucket(store: Any, provider: str, *, rate: float, capacity: int = 3) -> Bucket:
    """The provider's bucket in Postgres when the graph runs on the app's Postgres store (every
    worker shares it), else this process's."""
    pool = getattr(store, "conn", None)
    if pool is not None and hasattr(pool, "connection"):
        return PgTokenBucket(pool, provider, rate=rate, capacity=capacity)
    return bucket_for(provider, rate=rate, capacity=capacity)


async def call_limited(
    bucket: Bucket,
    call: Callable[[], Awaitable[T]],
    *,
    attempts: int = 3,
    max_wait_s: float = 8.0,
) -> T:
    """Take a token per attempt; retry RateLimited with exponential backoff plus jitter."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(RateLimited),
        wait=wait_random_exponential(multiplier=0.5, max=max_wait_s),
        stop=stop_after_attempt(attempts),
        reraise=True,
    ):
        with attempt:
            await bucket.acquire()
            return await call()
    msg = "unreachable: tenacity either returns or re-raises"
    raise AssertionError(msg)
