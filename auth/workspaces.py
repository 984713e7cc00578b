"""Workspaces (teams) and the roles users hold in them: the only source of a workspace and role.

Every user has a personal workspace (owner: them, no other members). Team workspaces have
members with one role each; roles come from stored membership (an invitation accepted, the
creator, or a verified OIDC groups claim mapped in configuration), never from a client field or
a model. A workspace the user is not a live member of answers exactly like one that does not
exist (WorkspaceNotFound), so ids cannot be probed.

What each role may do (README "Teams"):
- owner: everything an admin may, and grant or take away owner and admin;
- admin: members, roles (below owner), invitations, disabling members, settings, the audit log;
  never anyone's conversations or memories;
- reviewer: a member who decides on other members' plans waiting for review;
- member: uses the agents in the workspace.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, HTTPException, Request
from psycopg.types.json import Jsonb

from auth.identity import CurrentUserId

if TYPE_CHECKING:
    from collections.abc import Sequence

    from psycopg import AsyncConnection

    from graphs.core.persistence import Pool

log = logging.getLogger("cairn.security")

OWNER, ADMIN, MEMBER, REVIEWER = "owner", "admin", "member", "reviewer"
ROLES = (OWNER, ADMIN, MEMBER, REVIEWER)
MANAGERS = frozenset({OWNER, ADMIN})
"""May manage members, invitations and settings, and read the audit log."""
INVITABLE = (ADMIN, MEMBER, REVIEWER)
"""An owner is made only by another owner's role change, never by a link."""
NOT_FOUND = "Workspace not found"
MAX_NAME_CHARS = 80
INVITE_TTL = timedelta(days=7)
MAX_INVITE_TTL = timedelta(days=30)
INVITE_PREFIX = "cairn_inv_"
MAX_CREATED = 20
"""Team workspaces one user may create (a bound on what one account can make)."""
MAX_PENDING_INVITES = 100
"""Unused, unexpired invitations a workspace may hold at once."""


_RANK = {MEMBER: 1, REVIEWER: 2, ADMIN: 3}
"""Which role wins when several groups map one user into one workspace."""
MAX_GROUPS = 1000
"""Groups read from one sign-in's claim; the rest are ignored (and logged)."""


@dataclass(frozen=True)
class GroupRule:
    """One CAIRN_OIDC_GROUPS entry: members of `group` hold `role` in the workspace `name`."""

    group: str
    name: str
    role: str

    @property
    def workspace_id(self) -> str:
        """Derived from the name, so every worker makes the same workspace on first use."""
        key = "oidc:" + " ".join(self.name.split()).casefold()
        return "w-" + hashlib.sha256(key.encode()).hexdigest()[:32]


def group_rules(entries: Sequence[str]) -> tuple[GroupRule, ...]:
    """CAIRN_OIDC_GROUPS parsed ('group=Workspace name:role'); a malformed entry is an error at
    start-up, never a silently ignored rule. A group never makes anyone owner."""
    rules = []
    for entry in entries:
        group, _, rest = entry.partition("=")
        name, _, role = rest.rpartition(":")
        group, role = group.strip(), role.strip()
        msg = (
            f"CAIRN_OIDC_GROUPS entry {entry!r}: write 'group=Workspace name:role' with role "
            f"one of {', '.join(INVITABLE)}"
        )
        if not group or not rest or role not in INVITABLE:
            raise ValueError(msg)
        try:
            rules.append(GroupRule(group, _checked_name(name), role))
        except WorkspaceRefused as exc:
            raise ValueError(f"{msg} ({exc})") from None
    return tuple(rules)


def claimed_groups(value: object) -> frozenset[str]:
    """The groups a provider's verified claim lists (a list of strings, or one string)."""
    items = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    groups = [g for g in items if isinstance(g, str) and 0 < len(g) <= 256]
    if len(groups) > MAX_GROUPS:
        log.warning(
            "a sign-in listed %d groups; only the first %d are read", len(groups), MAX_GROUPS
        )
    return frozenset(groups[:MAX_GROUPS])


class WorkspaceNotFound(LookupError):
    """Missing, foreign, or not allowed for this role: all look the same to the caller."""

    def __init__(self) -> None:
        super().__init__(NOT_FOUND)


class WorkspaceRefused(ValueError):
    """A request that is understood and not allowed, with a message fit for the user."""


@dataclass(frozen=True)
class Membership:
    workspace_id: str
    name: str
    role: str
    personal: bool
    user_id: str

    @property
    def manages(self) -> bool:
        return self.role in MANAGERS

    @property
    def reviews(self) -> bool:
        return self.role == REVIEWER

    def public(self) -> dict[str, Any]:
        return {
            "id": self.workspace_id,
            "name": self.name,
            "role": self.role,
            "personal": self.personal,
        }


def personal_id(user_id: str) -> str:
    """The personal workspace's id: derived from the user id, so it needs no lookup and two
    first requests of a new user cannot make two."""
    return "p-" + hashlib.sha256(user_id.encode()).hexdigest()[:32]


def thread_workspace(membership: Membership) -> str | None:
    """What cairn_threads.workspace_id (and a token's) holds: NULL for the personal one."""
    return None if membership.personal else membership.workspace_id


def hash_invite(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


_LIVE = (
    "SELECT w.id, w.name, w.personal_of IS NOT NULL AS personal, m.role, m.user_id "
    "FROM cairn_workspace_members m JOIN cairn_workspaces w ON w.id = m.workspace_id "
    "WHERE m.user_id = %(user)s AND m.disabled_at IS NULL"
)


def _membership(row: dict[str, Any]) -> Membership:
    return Membership(
        workspace_id=str(row["id"]),
        name=str(row["name"]),
        role=str(row["role"]),
        personal=bool(row["personal"]),
        user_id=str(row["user_id"]),
    )


class Workspaces:
    """Workspaces, memberships, invitations and the audit log, in Postgres (every worker)."""

    def __init__(self, pool: Pool, group_rules: Sequence[GroupRule] = ()) -> None:
        self.pool = pool
        self.group_rules = tuple(group_rules)
        """CAIRN_OIDC_GROUPS, parsed (group_rules): applied at every sign-in (sync_groups)."""

    # -- reading ---------------------------------------------------------------------

    async def personal(self, user_id: str, display_name: str | None = None) -> Membership:
        """The user's personal workspace, made the first time it is asked for."""
        workspace = personal_id(user_id)
        async with self.pool.connection() as conn:
            await conn.execute(
                "INSERT INTO cairn_workspaces (id, name, personal_of, created_by) "
                "VALUES (%s, 'Personal', %s, %s) ON CONFLICT DO NOTHING",
                (workspace, user_id, user_id),
            )
            await conn.execute(
                "INSERT INTO cairn_workspace_members "
                "(workspace_id, user_id, role, source, display_name) "
                "VALUES (%s, %s, 'owner', 'personal', %s) ON CONFLICT DO NOTHING",
                (workspace, user_id, display_name),
            )
        return Membership(workspace, "Personal", OWNER, personal=True, user_id=user_id)

    async def memberships(self, user_id: str) -> list[Membership]:
        """Every workspace the user is a live member of, the personal one first."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                _LIVE + " ORDER BY (w.personal_of IS NULL), lower(w.name), w.id",
                {"user": user_id},
            )
            found = [_membership(row) for row in await cur.fetchall()]
        if not any(m.personal for m in found):
            found.insert(0, await self.personal(user_id))
        return found

    async def membership(self, user_id: str, workspace_id: str) -> Membership:
        """The user's live membership of workspace_id, or WorkspaceNotFound."""
        if workspace_id == personal_id(user_id):
            return await self.personal(user_id)
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                _LIVE + " AND m.workspace_id = %(ws)s",
                {"user": user_id, "ws": workspace_id},
            )
            row = await cur.fetchone()
        if row is None:
            raise WorkspaceNotFound
        return _membership(row)

    async def active(self, user_id: str) -> Membership:
        """The workspace the user last switched to, while they are still a live member of it;
        otherwise (never switched, left, disabled, deleted) their personal one."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                _LIVE + " AND m.workspace_id = "  # noqa: S608
                "(SELECT workspace_id FROM cairn_active_workspace WHERE user_id = %(user)s)",
                {"user": user_id},
            )
            row = await cur.fetchone()
        if row is None:
            return await self.personal(user_id)
        return _membership(row)

    async def switch(self, user_id: str, workspace_id: str) -> Membership:
        """Make workspace_id the user's active one (WorkspaceNotFound unless a live member)."""
        chosen = await self.membership(user_id, workspace_id)
        async with self.pool.connection() as conn:
            await conn.execute(
                "INSERT INTO cairn_active_workspace (user_id, workspace_id) VALUES (%s, %s) "
                "ON CONFLICT (user_id) DO UPDATE SET workspace_id = EXCLUDED.workspace_id",
                (user_id, chosen.workspace_id),
            )
        return chosen

    async def require(self, user_id: str, workspace_id: str, *roles: str) -> Membership:
        """The membership when it holds one of roles (any role when none are given)."""
        found = await self.membership(user_id, workspace_id)
        if roles and found.role not in roles:
            log.warning(
                "refused: user %s (%s) needs %s in workspace %s",
                user_id,
                found.role,
                "/".join(roles),
                workspace_id,
            )
            raise WorkspaceNotFound
        return found

    async def members(self, workspace_id: str) -> list[dict[str, Any]]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT user_id, role, source, display_name, joined_at, disabled_at "
                "FROM cairn_workspace_members WHERE workspace_id = %s "
                "ORDER BY disabled_at IS NOT NULL, joined_at, user_id",
                (workspace_id,),
            )
            return list(await cur.fetchall())

    async def settings(self, workspace_id: str) -> dict[str, Any]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT settings FROM cairn_workspaces WHERE id = %s", (workspace_id,)
            )
            row = await cur.fetchone()
        return dict(row["settings"]) if row else {}

    # -- changing --------------------------------------------------------------------

    async def create(self, user_id: str, name: str, display_name: str | None = None) -> Membership:
        """A new team workspace with user_id as its owner (audited)."""
        name = _checked_name(name)
        workspace = "w-" + secrets.token_hex(16)
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT count(*) AS n FROM cairn_workspaces WHERE created_by = %s "
                "AND personal_of IS NULL",
                (user_id,),
            )
            row = await cur.fetchone()
            if row is not None and int(row["n"]) >= MAX_CREATED:
                msg = f"You may create at most {MAX_CREATED} workspaces."
                raise WorkspaceRefused(msg)
            await conn.execute(
                "INSERT INTO cairn_workspaces (id, name, created_by) VALUES (%s, %s, %s)",
                (workspace, name, user_id),
            )
            await conn.execute(
                "INSERT INTO cairn_workspace_members "
                "(workspace_id, user_id, role, source, display_name) "
                "VALUES (%s, %s, 'owner', 'created', %s)",
                (workspace, user_id, display_name),
            )
            await audit(conn, workspace, user_id, "workspace.created", detail={"name": name})
        return Membership(workspace, name, OWNER, personal=False, user_id=user_id)

    async def invite(
        self, actor: Membership, role: str, ttl: timedelta = INVITE_TTL
    ) -> tuple[str, datetime]:
        """A single-use invitation code for role (an admin's or owner's); the code is shown
        once and only its hash is kept."""
        _managing(actor)
        if role not in INVITABLE:
            msg = f"An invitation's role is one of: {', '.join(INVITABLE)}."
            raise WorkspaceRefused(msg)
        if role == ADMIN and actor.role != OWNER:
            msg = "Only an owner may invite an admin."
            raise WorkspaceRefused(msg)
        if not timedelta(minutes=5) <= ttl <= MAX_INVITE_TTL:
            msg = "An invitation lasts between 5 minutes and 30 days."
            raise WorkspaceRefused(msg)
        code = INVITE_PREFIX + secrets.token_urlsafe(24)
        async with self.pool.connection() as conn, conn.transaction():
            # Serialises this workspace's invitations, so the cap holds under concurrent clicks.
            await conn.execute(
                "SELECT 1 FROM cairn_workspaces WHERE id = %s FOR UPDATE", (actor.workspace_id,)
            )
            cur = await conn.execute(
                "SELECT count(*) AS n FROM cairn_workspace_invites WHERE workspace_id = %s "
                "AND used_at IS NULL AND revoked_at IS NULL AND expires_at > now()",
                (actor.workspace_id,),
            )
            pending = await cur.fetchone()
            if pending is not None and int(pending["n"]) >= MAX_PENDING_INVITES:
                msg = f"At most {MAX_PENDING_INVITES} invitations may wait at once; revoke some."
                raise WorkspaceRefused(msg)
            cur = await conn.execute(
                "INSERT INTO cairn_workspace_invites "
                "(code_hash, workspace_id, role, created_by, expires_at) "
                "VALUES (%s, %s, %s, %s, now() + %s) RETURNING expires_at",
                (hash_invite(code), actor.workspace_id, role, actor.user_id, ttl),
            )
            row = await cur.fetchone()
            assert row is not None
            await audit(
                conn,
                actor.workspace_id,
                actor.user_id,
                "invite.created",
                detail={
                    "role": role,
                    "invite": hash_invite(code)[:12],
                    "expires_at": row["expires_at"].isoformat(),
                },
            )
        return code, row["expires_at"]

    async def accept(self, user_id: str, code: str, display_name: str | None = None) -> Membership:
        """Join with an invitation: once, before it expires, unless revoked. A used, expired,
        unknown or revoked code, or one for a workspace the user was disabled in, is refused
        alike."""
        if not code.startswith(INVITE_PREFIX) or len(code) > 100:
            raise WorkspaceNotFound
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "UPDATE cairn_workspace_invites SET used_by = %s, used_at = now() "
                "WHERE code_hash = %s AND used_at IS NULL AND revoked_at IS NULL "
                "AND expires_at > now() RETURNING workspace_id, role",
                (user_id, hash_invite(code)),
            )
            invite = await cur.fetchone()
            if invite is None:
                log.warning("refused: user %s presented an unusable invitation", user_id)
                raise WorkspaceNotFound
            workspace, role = str(invite["workspace_id"]), str(invite["role"])
            cur = await conn.execute(
                "INSERT INTO cairn_workspace_members "
                "(workspace_id, user_id, role, source, display_name) "
                "VALUES (%s, %s, %s, 'invite', %s) ON CONFLICT (workspace_id, user_id) "
                "DO UPDATE SET display_name = COALESCE(EXCLUDED.display_name, "
                "cairn_workspace_members.display_name) "
                "RETURNING role, disabled_at",
                (workspace, user_id, role, display_name),
            )
            member = await cur.fetchone()
            assert member is not None
            if member["disabled_at"] is not None:
                # Disabled by an admin: a link does not undo that. Raising rolls the use back.
                log.warning("refused: disabled user %s tried to rejoin %s", user_id, workspace)
                raise WorkspaceNotFound
            await audit(
                conn,
                workspace,
                user_id,
                "invite.accepted",
                subject_id=user_id,
                detail={"role": str(member["role"])},
            )
        return await self.membership(user_id, workspace)

    async def invites(self, actor: Membership) -> list[dict[str, Any]]:
        """The workspace's invitations not yet used, newest first (a manager's view; the codes
        themselves were shown once and are not kept). `id` is the code's hash."""
        _managing(actor)
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT code_hash AS id, role, created_by, created_at, expires_at, revoked_at, "
                "expires_at <= now() AS expired FROM cairn_workspace_invites "
                "WHERE workspace_id = %s AND used_at IS NULL AND revoked_at IS NULL "
                "ORDER BY created_at DESC LIMIT %s",
                (actor.workspace_id, MAX_PENDING_INVITES),
            )
            return list(await cur.fetchall())

    async def revoke_invite(self, actor: Membership, invite_id: str) -> bool:
        """An unused invitation stops working; False when there is no such one here."""
        _managing(actor)
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "UPDATE cairn_workspace_invites SET revoked_at = now() "
                "WHERE code_hash = %s AND workspace_id = %s AND used_at IS NULL "
                "AND revoked_at IS NULL RETURNING role",
                (invite_id, actor.workspace_id),
            )
            row = await cur.fetchone()
            if row is None:
                return False
            await audit(
                conn,
                actor.workspace_id,
                actor.user_id,
                "invite.revoked",
                detail={"role": str(row["role"]), "invite": invite_id[:12]},
            )
        return True

    async def set_role(self, actor: Membership, user_id: str, role: str) -> None:
        """Change a member's role. Owners alone grant or take away owner and admin; the last
        owner keeps the role."""
        _managing(actor)
        if role not in ROLES:
            msg = f"A role is one of: {', '.join(ROLES)}."
            raise WorkspaceRefused(msg)
        async with self.pool.connection() as conn, conn.transaction():
            current = await _member_for_update(conn, actor.workspace_id, user_id)
            if actor.role != OWNER and (role in MANAGERS or current in MANAGERS):
                msg = "Only an owner may grant or take away the owner and admin roles."
                raise WorkspaceRefused(msg)
            if current == OWNER and role != OWNER:
                await _keep_an_owner(conn, actor.workspace_id, user_id)
            await conn.execute(
                "UPDATE cairn_workspace_members SET role = %s "
                "WHERE workspace_id = %s AND user_id = %s",
                (role, actor.workspace_id, user_id),
            )
            await audit(
                conn,
                actor.workspace_id,
                actor.user_id,
                "role.changed",
                subject_id=user_id,
                detail={"from": current, "to": role},
            )

    async def set_disabled(self, actor: Membership, user_id: str, *, disabled: bool) -> bool:
        """Disable (or enable again) a member; True when it changed. The caller ends the
        member's sessions (auth.sessions.SessionRevocations.revoke) once this returns."""
        _managing(actor)
        if user_id == actor.user_id:
            msg = "You cannot disable yourself; leave the workspace instead."
            raise WorkspaceRefused(msg)
        async with self.pool.connection() as conn, conn.transaction():
            current = await _member_for_update(conn, actor.workspace_id, user_id)
            if current in MANAGERS and actor.role != OWNER:
                msg = "Only an owner may disable an owner or an admin."
                raise WorkspaceRefused(msg)
            if current == OWNER and disabled:
                await _keep_an_owner(conn, actor.workspace_id, user_id)
            cur = await conn.execute(
                "UPDATE cairn_workspace_members "
                "SET disabled_at = CASE WHEN %s THEN now() END "
                "WHERE workspace_id = %s AND user_id = %s AND (disabled_at IS NULL) = %s",
                (disabled, actor.workspace_id, user_id, disabled),
            )
            changed = cur.rowcount > 0
            if changed:
                action = "member.disabled" if disabled else "member.enabled"
                await audit(conn, actor.workspace_id, actor.user_id, action, subject_id=user_id)
        return changed

    async def leave(self, member: Membership) -> None:
        """The member leaves the team (not their personal workspace); the last owner may not."""
        if member.personal:
            msg = "Your personal workspace is yours; it cannot be left."
            raise WorkspaceRefused(msg)
        async with self.pool.connection() as conn, conn.transaction():
            current = await _member_for_update(conn, member.workspace_id, member.user_id)
            if current == OWNER:
                await _keep_an_owner(conn, member.workspace_id, member.user_id)
            await conn.execute(
                "DELETE FROM cairn_workspace_members WHERE workspace_id = %s AND user_id = %s",
                (member.workspace_id, member.user_id),
            )
            await audit(
                conn, member.workspace_id, member.user_id, "member.left", subject_id=member.user_id
            )

    async def update_settings(self, actor: Membership, changes: dict[str, Any]) -> dict[str, Any]:
        """Merge checked settings into the workspace's (the caller checks their shape)."""
        _managing(actor)
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "UPDATE cairn_workspaces SET settings = settings || %s WHERE id = %s "
                "RETURNING settings",
                (Jsonb(changes), actor.workspace_id),
            )
            row = await cur.fetchone()
            assert row is not None
            await audit(conn, actor.workspace_id, actor.user_id, "settings.changed", detail=changes)
        return dict(row["settings"])

    async def record(
        self,
        workspace_id: str,
        actor_id: str | None,
        action: str,
        *,
        subject_id: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        """One audit entry (sign-ins, approvals, shares, tokens, support access ...)."""
        async with self.pool.connection() as conn:
            await audit(conn, workspace_id, actor_id, action, subject_id=subject_id, detail=detail)

    async def usage(self, actor: Membership) -> list[dict[str, Any]]:
        """This month's (UTC) model use in the workspace's conversations, per member (a
        manager's view: runs, tokens and cost, never what was asked); conversations deleted
        since still count, as they do against the team's budget."""
        _managing(actor)
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT m.user_id, m.display_name, count(u.run_id) AS runs, "
                "coalesce(sum(u.input_tokens + u.output_tokens), 0)::bigint AS tokens, "
                "coalesce(sum(u.cost), 0)::float8 AS cost "
                "FROM cairn_workspace_members m LEFT JOIN cairn_usage u ON u.user_id = m.user_id "
                "AND u.workspace_id = %(ws)s AND u.created_at >= "
                "date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' "
                "WHERE m.workspace_id = %(ws)s GROUP BY m.user_id, m.display_name "
                "ORDER BY tokens DESC, m.user_id",
                {"ws": actor.workspace_id},
            )
            return list(await cur.fetchall())

    async def sync_groups(
        self, user_id: str, groups: frozenset[str], display_name: str | None = None
    ) -> None:
        """At sign-in: the memberships CAIRN_OIDC_GROUPS gives for the verified groups claim.
        Joins the mapped workspaces (made on first use), follows role changes, and removes a
        membership from a group the user left. Memberships made by invitation or by creating
        the workspace are left alone, and so is a member an admin disabled (still disabled,
        still there). Audited like any other change."""
        rules = self.group_rules
        if not rules:
            return
        wanted: dict[str, GroupRule] = {}
        for rule in rules:
            if rule.group in groups:
                held = wanted.get(rule.workspace_id)
                if held is None or _RANK[rule.role] > _RANK[held.role]:
                    wanted[rule.workspace_id] = rule
        mapped = sorted({rule.workspace_id: rule for rule in rules}.items())
        async with self.pool.connection() as conn, conn.transaction():
            for workspace, rule in mapped:
                if workspace in wanted:
                    await conn.execute(
                        "INSERT INTO cairn_workspaces (id, name, created_by) "
                        "VALUES (%s, %s, 'oidc') ON CONFLICT DO NOTHING",
                        (workspace, rule.name),
                    )
            cur = await conn.execute(
                "SELECT workspace_id, role, source, disabled_at FROM cairn_workspace_members "
                "WHERE user_id = %s AND workspace_id = ANY(%s) ORDER BY workspace_id FOR UPDATE",
                (user_id, [w for w, _ in mapped]),
            )
            held_rows = {str(row["workspace_id"]): row for row in await cur.fetchall()}
            for workspace, _rule in mapped:
                await self._sync_one(
                    conn,
                    user_id,
                    workspace,
                    wanted.get(workspace),
                    held_rows.get(workspace),
                    display_name,
                )

    @staticmethod
    async def _sync_one(
        conn: AsyncConnection[Any],
        user_id: str,
        workspace: str,
        rule: GroupRule | None,
        held: dict[str, Any] | None,
        display_name: str | None,
    ) -> None:
        if held is not None and (held["source"] != "oidc" or held["role"] == OWNER):
            # An invitation's or the creator's membership, or one an owner made owner: not the
            # provider's to change (and never a way to leave a workspace without its owner).
            return
        if rule is None:
            if held is not None and held["disabled_at"] is None:
                await conn.execute(
                    "DELETE FROM cairn_workspace_members WHERE workspace_id = %s AND user_id = %s",
                    (workspace, user_id),
                )
                await audit(conn, workspace, None, "oidc.removed", subject_id=user_id)
            return
        if held is None:
            await conn.execute(
                "INSERT INTO cairn_workspace_members "
                "(workspace_id, user_id, role, source, display_name) "
                "VALUES (%s, %s, %s, 'oidc', %s)",
                (workspace, user_id, rule.role, display_name),
            )
            await audit(
                conn,
                workspace,
                None,
                "oidc.joined",
                subject_id=user_id,
                detail={"role": rule.role, "group": rule.group},
            )
        elif held["role"] != rule.role:
            await conn.execute(
                "UPDATE cairn_workspace_members SET role = %s "
                "WHERE workspace_id = %s AND user_id = %s",
                (rule.role, workspace, user_id),
            )
            await audit(
                conn,
                workspace,
                None,
                "role.changed",
                subject_id=user_id,
                detail={"from": str(held["role"]), "to": rule.role, "group": rule.group},
            )

    async def audit_log(self, workspace_id: str, *, limit: int = 200) -> list[dict[str, Any]]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT id, actor_id, subject_id, action, detail, at FROM cairn_workspace_audit "
                "WHERE workspace_id = %s ORDER BY id DESC LIMIT %s",
                (workspace_id, limit),
            )
            return list(await cur.fetchall())

    async def audit_about(self, user_id: str) -> list[dict[str, Any]]:
        """Every entry naming the user as actor or subject, in any workspace (their export)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT a.id, a.workspace_id, w.name AS workspace, a.actor_id, a.subject_id, "
                "a.action, a.detail, a.at FROM cairn_workspace_audit a "
                "JOIN cairn_workspaces w ON w.id = a.workspace_id "
                "WHERE a.actor_id = %s OR a.subject_id = %s ORDER BY a.id",
                (user_id, user_id),
            )
            return list(await cur.fetchall())


async def audit(
    conn: AsyncConnection[Any],
    workspace_id: str,
    actor_id: str | None,
    action: str,
    *,
    subject_id: str | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    """One audit entry, in the caller's transaction (it commits or rolls back with the change)."""
    await conn.execute(
        "INSERT INTO cairn_workspace_audit (workspace_id, actor_id, subject_id, action, detail) "
        "VALUES (%s, %s, %s, %s, %s)",
        (workspace_id, actor_id, subject_id, action, Jsonb(detail or {})),
    )


def _checked_name(name: str) -> str:
    name = " ".join(str(name).split())
    if not name or len(name) > MAX_NAME_CHARS or any(ord(c) < 32 for c in name):
        msg = f"A workspace name is 1 to {MAX_NAME_CHARS} characters."
        raise WorkspaceRefused(msg)
    return name


def _managing(actor: Membership) -> None:
    if actor.personal:
        msg = "A personal workspace has no other members."
        raise WorkspaceRefused(msg)
    if not actor.manages:
        raise WorkspaceNotFound


async def _member_for_update(conn: AsyncConnection[Any], workspace_id: str, user_id: str) -> str:
    cur = await conn.execute(
        "SELECT role FROM cairn_workspace_members WHERE workspace_id = %s AND user_id = %s "
        "FOR UPDATE",
        (workspace_id, user_id),
    )
    row = await cur.fetchone()
    if row is None:
        msg = "No such member in this workspace."
        raise WorkspaceRefused(msg)
    return str(row["role"])


async def _keep_an_owner(conn: AsyncConnection[Any], workspace_id: str, user_id: str) -> None:
    # Every owner row locked, so two owners demoting each other at once cannot leave none.
    cur = await conn.execute(
        "SELECT user_id FROM cairn_workspace_members WHERE workspace_id = %s AND role = 'owner' "
        "AND disabled_at IS NULL FOR UPDATE",
        (workspace_id,),
    )
    owners = {str(row["user_id"]) for row in await cur.fetchall()}
    if not owners - {user_id}:
        msg = "A workspace keeps at least one owner; make someone else owner first."
        raise WorkspaceRefused(msg)


async def _active_workspace(request: Request, user_id: CurrentUserId) -> Membership:
    workspaces = getattr(request.app.state, "workspaces", None)
    if not isinstance(workspaces, Workspaces):
        raise HTTPException(status_code=503, detail="Starting up")
    return await workspaces.active(user_id)


ActiveWorkspace = Annotated[Membership, Depends(_active_workspace)]
"""For FastAPI routes: the signed-in user's active workspace and their role in it."""


def http_refusal() -> HTTPException:
    return HTTPException(status_code=404, detail=NOT_FOUND)
