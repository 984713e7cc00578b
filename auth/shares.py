"""Shares: a team conversation shown read-only to its workspace, or to named members of it.

Only the conversation's owner shares it, only a conversation of a team workspace (a personal
one has nobody else in it), and only with live members of that workspace. A share is seen by
its owner, and by live members of its workspace in its audience, while it is not revoked and
the owner is still a live member there too. Anything else (a made-up, revoked or foreign id, a
stranger, a member left out of the audience) is ShareNotFound, so ids cannot be probed.

What the shared view may add to the messages (memory notes, recall details, attachments) is off
unless the owner turns it on. Creating and revoking are audited in the conversation's workspace.
The rows go with their conversation (a foreign key to cairn_threads) and with their workspace.
"""

from __future__ import annotations

import logging
import re
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from auth.workspaces import audit
from graphs.core.errors import ThreadNotFound

if TYPE_CHECKING:
    from collections.abc import Iterable
    from datetime import datetime

    from graphs.core.persistence import Pool

log = logging.getLogger("cairn.security")

WORKSPACE, MEMBERS = "workspace", "members"
AUDIENCES = (WORKSPACE, MEMBERS)
MAX_MEMBERS = 50
NOT_FOUND = "Shared conversation not found"
SHARE_ID = re.compile(r"[A-Za-z0-9_-]{22}")
"""secrets.token_urlsafe(16): 128 random bits, URL-safe (the table checks the same shape)."""
PERSONAL_REFUSED = (
    "This conversation is in your personal workspace, which has nobody else in it. "
    "Start the conversation in a team workspace to share it."
)


class ShareNotFound(LookupError):
    """Missing, revoked, foreign or not for this user: all look the same to the caller."""

    def __init__(self) -> None:
        super().__init__(NOT_FOUND)


class ShareRefused(ValueError):
    """A share the owner may not make, with a message fit for them."""


@dataclass(frozen=True)
class Include:
    """What the shared view adds to the conversation's messages; each is off by default."""

    memory_notes: bool = False
    """The code's notes of what it saved to or forgot from the owner's memory."""
    recall: bool = False
    """The facts recall took from the owner's memory for each reply."""
    attachments: bool = False
    """Files, images and charts the conversation showed or was sent."""


@dataclass(frozen=True)
class Share:
    id: str
    thread_id: str
    owner_id: str
    workspace_id: str
    audience: str
    include: Include
    created_at: datetime
    members: tuple[str, ...] = field(default=())
    """The named members (audience "members"); empty for the whole workspace."""

    @property
    def url(self) -> str:
        return f"/share/{self.id}"


_LIVE = (
    "EXISTS (SELECT 1 FROM cairn_workspace_members m WHERE m.workspace_id = {ws} "
    "AND m.user_id = {user} AND m.disabled_at IS NULL)"
)

_CREATE = (
    "INSERT INTO cairn_thread_shares (id, thread_id, owner_id, workspace_id, audience, "  # noqa: S608 (constants only)
    "include_memory_notes, include_recall, include_attachments) "
    "SELECT %(id)s, t.thread_id, t.owner_id, t.workspace_id, %(audience)s, %(notes)s, "
    "%(recall)s, %(attachments)s FROM cairn_threads t "
    "JOIN cairn_workspaces w ON w.id = t.workspace_id AND w.personal_of IS NULL "
    "WHERE t.thread_id = %(thread)s AND t.owner_id = %(owner)s AND "
    + _LIVE.format(ws="t.workspace_id", user="t.owner_id")
    + " RETURNING workspace_id, created_at"
)

_COLUMNS = (
    "s.id, s.thread_id, s.owner_id, s.workspace_id, s.audience, s.include_memory_notes, "
    "s.include_recall, s.include_attachments, s.created_at, "
    "ARRAY(SELECT a.user_id FROM cairn_thread_share_members a WHERE a.share_id = s.id "
    "ORDER BY a.user_id) AS members"
)

_VISIBLE = (
    f"SELECT {_COLUMNS} FROM cairn_thread_shares s "  # noqa: S608 (constants only)
    "JOIN cairn_threads t ON t.thread_id = s.thread_id AND t.owner_id = s.owner_id "
    "AND t.workspace_id = s.workspace_id "
    "JOIN cairn_workspaces w ON w.id = s.workspace_id AND w.personal_of IS NULL "
    "WHERE s.id = %(id)s AND s.revoked_at IS NULL AND "
    + _LIVE.format(ws="s.workspace_id", user="s.owner_id")
    + " AND "
    + _LIVE.format(ws="s.workspace_id", user="%(viewer)s")
    + " AND (s.owner_id = %(viewer)s OR s.audience = 'workspace' OR EXISTS (SELECT 1 FROM "
    "cairn_thread_share_members a WHERE a.share_id = s.id AND a.user_id = %(viewer)s))"
)
"""A share the viewer may see: live, its conversation still the owner's in its workspace, the
owner and the viewer live members there, and the viewer the owner or in the audience."""


def _share(row: dict[str, Any]) -> Share:
    return Share(
        id=str(row["id"]),
        thread_id=str(row["thread_id"]),
        owner_id=str(row["owner_id"]),
        workspace_id=str(row["workspace_id"]),
        audience=str(row["audience"]),
        include=Include(
            memory_notes=bool(row["include_memory_notes"]),
            recall=bool(row["include_recall"]),
            attachments=bool(row["include_attachments"]),
        ),
        created_at=row["created_at"],
        members=tuple(str(m) for m in row["members"] or ()),
    )


def _audience(audience: str, members: Iterable[str], owner_id: str) -> list[str]:
    """The named members, checked for shape (who they are is checked against the workspace)."""
    if audience not in AUDIENCES:
        msg = f"A share's audience is one of: {', '.join(AUDIENCES)}."
        raise ShareRefused(msg)
    named = sorted({str(m).strip() for m in members} - {"", owner_id})
    if audience == WORKSPACE:
        if named:
            msg = "A share with the whole workspace names no members."
            raise ShareRefused(msg)
        return []
    if not named:
        msg = "Name at least one other member of the workspace to share with."
        raise ShareRefused(msg)
    if len(named) > MAX_MEMBERS or any(len(m) > 200 for m in named):
        msg = f"A share names at most {MAX_MEMBERS} members."
        raise ShareRefused(msg)
    return named


class Shares:
    """Shares of conversations, in Postgres (every worker)."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def create(
        self,
        *,
        owner_id: str,
        thread_id: str,
        audience: str,
        members: Iterable[str] = (),
        include: Include | None = None,
    ) -> Share:
        """A new share of the owner's conversation (ThreadNotFound: not theirs, or missing;
        ShareRefused: personal, or a named member who is not a live member of its workspace)."""
        include = include or Include()
        named = _audience(audience, members, owner_id)
        share_id = secrets.token_urlsafe(16)
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT t.owner_id, t.workspace_id FROM cairn_threads t WHERE t.thread_id = %s",
                (thread_id,),
            )
            thread = await cur.fetchone()
            if thread is None or thread["owner_id"] != owner_id:
                if thread is not None:
                    log.warning("refused: user %s tried to share thread %s", owner_id, thread_id)
                raise ThreadNotFound
            if thread["workspace_id"] is None:
                raise ShareRefused(PERSONAL_REFUSED)
            cur = await conn.execute(
                _CREATE,
                {
                    "id": share_id,
                    "thread": thread_id,
                    "owner": owner_id,
                    "audience": audience,
                    "notes": include.memory_notes,
                    "recall": include.recall,
                    "attachments": include.attachments,
                },
            )
            row = await cur.fetchone()
            if row is None:  # the owner is no longer a live member of its workspace
                raise ThreadNotFound
            workspace = str(row["workspace_id"])
            await _add_members(conn, share_id, workspace, named)
            await audit(
                conn,
                workspace,
                owner_id,
                "share.created",
                detail={
                    "share_id": share_id,
                    "thread_id": thread_id,
                    "audience": audience,
                    "members": named,
                    "include": [k for k, v in vars(include).items() if v],
                },
            )
        log.info("share %s of thread %s made by %s (%s)", share_id, thread_id, owner_id, audience)
        return Share(
            id=share_id,
            thread_id=thread_id,
            owner_id=owner_id,
            workspace_id=workspace,
            audience=audience,
            include=include,
            created_at=row["created_at"],
            members=tuple(named),
        )

    async def visible(self, *, viewer_id: str, share_id: str) -> Share:
        """The share, for a user who may see it; ShareNotFound for anyone else."""
        if not SHARE_ID.fullmatch(share_id):
            raise ShareNotFound
        async with self.pool.connection() as conn:
            cur = await conn.execute(_VISIBLE, {"id": share_id, "viewer": viewer_id})
            row = await cur.fetchone()
        if row is None:
            log.info(
                "share %s not shown to %s (missing, revoked or not theirs)", share_id, viewer_id
            )
            raise ShareNotFound
        return _share(row)

    async def owned(self, owner_id: str) -> list[Share]:
        """The owner's live shares, newest first (revoked ones are not listed)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {_COLUMNS} FROM cairn_thread_shares s "  # noqa: S608 (constants only)
                "WHERE s.owner_id = %s AND s.revoked_at IS NULL ORDER BY s.created_at DESC, s.id",
                (owner_id,),
            )
            return [_share(row) for row in await cur.fetchall()]

    async def member_names(self, workspace_id: str, user_ids: Iterable[str]) -> dict[str, str]:
        """The names members gave when they joined (for the owner's list of their shares)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT user_id, display_name FROM cairn_workspace_members "
                "WHERE workspace_id = %s AND user_id = ANY(%s) AND display_name IS NOT NULL",
                (workspace_id, list(user_ids)),
            )
            return {str(r["user_id"]): str(r["display_name"]) for r in await cur.fetchall()}

    async def revoke(self, *, owner_id: str, share_id: str) -> bool:
        """The owner ends their share (True when it changed; revoking again changes nothing).
        Anyone else's, or a missing one: ShareNotFound."""
        if not SHARE_ID.fullmatch(share_id):
            raise ShareNotFound
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT workspace_id, thread_id, revoked_at FROM cairn_thread_shares "
                "WHERE id = %s AND owner_id = %s FOR UPDATE",
                (share_id, owner_id),
            )
            row = await cur.fetchone()
            if row is None:
                log.warning("refused or missing: user %s revoking share %s", owner_id, share_id)
                raise ShareNotFound
            if row["revoked_at"] is not None:
                return False
            await conn.execute(
                "UPDATE cairn_thread_shares SET revoked_at = now() WHERE id = %s", (share_id,)
            )
            await audit(
                conn,
                str(row["workspace_id"]),
                owner_id,
                "share.revoked",
                detail={"share_id": share_id, "thread_id": str(row["thread_id"])},
            )
        log.info("share %s revoked by %s", share_id, owner_id)
        return True


async def _add_members(conn: Any, share_id: str, workspace_id: str, named: list[str]) -> None:
    """The named members, each a live member of the workspace (else nothing is stored)."""
    if not named:
        return
    cur = await conn.execute(
        "SELECT user_id FROM cairn_workspace_members WHERE workspace_id = %s "
        "AND user_id = ANY(%s) AND disabled_at IS NULL",
        (workspace_id, named),
    )
    live = {str(r["user_id"]) for r in await cur.fetchall()}
    if missing := [m for m in named if m not in live]:
        msg = f"Not a member of this workspace: {', '.join(missing)}."
        raise ShareRefused(msg)
    await conn.execute(
        "INSERT INTO cairn_thread_share_members (share_id, user_id) SELECT %s, unnest(%s::text[])",
        (share_id, named),
    )
