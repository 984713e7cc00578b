"""Rate limits for outside services: one token bucket per provider (in Postgres, shared by every worker), retries with backoff and jitter."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

if TYPE_CHECKING:
    from graphs.core.pool import Pool

T = TypeVar("T")


class Bucket(Protocol):
    async def acquire(self) -> None:
        """Wait for, and take, one call's token."""
        ...


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


_TAKE = """
WITH now AS (SELECT clock_timestamp() AS t),
seed AS (
    INSERT INTO cairn_rate_buckets (name, tokens, stamp)
    SELECT %(name)s, %(capacity)s, now.t FROM now
    ON CONFLICT (name) DO NOTHING
),
level AS (
    SELECT b.name, now.t,
           least(%(capacity)s::float8,
                 b.tokens + extract(epoch FROM now.t - b.stamp) * %(rate)s) AS tokens
    FROM cairn_rate_buckets b, now WHERE b.name = %(name)s FOR UPDATE OF b
)
UPDATE cairn_rate_buckets b
SET tokens = level.tokens - CASE WHEN level.tokens >= 1 THEN 1 ELSE 0 END, stamp = level.t
FROM level WHERE b.name = level.name
RETURNING level.tokens AS before
"""
"""One statement: refill by the time since the last take, then take a token if there is one.
The row is locked for the statement, so two workers never take the same token."""


class PgTokenBucket:
    """A TokenBucket kept in Postgres (cairn_rate_buckets): one per provider for the whole
    deployment, however many workers share it."""

    def __init__(self, pool: Pool, name: str, *, rate: float, capacity: int) -> None:
        if rate <= 0 or capacity < 1:
            msg = "a token bucket needs a positive rate and capacity"
            raise ValueError(msg)
        self.pool = pool
        self.name = name
        self.rate = rate
        self.capacity = capacity

    async def acquire(self) -> None:
        args = {"name": self.name, "capacity": self.capacity, "rate": self.rate}
        while True:
            async with self.pool.connection() as conn:
                cur = await conn.execute(_TAKE, args)
                row: Any = await cur.fetchone()
            if row is None:  # created by this statement, which cannot see it yet: take again
                continue
            before = float(row["before"])
            if before >= 1:
                return
            await asyncio.sleep((1 - before) / self.rate)


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
