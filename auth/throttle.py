"""Sign-in and sign-up attempt limits, counted in Postgres so every worker shares them."""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from auth.local_accounts import normalize_username

if TYPE_CHECKING:
    from collections.abc import Sequence

    from graphs.core.persistence import Pool


@dataclass(frozen=True)
class Limit:
    """At most `attempts` per key in any `window_s` seconds (a sliding window, estimated from
    two fixed ones: this one's count plus the last one's, weighed by how much of it overlaps)."""

    name: str
    attempts: int
    window_s: int


# Guesses at one password: from one address, and from any number of them (a botnet). The
# second lets anyone lock an account's sign-in for up to 15 minutes by failing 30 times: the
# price of a limit an attacker cannot walk around by changing address.
SIGN_IN_ACCOUNT_ADDRESS = Limit("signin-account-address", 10, 300)
SIGN_IN_ACCOUNT = Limit("signin-account", 30, 900)
# One address trying many accounts (password spraying).
SIGN_IN_ADDRESS = Limit("signin-address", 100, 900)
# Every sign-up answer says whether a name is taken, and each one creates an account.
SIGN_UP_ADDRESS = Limit("signup-address", 20, 3600)

TOO_MANY_SIGN_INS = "Too many failed sign-in attempts. Wait a few minutes and try again."
TOO_MANY_SIGN_UPS = "Too many accounts were requested from your network. Try again later."


_ROUNDING = 1e-6
"""Retry-After errs late by a hair rather than early (the estimate is a float)."""


@dataclass(frozen=True)
class Count:
    """One key's attempts in its current fixed window (this one included) and the last one."""

    limit: Limit
    key: str
    window_start: float
    attempts: int
    previous: int
    """Attempts in the window before."""
    elapsed: float
    """Seconds of the current window gone."""

    @property
    def estimate(self) -> float:
        """Attempts in the last window_s seconds, assuming the last window's were spread evenly."""
        overlap = 1 - self.elapsed / self.limit.window_s
        return self.attempts + self.previous * overlap

    @property
    def over(self) -> bool:
        return self.estimate > self.limit.attempts

    @property
    def retry_after(self) -> int:
        """Seconds until one more attempt would be within the limit (if no other comes)."""
        window, room = self.limit.window_s, self.limit.attempts - self.attempts - 1
        if room >= 0:
            # Later in this window, when enough of the last one has slid out.
            at = window * (1 - room / self.previous) if self.previous else 0.0
            return max(1, math.ceil(at - self.elapsed + _ROUNDING))
        # In the next window, when enough of this one has slid out.
        at = window * (1 - (self.limit.attempts - 1) / self.attempts)
        return max(1, math.ceil(window - self.elapsed + at + _ROUNDING))


class AttemptCounter(Protocol):
    """Where attempts are counted: Postgres in the app, a dict in unit tests."""

    async def count(self, keys: Sequence[tuple[Limit, str]]) -> list[Count]:
        """Add one attempt to each key's current window, atomically; their counts."""
        ...

    async def uncount(self, counts: Sequence[Count]) -> None:
        """Take those attempts back (they were sign-ins that succeeded)."""
        ...

    async def reset(self, key: str) -> None:
        """Forget every attempt of the key."""
        ...


class Throttled(Exception):
    """Too many attempts; the message is for the user."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def address_key(address: str) -> str:
    """An IPv6 client counts by its /64 (one subscriber's block), anything else as it is."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address[:64]
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.ip_network(f"{parsed}/64", strict=False))
    return str(parsed)


def account_key(username: str) -> str:
    """The account a sign-in names, spelled as the account table spells it."""
    return normalize_username(username) or username.strip().lower()[:64]


class Throttle:
    """The sign-in and sign-up limits, on a shared counter.

    An attempt is counted before the password is checked, so attempts running at once on
    several workers cannot all slip under the limit; a sign-in that succeeds is taken back.
    Refused attempts count too: a guesser who keeps trying stays locked out.
    """

    def __init__(self, counter: AttemptCounter) -> None:
        self._counter = counter

    async def sign_in(self, username: str, address: str) -> list[Count]:
        """Count a sign-in attempt (Throttled when over a limit); pass the result to
        `signed_in` if the password was right."""
        account, client = account_key(username), address_key(address)
        counts = await self._counter.count(
            [
                (SIGN_IN_ACCOUNT_ADDRESS, f"{account} {client}"),
                (SIGN_IN_ACCOUNT, account),
                (SIGN_IN_ADDRESS, client),
            ]
        )
        _refuse_when_over(counts, TOO_MANY_SIGN_INS)
        return counts

    async def signed_in(self, counts: Sequence[Count]) -> None:
        """The attempt was the account's owner: it does not count, and that address starts
        afresh for the account."""
        await self._counter.uncount(counts)
        for count in counts:
            if count.limit is SIGN_IN_ACCOUNT_ADDRESS:
                await self._counter.reset(count.key)

    async def sign_up(self, address: str) -> None:
        """Count a sign-up attempt, whatever its outcome (Throttled when over the limit)."""
        counts = await self._counter.count([(SIGN_UP_ADDRESS, address_key(address))])
        _refuse_when_over(counts, TOO_MANY_SIGN_UPS)


def _refuse_when_over(counts: Sequence[Count], message: str) -> None:
    over = [count.retry_after for count in counts if count.over]
    if over:
        raise Throttled(message, max(1, *over))


_COUNT = """
WITH k AS (
    SELECT key, win, to_timestamp(floor(extract(epoch FROM now()) / win) * win) AS start
    FROM unnest(%s::text[], %s::int[]) AS u (key, win)
), counted AS (
    INSERT INTO cairn_auth_attempts AS a (key, window_start, attempts)
    SELECT key, start, 1 FROM k ORDER BY key
    ON CONFLICT (key, window_start) DO UPDATE SET attempts = a.attempts + 1
    RETURNING a.key, a.window_start, a.attempts
)
SELECT c.key, extract(epoch FROM c.window_start)::float8 AS start, c.attempts,
    coalesce(p.attempts, 0) AS previous,
    extract(epoch FROM now() - c.window_start)::float8 AS elapsed
FROM counted c JOIN k ON k.key = c.key
LEFT JOIN cairn_auth_attempts p
    ON p.key = c.key AND p.window_start = c.window_start - make_interval(secs => k.win)
"""


class PgAttemptCounter:
    """Attempts in `cairn_auth_attempts`, one row per key and window, counted by one upsert."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def count(self, keys: Sequence[tuple[Limit, str]]) -> list[Count]:
        limits = {f"{limit.name}:{value}": limit for limit, value in keys}
        async with self._pool.connection() as conn:
            # Only this window and the last one count (the longest window is an hour).
            await conn.execute(
                "DELETE FROM cairn_auth_attempts WHERE window_start < now() - interval '3 hours'"
            )
            cur = await conn.execute(
                _COUNT, (list(limits), [limit.window_s for limit in limits.values()])
            )
            rows = await cur.fetchall()
        return [
            Count(
                limit=limits[row["key"]],
                key=row["key"],
                window_start=row["start"],
                attempts=row["attempts"],
                previous=row["previous"],
                elapsed=row["elapsed"],
            )
            for row in rows
        ]

    async def uncount(self, counts: Sequence[Count]) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(
                "UPDATE cairn_auth_attempts a SET attempts = greatest(a.attempts - 1, 0) "
                "FROM unnest(%s::text[], %s::float8[]) AS u (key, start) "
                "WHERE a.key = u.key AND a.window_start = to_timestamp(u.start)",
                ([c.key for c in counts], [c.window_start for c in counts]),
            )

    async def reset(self, key: str) -> None:
        async with self._pool.connection() as conn:
            await conn.execute("DELETE FROM cairn_auth_attempts WHERE key = %s", (key,))
