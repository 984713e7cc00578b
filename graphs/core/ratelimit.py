"""Token buckets (in this process, or in Postgres for every worker) and the limiter on model calls per provider key."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.tracers.context import register_configure_hook

if TYPE_CHECKING:
    from graphs.core.pool import Pool
    from graphs.core.settings import Settings


class Bucket(Protocol):
    async def acquire(self) -> None:
        """Wait for, and take, one call's token."""
        ...


class TokenBucket:
    """`rate` calls per second on average, bursts up to `capacity`; shared by every caller."""

    def __init__(self, rate: float, capacity: int) -> None:
        _check(rate, capacity)
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
    """A TokenBucket kept in Postgres (cairn_rate_buckets): one per name for the whole
    deployment, however many workers share it."""

    def __init__(self, pool: Pool, name: str, *, rate: float, capacity: int) -> None:
        _check(rate, capacity)
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


def _check(rate: float, capacity: int) -> None:
    if rate <= 0 or capacity < 1:
        msg = "a token bucket needs a positive rate and capacity"
        raise ValueError(msg)


def provider_bucket_name(base_url: str | None, api_key: str) -> str:
    """The bucket of one provider key: the key itself never leaves the process (a hash of it,
    with the server it is for, names the row)."""
    digest = hashlib.sha256(f"{base_url or 'openai'}\n{api_key}".encode()).hexdigest()
    return f"model:{digest[:24]}"


def model_call_bucket(pool: Pool, settings: Settings) -> PgTokenBucket | None:
    """The deployment's bucket for model calls on its provider key; None without a key (the
    offline stand-in) or with the limit off."""
    if settings.openai_api_key is None or settings.model_calls_per_second <= 0:
        return None
    name = provider_bucket_name(
        settings.openai_base_url, settings.openai_api_key.get_secret_value()
    )
    return PgTokenBucket(
        pool, name, rate=settings.model_calls_per_second, capacity=settings.model_call_burst
    )


class ModelCallLimiter(AsyncCallbackHandler):
    """Takes the provider key's token before each model call. LangChain awaits a chat model's
    start callbacks before it sends the request, and this one runs inline, so the call waits
    for its token; a failure to take one (Postgres away) fails the call instead of passing it
    unlimited."""

    run_inline = True
    raise_error = True

    def __init__(self, bucket: Bucket) -> None:
        self.bucket = bucket

    async def on_chat_model_start(
        self, serialized: Any, messages: Any, *, run_id: uuid.UUID, **kwargs: Any
    ) -> None:
        await self.bucket.acquire()

    async def on_llm_start(
        self, serialized: Any, prompts: Any, *, run_id: uuid.UUID, **kwargs: Any
    ) -> None:
        await self.bucket.acquire()


_limiter: ContextVar[ModelCallLimiter | None] = ContextVar("cairn_model_limiter", default=None)
register_configure_hook(_limiter, inheritable=True)


@contextmanager
def limited(bucket: Bucket | None) -> Iterator[None]:
    """Every model call made inside (in this task and the tasks it starts) first takes a token
    of `bucket`; None: not limited."""
    if bucket is None:
        yield
        return
    reset = _limiter.set(ModelCallLimiter(bucket))
    try:
        yield
    finally:
        _limiter.reset(reset)
