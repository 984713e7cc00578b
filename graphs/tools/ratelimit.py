"""Rate limits for outside services: one token bucket per provider, retries with backoff and jitter."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

T = TypeVar("T")


class RateLimited(RuntimeError):
    """The provider said slow down (HTTP 429 or its equivalent); worth retrying after a wait."""


class TokenBucket:
    """`rate` calls per second on average, bursts up to `capacity`; shared by every caller."""

    def __init__(self, rate: float, capacity: int) -> None:
        if rate <= 0 or capacity < 1:
            msg = "a token bucket needs a positive rate and capacity"
            raise ValueError(msg)
        self.rate = rate
        self.capacity = capacity
        self._tokens = float(capacity)
        self._stamp = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self._lock:
            while True:
                now = time.monotonic()
                self._tokens = min(self.capacity, self._tokens + (now - self._stamp) * self.rate)
                self._stamp = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                await asyncio.sleep((1 - self._tokens) / self.rate)


_buckets: dict[str, TokenBucket] = {}


def bucket_for(provider: str, *, rate: float = 1.0, capacity: int = 3) -> TokenBucket:
    """The process-wide bucket of one provider (created on first use)."""
    if provider not in _buckets:
        _buckets[provider] = TokenBucket(rate, capacity)
    return _buckets[provider]


async def call_limited(
    bucket: TokenBucket,
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
