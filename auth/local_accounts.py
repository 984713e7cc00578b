"""Username/password accounts for Cairn's built-in OpenID Connect provider."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import re
import secrets
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from psycopg.rows import dict_row

if TYPE_CHECKING:
    from graphs.core.persistence import Pool

# Tables local_accounts and local_oidc_codes: migration 0003_local_auth (graphs/core/migrations.py).
USERNAME_PATTERN = re.compile(r"[a-z0-9_.-]{3,64}")
PASSWORD_MIN_LENGTH = 8
PASSWORD_MAX_LENGTH = 256
DISPLAY_NAME_MAX_LENGTH = 100

# n=2**14, r=8 costs 16 MiB and tens of milliseconds: OWASP's floor for interactive logins.
_SCRYPT_N = 2**14
_SCRYPT_R = 8
_SCRYPT_P = 1
_SCRYPT_MAXMEM = 64 * 1024 * 1024
_SALT_BYTES = 16
_HASH_BYTES = 32
# Verified against when the username is unknown, so a miss costs the same scrypt as a hit.
_DUMMY_HASH = "$".join(
    [
        "scrypt",
        str(_SCRYPT_N),
        str(_SCRYPT_R),
        str(_SCRYPT_P),
        base64.b64encode(bytes(_SALT_BYTES)).decode(),
        base64.b64encode(bytes(_HASH_BYTES)).decode(),
    ]
)


class AccountError(ValueError):
    """A user-facing reason an account could not be created or seeded."""


@dataclass(frozen=True)
class Account:
    """A local user as the rest of the app sees it (never carries the password hash)."""

    username: str
    subject: str
    display_name: str | None = None


@dataclass(frozen=True)
class AccountRecord:
    """A stored account row, including its password hash."""

    username: str
    subject: str
    password_hash: str
    display_name: str | None

    def to_account(self) -> Account:
        return Account(self.username, self.subject, self.display_name)


class AccountStore(Protocol):
    """Where account rows live; Postgres in the app, a dict in unit tests."""

    async def insert(self, record: AccountRecord) -> bool:
        """Store a new account; return False if the username is already taken."""
        ...

    async def by_username(self, username: str) -> AccountRecord | None: ...

    async def by_subject(self, subject: str) -> AccountRecord | None: ...


_SELECT_ACCOUNT = "SELECT username, subject, password_hash, display_name FROM local_accounts"


class PgAccountStore:
    """Account rows in the `local_accounts` table."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def insert(self, record: AccountRecord) -> bool:
        async with self._pool.connection() as conn, conn.cursor() as cur:
            await cur.execute(
                "INSERT INTO local_accounts (username, subject, password_hash, display_name)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT (username) DO NOTHING RETURNING subject",
                (record.username, record.subject, record.password_hash, record.display_name),
            )
            return await cur.fetchone() is not None

    async def by_username(self, username: str) -> AccountRecord | None:
        return await self._fetch_one(f"{_SELECT_ACCOUNT} WHERE username = %s", username)

    async def by_subject(self, subject: str) -> AccountRecord | None:
        return await self._fetch_one(f"{_SELECT_ACCOUNT} WHERE subject = %s", subject)

    async def _fetch_one(self, query: str, value: str) -> AccountRecord | None:
        async with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, (value,))
            row = await cur.fetchone()
        return AccountRecord(**row) if row else None


def normalize_username(username: str) -> str | None:
    """Return the canonical (lower-case) username, or None if it is not allowed."""
    candidate = username.strip().lower()
    return candidate if USERNAME_PATTERN.fullmatch(candidate) else None


def hash_password(password: str) -> str:
    """Return an encoded scrypt hash (CPU-bound: call through `asyncio.to_thread`)."""
    salt = secrets.token_bytes(_SALT_BYTES)
    digest = _scrypt(password, salt, _SCRYPT_N, _SCRYPT_R, _SCRYPT_P, _HASH_BYTES)
    encoded = [base64.b64encode(part).decode() for part in (salt, digest)]
    return "$".join(["scrypt", str(_SCRYPT_N), str(_SCRYPT_R), str(_SCRYPT_P), *encoded])


def verify_password(password: str, encoded: str) -> bool:
    """Check a password against `hash_password` output (CPU-bound, like hashing)."""
    try:
        scheme, n, r, p, salt_b64, hash_b64 = encoded.split("$")
        salt = base64.b64decode(salt_b64, validate=True)
        expected = base64.b64decode(hash_b64, validate=True)
        cost = (int(n), int(r), int(p))
    except ValueError:
        return False
    if scheme != "scrypt" or not expected:
        return False
    return hmac.compare_digest(_scrypt(password, salt, *cost, len(expected)), expected)


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int, length: int) -> bytes:
    return hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, maxmem=_SCRYPT_MAXMEM, dklen=length
    )


class LocalAccounts:
    """Create, verify and look up local accounts."""

    def __init__(self, pool: Pool | None = None, *, store: AccountStore | None = None) -> None:
        # The app passes the pool; unit tests pass an in-memory `store` instead.
        if store is None:
            if pool is None:
                msg = "LocalAccounts needs a connection pool or an account store"
                raise ValueError(msg)
            store = PgAccountStore(pool)
        self._store = store

    async def create(
        self, username: str, password: str, display_name: str | None = None
    ) -> Account:
        """Create an account with a fresh random subject; raise AccountError if refused."""
        record = await self._new_record(username, password, display_name)
        if not await self._store.insert(record):
            msg = "That username is not available."
            raise AccountError(msg)
        return record.to_account()

    async def verify(self, username: str, password: str) -> Account | None:
        """Return the account if the password matches, else None (same cost either way)."""
        canonical = normalize_username(username)
        record = await self._store.by_username(canonical) if canonical else None
        stored_hash = record.password_hash if record else _DUMMY_HASH
        # Over-long passwords are refused, but only after the same work as any other miss.
        candidate = password if len(password) <= PASSWORD_MAX_LENGTH else ""
        matches = await asyncio.to_thread(verify_password, candidate, stored_hash)
        if record is None or not candidate or not matches:
            return None
        return record.to_account()

    async def get_by_subject(self, subject: str) -> Account | None:
        record = await self._store.by_subject(subject)
        return record.to_account() if record else None

    async def seed(self, entries: list[str]) -> None:
        """Create each `name:password` account that does not exist yet; leave others alone."""
        parsed = [_parse_seed_entry(index, entry) for index, entry in enumerate(entries)]
        for username, password in parsed:
            if await self._store.by_username(username):
                continue
            record = await self._new_record(username, password, None)
            # False means another worker seeded the same name first, which is fine.
            await self._store.insert(record)

    async def _new_record(
        self, username: str, password: str, display_name: str | None
    ) -> AccountRecord:
        canonical = _require_username(username)
        _require_password(password)
        name = (display_name or "").strip() or None
        if name is not None and len(name) > DISPLAY_NAME_MAX_LENGTH:
            msg = f"Display names can be at most {DISPLAY_NAME_MAX_LENGTH} characters."
            raise AccountError(msg)
        password_hash = await asyncio.to_thread(hash_password, password)
        return AccountRecord(canonical, str(uuid.uuid4()), password_hash, name)


def _require_username(username: str) -> str:
    canonical = normalize_username(username)
    if canonical is None:
        msg = "Usernames are 3-64 characters: letters, digits, '_', '.' or '-'."
        raise AccountError(msg)
    return canonical


def _require_password(password: str) -> None:
    if not PASSWORD_MIN_LENGTH <= len(password) <= PASSWORD_MAX_LENGTH:
        msg = f"Passwords are {PASSWORD_MIN_LENGTH}-{PASSWORD_MAX_LENGTH} characters."
        raise AccountError(msg)


def _parse_seed_entry(index: int, entry: str) -> tuple[str, str]:
    # Validate every entry before creating any, so a typo never leaves a half-seeded table.
    username, separator, password = entry.partition(":")
    if not separator:
        # Never echo the entry: it holds a password.
        msg = f"Seed entry #{index + 1} is not of the form name:password"
        raise AccountError(msg)
    try:
        canonical = _require_username(username)
        _require_password(password)
    except AccountError as error:
        msg = f"Seed entry #{index + 1}: {error}"
        raise AccountError(msg) from error
    return canonical, password
