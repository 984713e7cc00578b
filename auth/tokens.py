"""Personal access tokens: a user's credential for the agents' MCP endpoint, standing for that
user exactly like a web session (same user_id, same ownership checks, ended by a wipe).

Only a SHA-256 of each token is stored; the token itself is shown once, when it is made. The
secret part is 32 random bytes, so a plain hash is enough (nothing to brute-force). Each use is
recorded in `cairn_token_calls`, which is both the audit log and what the per-token limits
count, so the limits hold across workers.

A token belongs to the workspace its creator had active (auth/workspaces.py; NULL: personal).
A team token works only while its owner is a live member of that team, and its runs' new
threads go there. Making and revoking a token are written to that workspace's audit log.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from auth.ownership import LIVE_TEAM
from auth.workspaces import WorkspaceNotFound, Workspaces, audit

if TYPE_CHECKING:
    from collections.abc import Collection

    from psycopg import AsyncConnection

    from graphs.core.pool import Pool

log = logging.getLogger("cairn.security")

PREFIX = "cairn_pat_"
"""Every token starts with this, so one pasted somewhere it should not be is recognisable."""
RUN_WINDOW = timedelta(hours=1)
"""Runs per hour count calls started in the last hour. A call is bound to the lease of the worker
running it: when that worker dies, a live worker's sweep closes it (graphs.core.runs), so it stops
counting as running long before the hour is up."""
INVALID = "The access token is missing, invalid, expired or revoked."


class SessionCutOff(Protocol):
    """When a wipe ended every session of a user (auth.sessions.SessionRevocations)."""

    async def is_revoked(self, user_id: str, issued_at: float | None) -> bool: ...


class TokenRejected(PermissionError):
    """No usable token: missing, unknown, expired, revoked, or its account was wiped."""

    def __init__(self) -> None:
        super().__init__(INVALID)


class LimitExceeded(Exception):
    """A per-token limit refused the call; the message says which and what to do."""


@dataclass(frozen=True)
class TokenLimits:
    max_concurrent: int
    """Runs going at once."""
    max_runs_per_hour: int
    """Runs started in any hour."""
    max_model_calls: int
    """Model calls one run may make."""


@dataclass(frozen=True)
class TokenInfo:
    """A stored token (never its secret)."""

    id: str
    user_id: str
    name: str
    hint: str
    scopes: frozenset[str]
    pre_approve: bool
    """The user lets callers pre-approve low-risk plans with this token."""
    limits: TokenLimits
    created_at: datetime
    expires_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None
    workspace_id: str | None = None
    """The team workspace it acts in; None: its owner's personal one."""
    workspace_name: str | None = None
    """That workspace's name, where it was read (the owner's list)."""
    member: bool = True
    """Its owner is still a live member of its team workspace (always so for a personal one)."""

    @property
    def active(self) -> bool:
        return self.revoked_at is None and self.expires_at > datetime.now(UTC)

    def audit_detail(self) -> dict[str, Any]:
        """What the workspace's audit log keeps about it (never the secret or its hash)."""
        return {"token_id": self.id, "name": self.name, "scopes": sorted(self.scopes)}

    def public(self) -> dict[str, Any]:
        """What the settings page shows about it."""
        return {
            "id": self.id,
            "name": self.name,
            "hint": f"{PREFIX}…{self.hint}",
            "scopes": sorted(self.scopes),
            "pre_approve": self.pre_approve,
            "max_concurrent": self.limits.max_concurrent,
            "max_runs_per_hour": self.limits.max_runs_per_hour,
            "max_model_calls": self.limits.max_model_calls,
            "created_at": self.created_at.isoformat(),
            "expires_at": self.expires_at.isoformat(),
            "last_used_at": self.last_used_at.isoformat() if self.last_used_at else None,
            "revoked": self.revoked_at is not None,
            "active": self.active and self.member,
            "workspace_id": self.workspace_id,
            "workspace": self.workspace_name
            or ("Personal" if self.workspace_id is None else self.workspace_id),
            "personal": self.workspace_id is None,
            "membership_ended": not self.member,
        }


@dataclass(frozen=True)
class NewToken:
    secret: str
    """The token itself: shown to its owner once, never stored."""
    info: TokenInfo


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


# Constant column lists are the only text formatted into these statements.
_COLUMNS = (
    "id, user_id, name, hint, scopes, pre_approve, max_concurrent, max_runs_per_hour, "
    "max_model_calls, created_at, expires_at, last_used_at, revoked_at, workspace_id"
)
_USABLE_WORKSPACE = (
    "(t.workspace_id IS NULL OR " + LIVE_TEAM.format(ws="t.workspace_id", user="t.user_id") + ")"
)
"""A token of a team acts only while its owner is a live (not disabled) member there."""


_IN_TEAM = (
    "EXISTS (SELECT 1 FROM cairn_workspaces w WHERE w.id = %(ws)s::text "  # noqa: S608
    "AND w.personal_of IS NULL) AND " + LIVE_TEAM.format(ws="%(ws)s::text", user="%(user)s")
)
"""A team (never a personal workspace's id: a personal token's is NULL) the user is live in."""
_CREATE = (
    "INSERT INTO cairn_access_tokens (id, user_id, name, token_hash, hint, scopes, pre_approve, "  # noqa: S608 (constants only)
    "max_concurrent, max_runs_per_hour, max_model_calls, expires_at, workspace_id) "
    "SELECT %(id)s, %(user)s, %(name)s, %(hash)s, %(hint)s, %(scopes)s, %(pre)s, "
    "%(concurrent)s, %(hourly)s, %(calls)s, now() + make_interval(days => %(days)s), "
    f"%(ws)s::text WHERE %(ws)s::text IS NULL OR ({_IN_TEAM}) RETURNING {_COLUMNS}, "
    "(SELECT name FROM cairn_workspaces WHERE id = workspace_id) AS workspace_name"
)
"""A new token, made only in the user's personal workspace or a team they are live in."""
_T_COLUMNS = ", ".join(f"t.{c.strip()}" for c in _COLUMNS.split(","))


def _info(row: dict[str, Any]) -> TokenInfo:
    return TokenInfo(
        id=row["id"],
        user_id=row["user_id"],
        name=row["name"],
        hint=row["hint"],
        scopes=frozenset(row["scopes"]),
        pre_approve=bool(row["pre_approve"]),
        limits=TokenLimits(
            max_concurrent=int(row["max_concurrent"]),
            max_runs_per_hour=int(row["max_runs_per_hour"]),
            max_model_calls=int(row["max_model_calls"]),
        ),
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        last_used_at=row["last_used_at"],
        revoked_at=row["revoked_at"],
        workspace_id=row["workspace_id"],
        workspace_name=row.get("workspace_name"),
        member=bool(row.get("member", True)),
    )


class AccessTokens:
    """The cairn_access_tokens and cairn_token_calls tables."""

    def __init__(
        self, pool: Pool, *, scopes: Collection[str], cut_off: SessionCutOff | None = None
    ) -> None:
        self.pool = pool
        self.scopes = tuple(scopes)
        """What a token may be allowed to call: one scope per agent offered over MCP. The app
        passes them in at start-up (ui.mcp_server.token_scopes), as the agents are declared
        above this layer."""
        self.cut_off = cut_off

    def checked_scopes(self, scopes: Collection[str]) -> frozenset[str]:
        """The scopes asked for, if they are some of the known ones (ValueError otherwise)."""
        asked = frozenset(scopes)
        if not asked or not asked <= set(self.scopes):
            msg = f"scopes must be some of {', '.join(self.scopes)}"
            raise ValueError(msg)
        return asked

    async def create(
        self,
        user_id: str,
        *,
        name: str,
        scopes: frozenset[str],
        days: int,
        limits: TokenLimits,
        pre_approve: bool = False,
        workspace_id: str | None = None,
    ) -> NewToken:
        """A new token acting in `workspace_id` (a team the user is a live member of, else
        WorkspaceNotFound; None: their personal workspace), audited there."""
        scopes = self.checked_scopes(scopes)
        secret = PREFIX + secrets.token_urlsafe(32)
        token_id = "tok_" + secrets.token_hex(8)
        target = await self._audited_in(user_id, workspace_id)
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                _CREATE,
                {
                    "id": token_id,
                    "user": user_id,
                    "name": name,
                    "hash": hash_token(secret),
                    "hint": secret[-4:],
                    "scopes": sorted(scopes),
                    "pre": pre_approve,
                    "concurrent": limits.max_concurrent,
                    "hourly": limits.max_runs_per_hour,
                    "calls": limits.max_model_calls,
                    "days": days,
                    "ws": workspace_id,
                },
            )
            row = await cur.fetchone()
            if row is None:  # not (or no longer) a live member of that team
                log.warning("refused: user %s making a token in %s", user_id, workspace_id)
                raise WorkspaceNotFound
            info = _info(row)
            await audit(conn, target, user_id, "token.created", detail=info.audit_detail())
        log.info(
            "access token %s created for user %s (scopes %s, workspace %s)",
            token_id,
            user_id,
            scopes,
            workspace_id or "personal",
        )
        return NewToken(secret=secret, info=info)

    async def _audited_in(self, user_id: str, workspace_id: str | None) -> str:
        """The workspace whose audit log a token's events go to; a personal one is made the
        first time it is needed (its row is what the log refers to)."""
        if workspace_id is not None:
            return workspace_id
        return (await Workspaces(self.pool).personal(user_id)).workspace_id

    async def owned(self, user_id: str) -> list[TokenInfo]:
        """The user's tokens, each with its workspace and whether it still acts there."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {_T_COLUMNS}, w.name AS workspace_name, "  # noqa: S608
                f"{_USABLE_WORKSPACE} AS member FROM cairn_access_tokens t "
                "LEFT JOIN cairn_workspaces w ON w.id = t.workspace_id "
                "WHERE t.user_id = %s ORDER BY t.created_at DESC",
                (user_id,),
            )
            return [_info(row) for row in await cur.fetchall()]

    async def revoke(self, user_id: str, token_id: str) -> bool:
        """False when the user has no such token (someone else's looks the same). The first
        revocation is written to the token's workspace's audit log."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT workspace_id, revoked_at FROM cairn_access_tokens "
                "WHERE id = %s AND user_id = %s",
                (token_id, user_id),
            )
            found = await cur.fetchone()
        if found is None:
            log.warning("refused or missing: user %s revoking token %s", user_id, token_id)
            return False
        if found["revoked_at"] is None:
            target = await self._audited_in(user_id, found["workspace_id"])
            async with self.pool.connection() as conn, conn.transaction():
                cur = await conn.execute(
                    "UPDATE cairn_access_tokens SET revoked_at = now() "  # noqa: S608
                    "WHERE id = %s AND user_id = %s AND revoked_at IS NULL "
                    f"RETURNING {_COLUMNS}",
                    (token_id, user_id),
                )
                row = await cur.fetchone()
                if row is not None:  # else revoked meanwhile, and audited by that revocation
                    await _audit_revoked(conn, target, user_id, _info(row))
        log.info("access token %s revoked by user %s", token_id, user_id)
        return True

    async def revoke_all(self, user_id: str) -> int:
        """Sign out everywhere: every live token of the user is revoked (the cut-off already
        refuses them; this shows them revoked on the page), each audited in its workspace.
        Returns how many."""
        personal = await self._audited_in(user_id, None)
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "UPDATE cairn_access_tokens SET revoked_at = now() "  # noqa: S608
                "WHERE user_id = %s AND revoked_at IS NULL AND expires_at > now() "
                f"RETURNING {_COLUMNS}",
                (user_id,),
            )
            revoked = [_info(row) for row in await cur.fetchall()]
            for info in revoked:
                await _audit_revoked(
                    conn, info.workspace_id or personal, user_id, info, why="signed out everywhere"
                )
        done = len(revoked)
        log.info("%d access tokens of user %s revoked (signed out everywhere)", done, user_id)
        return done

    async def verify(self, secret: str | None) -> TokenInfo:
        """The live token for a presented secret, or TokenRejected."""
        if not secret or not secret.startswith(PREFIX) or len(secret) > 200:
            raise TokenRejected
        async with self.pool.connection() as conn:
            # One statement: a team token whose owner left or was disabled there is unknown.
            cur = await conn.execute(
                "UPDATE cairn_access_tokens t SET last_used_at = now() "  # noqa: S608
                "WHERE t.token_hash = %s AND t.revoked_at IS NULL AND t.expires_at > now() "
                f"AND {_USABLE_WORKSPACE} RETURNING {_COLUMNS}",
                (hash_token(secret),),
            )
            row = await cur.fetchone()
        if row is None:
            raise TokenRejected
        info = _info(row)
        # A wipe ends every session of the account; a token made before it is one of them.
        if self.cut_off is not None and await self.cut_off.is_revoked(
            info.user_id, info.created_at.timestamp()
        ):
            raise TokenRejected
        return info

    async def begin_call(
        self, token: TokenInfo, tool: str, thread_id: str | None, *, worker: str | None = None
    ) -> int:
        """Record a run starting, within the token's limits (LimitExceeded otherwise).

        The token's row is locked while its calls are counted, so two workers cannot both
        take the last free place. `worker` is the run journal's id of the worker running the
        call: if it dies, the call is closed with its lease (graphs.core.runs.RunJournal).
        """
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute(
                "SELECT 1 FROM cairn_access_tokens WHERE id = %s FOR UPDATE", (token.id,)
            )
            cur = await conn.execute(
                "SELECT count(*) FILTER (WHERE finished_at IS NULL) AS running, "
                "count(*) AS started FROM cairn_token_calls "
                "WHERE token_id = %s AND status <> 'refused' AND started_at > now() - %s",
                (token.id, RUN_WINDOW),
            )
            counts = await cur.fetchone()
            assert counts is not None
            refusal = _over_limit(token.limits, int(counts["running"]), int(counts["started"]))
            cur = await conn.execute(
                "INSERT INTO cairn_token_calls (token_id, user_id, tool, thread_id, status, "
                "detail, finished_at, worker_id) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                "RETURNING id",
                (
                    token.id,
                    token.user_id,
                    tool,
                    (thread_id or "")[:200] or None,
                    "refused" if refusal else "running",
                    refusal,
                    datetime.now(UTC) if refusal else None,
                    worker,
                ),
            )
            row = await cur.fetchone()
        assert row is not None
        if refusal:
            log.warning("token %s: %s refused: %s", token.id, tool, refusal)
            raise LimitExceeded(refusal)
        return int(row["id"])

    async def log_refusal(
        self, token: TokenInfo, tool: str, thread_id: str | None, reason: str
    ) -> None:
        """A call refused before it ran (scope, input, thread): logged, never counted."""
        async with self.pool.connection() as conn:
            await conn.execute(
                "INSERT INTO cairn_token_calls (token_id, user_id, tool, thread_id, status, "
                "detail, finished_at) VALUES (%s, %s, %s, %s, 'refused', %s, now())",
                (token.id, token.user_id, tool, (thread_id or "")[:200] or None, reason[:500]),
            )

    async def finish_call(
        self,
        call_id: int,
        *,
        status: str,
        thread_id: str | None,
        model_calls: int,
        detail: str | None = None,
    ) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(
                "UPDATE cairn_token_calls SET status = %s, thread_id = COALESCE(%s, thread_id), "
                "model_calls = %s, detail = %s, finished_at = now() WHERE id = %s",
                (status, thread_id, model_calls, detail, call_id),
            )

    async def calls(self, token_id: str, user_id: str) -> list[dict[str, Any]]:
        """A token's recent calls, for its owner."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT tool, thread_id, status, detail, model_calls, started_at, finished_at "
                "FROM cairn_token_calls WHERE token_id = %s AND user_id = %s "
                "ORDER BY id DESC LIMIT 100",
                (token_id, user_id),
            )
            return [dict(row) for row in await cur.fetchall()]


async def _audit_revoked(
    conn: AsyncConnection[Any],
    workspace_id: str,
    user_id: str,
    info: TokenInfo,
    *,
    why: str | None = None,
) -> None:
    detail = info.audit_detail() | ({"why": why} if why else {})
    await audit(conn, workspace_id, user_id, "token.revoked", detail=detail)


def _over_limit(limits: TokenLimits, running: int, started: int) -> str | None:
    if running >= limits.max_concurrent:
        return (
            f"This token already has {running} run(s) going; its limit is "
            f"{limits.max_concurrent} at once. Wait for one to finish."
        )
    if started >= limits.max_runs_per_hour:
        return (
            f"This token has started {started} runs in the last hour; its limit is "
            f"{limits.max_runs_per_hour} per hour. Try again later."
        )
    return None
