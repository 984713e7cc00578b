"""Sign-in and sign-up attempt limits, counted in Postgres so every worker shares them."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from auth.local_accounts import normalize_username

if TYPE_CHECKING:
    from collections.abc import Sequence

    from graphs.core.persistence import Pool


@dataclass(frozen=True)
class Limit:
    """At most `attempts` per key in each fixed window of `window_s` seconds (so up to twice
    that across a window's end)."""

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


@dataclass(frozen=True)
class Count:
    """One key's attempts in its current window, this one included."""

    limit: Limit
    key: str
    window_start: float
    attempts: int
    retry_after: int
    """Seconds until the window ends."""

    @property
    def over(self) -> bool:
        return self.attempts > self.limit.attempts


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
    ceil(extract(epoch FROM c.window_start + make_interval(secs => k.win) - now()))::int
        AS retry_after
FROM counted c JOIN k ON k.key = c.key
"""


class PgAttemptCounter:
    """Attempts in `cairn_auth_attempts`, one row per key and window, counted by one upsert."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def count(self, keys: Sequence[tuple[Limit, str]]) -> list[Count]:
        limits = {f"{limit.name}:{value}": limit for limit, value in keys}
        async with self._pool.connection() as conn:
            # Rows of ended windows are no use to anyone (the longest window is an hour).
            await conn.execute(
                "DELETE FROM cairn_auth_attempts WHERE window_start < now() - interval '2 hours'"
            )
            cur = await conn.execute(
                _COUNT, (list(limits), [limit.window_s for limit in limits.values()])
            )
            rows = await cur.fetchall()
        return [
            Count(limits[row["key"]], row["key"], row["start"], row["attempts"], row["retry_after"])
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
