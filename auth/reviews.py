"""Four-eyes approval: a team's plans that wait for a reviewer, and who decided them.

A workspace setting per agent ("review": {"planner": true}) makes a member's plan in a team
conversation wait for a reviewer: the run pauses at its approval question as always, the
question is queued here, and the requester may edit or reject it but not approve it. Only
members with the reviewer role see the queue and decide, never on their own plans; the first
decision wins (one UPDATE takes a review out of 'pending', on any worker), and each request and
decision is written to the workspace's audit log with it. The run then resumes through the
turn runner's own Command(resume) path (ui/review_page.py).

What a reviewer sees is the plan (goal, steps, estimate) and who asked: the question the run
itself shows. Admins do not see the queue unless they are also reviewers of the team (an admin
reads no one's conversations).
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb

from auth.workspaces import REVIEWER, Membership, WorkspaceNotFound, audit

if TYPE_CHECKING:
    from collections.abc import Collection

    from psycopg import AsyncConnection

    from graphs.core.persistence import Pool

log = logging.getLogger("cairn.security")

DECIDED_CHANNEL = "cairn_review_decided"
"""Postgres NOTIFY channel: a review was decided (payload: its id), for the worker where the
requester has the conversation open to tell them (ui/recovery.announce_decisions)."""
SETTING = "review"
"""cairn_workspaces.settings["review"]: {agent key: True} for the agents whose plans wait."""
DECISIONS = ("approve", "edit", "reject")
MAX_QUEUE = 200
MAX_DETAIL_CHARS = 20_000
"""A question's details are the plan the run shows; a bigger one is cut, not stored whole."""


class ReviewNotFound(LookupError):
    """Missing, foreign, the reviewer's own, or not theirs to see: all look the same."""


class AlreadyDecided(Exception):
    """Another reviewer (or the requester, by editing or rejecting) got there first."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


@dataclass(frozen=True)
class Review:
    id: str
    workspace_id: str
    thread_id: str
    interrupt_id: str
    agent: str
    requester_id: str
    requester_name: str
    details: dict[str, Any]
    status: str
    decided_by: str | None
    decided_at: datetime | None
    created_at: datetime
    edit_text: str | None = None
    """A reviewer's Edit: the new steps or feedback, as the run's edit takes them."""

    def public(self) -> dict[str, Any]:
        """What the queue shows: the plan and who asked (never the conversation's id)."""
        return {
            "id": self.id,
            "agent": self.agent,
            "requester": self.requester_name,
            "details": self.details,
            "status": self.status,
            "created_at": self.created_at.isoformat(),
            "decided_at": self.decided_at.isoformat() if self.decided_at else None,
        }


_SELECT = (
    "SELECT r.*, coalesce(m.display_name, 'A member') AS requester_name FROM cairn_reviews r "
    "JOIN cairn_workspace_members m ON m.workspace_id = r.workspace_id "
    "AND m.user_id = r.requester_id AND m.disabled_at IS NULL "
)
"""Only requests of live members: a disabled or departed member's plans leave the queue."""


def _review(row: dict[str, Any]) -> Review:
    return Review(
        id=str(row["id"]),
        workspace_id=str(row["workspace_id"]),
        thread_id=str(row["thread_id"]),
        interrupt_id=str(row["interrupt_id"]),
        agent=str(row["agent"]),
        requester_id=str(row["requester_id"]),
        requester_name=str(row["requester_name"]),
        details=dict(row["details"]),
        status=str(row["status"]),
        decided_by=row["decided_by"],
        decided_at=row["decided_at"],
        created_at=row["created_at"],
        edit_text=row.get("edit_text"),
    )


def _bounded(details: dict[str, Any]) -> dict[str, Any]:
    text = str(details)
    if len(text) <= MAX_DETAIL_CHARS:
        return details
    plan = [str(step)[:500] for step in (details.get("plan") or [])][:50]
    return {"goal": str(details.get("goal") or "")[:1000], "plan": plan, "cut": True}


class Reviews:
    """The review queue, in Postgres (every worker)."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.carrying: set[str] = set()
        """Reviews this worker is carrying out now (it tells the requester itself)."""

    async def required(self, workspace_id: str | None, agent: str) -> bool:
        """Whether a plan of `agent` in that workspace waits for a reviewer (never in a
        personal workspace: NULL)."""
        if workspace_id is None:
            return False
        async with self.pool.connection() as conn:
            return await self._required(conn, workspace_id, agent)

    async def after_run(
        self,
        *,
        workspace_id: str | None,
        thread_id: str,
        agent: str,
        requester_id: str,
        waiting: dict[str, dict[str, Any]],
    ) -> bool:
        """After a run of a team conversation: queue each reviewable question it paused on
        (`waiting`: interrupt id -> what it shows) when the workspace wants reviews, and
        withdraw the thread's requests whose question is no longer pending (the requester
        edited or rejected it). True when something of this thread waits for a reviewer."""
        if workspace_id is None:
            return False
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute(
                "UPDATE cairn_reviews SET status = 'withdrawn', decided_at = now() "
                "WHERE thread_id = %s AND status = 'pending' AND interrupt_id <> ALL(%s)",
                (thread_id, list(waiting)),
            )
            if not waiting or not await self._required(conn, workspace_id, agent):
                return False
            for interrupt_id, details in waiting.items():
                review_id = "rv-" + secrets.token_hex(12)
                cur = await conn.execute(
                    "INSERT INTO cairn_reviews (id, workspace_id, thread_id, interrupt_id, "
                    "agent, requester_id, details) VALUES (%s, %s, %s, %s, %s, %s, %s) "
                    "ON CONFLICT (thread_id, interrupt_id) DO NOTHING RETURNING id",
                    (
                        review_id,
                        workspace_id,
                        thread_id,
                        interrupt_id,
                        agent,
                        requester_id,
                        Jsonb(_bounded(details)),
                    ),
                )
                if await cur.fetchone() is not None:
                    await audit(
                        conn,
                        workspace_id,
                        requester_id,
                        "review.requested",
                        detail={"review": review_id, "agent": agent},
                    )
        return True

    @staticmethod
    async def _required(conn: AsyncConnection[Any], workspace_id: str, agent: str) -> bool:
        cur = await conn.execute(
            "SELECT coalesce((settings -> %s ->> %s)::boolean, false) AS required "
            "FROM cairn_workspaces WHERE id = %s AND personal_of IS NULL",
            (SETTING, agent, workspace_id),
        )
        row = await cur.fetchone()
        return bool(row and row["required"])

    async def queue(self, reviewer: Membership) -> list[Review]:
        """Pending plans of the reviewer's workspace, oldest first, except their own."""
        _reviewing(reviewer)
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                _SELECT + "WHERE r.workspace_id = %s AND r.status = 'pending' "
                "AND r.requester_id <> %s ORDER BY r.created_at LIMIT %s",
                (reviewer.workspace_id, reviewer.user_id, MAX_QUEUE),
            )
            return [_review(row) for row in await cur.fetchall()]

    async def decided(self, reviewer: Membership, *, limit: int = 50) -> list[Review]:
        """The workspace's latest decisions (the reviewers' record)."""
        _reviewing(reviewer)
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                _SELECT + "WHERE r.workspace_id = %s AND r.status IN ('approve', 'edit', "
                "'reject') ORDER BY r.decided_at DESC LIMIT %s",
                (reviewer.workspace_id, limit),
            )
            return [_review(row) for row in await cur.fetchall()]

    async def decide(
        self,
        reviewer: Membership,
        review_id: str,
        decision: str,
        edit_text: str | None = None,
    ) -> Review:
        """Take the review out of 'pending' with the decision: once, by a reviewer of its
        workspace who did not ask for it. AlreadyDecided when someone got there first.
        The run is then resumed by the caller (ui/recovery.carry_out); until that is done
        (`applied`), any worker's sweep takes it up again (take_unapplied)."""
        _reviewing(reviewer)
        if decision not in DECISIONS:
            raise ReviewNotFound
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "UPDATE cairn_reviews r SET status = %s, decided_by = %s, decided_at = now(), "
                "tried_at = now(), edit_text = %s "
                "FROM cairn_workspace_members m WHERE r.id = %s AND r.workspace_id = %s "
                "AND r.requester_id <> %s AND r.status = 'pending' "
                "AND m.workspace_id = r.workspace_id AND m.user_id = r.requester_id "
                "AND m.disabled_at IS NULL RETURNING r.*, "
                "coalesce(m.display_name, 'A member') AS requester_name",
                (
                    decision,
                    reviewer.user_id,
                    edit_text if decision == "edit" else None,
                    review_id,
                    reviewer.workspace_id,
                    reviewer.user_id,
                ),
            )
            row = await cur.fetchone()
            if row is None:
                cur = await conn.execute(
                    "SELECT status FROM cairn_reviews WHERE id = %s AND workspace_id = %s "
                    "AND requester_id <> %s",
                    (review_id, reviewer.workspace_id, reviewer.user_id),
                )
                seen = await cur.fetchone()
                if seen is not None and seen["status"] != "pending":
                    raise AlreadyDecided(str(seen["status"]))
                log.warning("refused: review %s by %s", review_id[:40], reviewer.user_id)
                raise ReviewNotFound
            await conn.execute("SELECT pg_notify(%s, %s)", (DECIDED_CHANNEL, review_id))
            await audit(
                conn,
                reviewer.workspace_id,
                reviewer.user_id,
                f"review.{decision}",
                subject_id=str(row["requester_id"]),
                detail={"review": review_id, "agent": str(row["agent"])},
            )
        return _review(row)

    async def decided_one(self, review_id: str) -> tuple[Review, str] | None:
        """A decided review and its reviewer's name, for telling its requester (a worker
        that heard DECIDED_CHANNEL); None when it is gone or not decided."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT r.*, coalesce(m.display_name, 'A member') AS requester_name, "
                "coalesce(d.display_name, 'a reviewer') AS reviewer_name FROM cairn_reviews r "
                "JOIN cairn_workspace_members m ON m.workspace_id = r.workspace_id "
                "AND m.user_id = r.requester_id AND m.disabled_at IS NULL "
                "LEFT JOIN cairn_workspace_members d ON d.workspace_id = r.workspace_id "
                "AND d.user_id = r.decided_by "
                "WHERE r.id = %s AND r.status IN ('approve', 'edit', 'reject')",
                (review_id,),
            )
            row = await cur.fetchone()
        return (_review(row), str(row["reviewer_name"])) if row is not None else None

    async def applied(self, review: Review) -> None:
        """The decided run was resumed (or its question was no longer waiting): done."""
        async with self.pool.connection() as conn:
            await conn.execute(
                "UPDATE cairn_reviews SET applied_at = now() WHERE id = %s", (review.id,)
            )

    async def take_unapplied(self, *, stale_s: float, limit: int = 20) -> list[Review]:
        """Decisions whose run was not resumed within stale_s (the worker that took them
        stopped): this worker's to carry out now. Taken with SKIP LOCKED and the attempt time
        moved on, so two workers' sweeps never take the same one at once."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "WITH due AS (SELECT id FROM cairn_reviews WHERE applied_at IS NULL "
                "AND status IN ('approve', 'edit', 'reject') "
                "AND tried_at < now() - make_interval(secs => %s) "
                "ORDER BY tried_at LIMIT %s FOR UPDATE SKIP LOCKED) "
                "UPDATE cairn_reviews r SET tried_at = now() FROM due WHERE r.id = due.id "
                "RETURNING r.*, 'A member' AS requester_name",
                (stale_s, limit),
            )
            return [_review(row) for row in await cur.fetchall()]

    async def for_thread(self, thread_id: str, interrupt_ids: Collection[str]) -> list[Review]:
        """The reviews of those questions of a thread (its owner's view: who decided, when)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                _SELECT + "WHERE r.thread_id = %s AND r.interrupt_id = ANY(%s)",
                (thread_id, list(interrupt_ids)),
            )
            return [_review(row) for row in await cur.fetchall()]


def _reviewing(member: Membership) -> None:
    if member.personal or member.role != REVIEWER:
        raise WorkspaceNotFound
