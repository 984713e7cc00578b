"""The workspace page: switch workspace, make a team, join one, and (owners and admins) manage it.

The user and their role come only from the verified session and stored membership
(auth/workspaces.py); a workspace the user is not a live member of, or one whose management
they are not allowed, gets the same 404 a made-up id gets. State-changing requests carry the
memory page's request header from an allowed origin (`Checked`). Disabling a member ends every
session of theirs on every worker at once (SessionRevocations.revoke: the cut-off is in
Postgres and every worker hears it and closes their live connections); their team tokens stop
working because token lookups check the membership. An admin sees members, invitations, usage
and the audit log here, never anyone's conversations or memories; the team plan gallery's
routes (ui/gallery_page.py) and the team's research source memory (ui/team_sources_page.py) are
part of this page. A member who leaves takes their goals out of the gallery: their entries stay
only as anonymised steps, and their conversations' source counts only unnamed.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict, Field

from auth.identity import CurrentUserId, flag_client_identity
from auth.reviews import SETTING as REVIEW_SETTING
from auth.workspaces import (
    INVITABLE,
    MAX_NAME_CHARS,
    ROLES,
    Membership,
    WorkspaceNotFound,
    WorkspaceRefused,
    Workspaces,
    http_refusal,
)
from graphs.core.runs import TEAM_RUNS, team_cap
from graphs.core.usage import TEAM_BUDGET, team_budget, team_month
from graphs.memory.gallery import anonymise_author
from graphs.memory.privacy import TEAM_RETENTION
from graphs.memory.team_sources import anonymise_source_author
from ui.gallery_page import build_router as build_gallery_router
from ui.memory_page import Checked, DisplayName
from ui.runtime import AppRuntime, Runtime
from ui.team_sources_page import build_router as build_sources_router

log = logging.getLogger("cairn.security")

PAGE = Path(__file__).resolve().parent.parent / "public" / "workspace.html"
INVITE_NOT_USABLE = "This invitation is not valid: it was used, revoked or has expired."


class CreateBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]


class SwitchBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    workspace_id: Annotated[str, Field(max_length=40)]


class JoinBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    code: Annotated[str, Field(min_length=1, max_length=100)]


class InviteBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Annotated[str, Field(max_length=20)] = "member"
    days: Annotated[int, Field(ge=1, le=30)] = 7


class RoleBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Annotated[str, Field(max_length=20)]


class SettingsBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    review: dict[Annotated[str, Field(max_length=40)], bool] = Field(max_length=20)
    """Per agent key: whether its plans wait for a reviewer (auth/reviews.py)."""


MAX_TEAM_TOKENS = 10**12
"""The largest team budget in tokens a manager may set (a bound, not a guess at real use)."""
MAX_TEAM_COST = 1_000_000.0
MAX_TEAM_RUNS = 1000


class BudgetBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    tokens: Annotated[int, Field(ge=0, le=MAX_TEAM_TOKENS, strict=True)] | None = None
    """Per calendar month (UTC); null or 0: no token budget."""
    cost: Annotated[float, Field(ge=0, le=MAX_TEAM_COST, allow_inf_nan=False)] | None = None
    """The same in money (estimated at the configured prices); null or 0: none."""


class LimitsBody(BaseModel):
    """The team's budget and run cap; a field left out keeps its setting."""

    model_config = ConfigDict(extra="ignore")
    budget: BudgetBody | None = None
    max_runs: Annotated[int, Field(ge=0, le=MAX_TEAM_RUNS, strict=True)] | None = None
    """Runs of the team's conversations going at once on every worker; null or 0: no cap."""

    def changes(self) -> dict[str, Any]:
        """The settings to merge (a zero is stored as null: no limit)."""
        found: dict[str, Any] = {}
        if "budget" in self.model_fields_set:
            budget = self.budget or BudgetBody()
            found[TEAM_BUDGET] = {"tokens": budget.tokens or None, "cost": budget.cost or None}
        if "max_runs" in self.model_fields_set:
            found[TEAM_RUNS] = self.max_runs or None
        return found


def team_limits(settings: dict[str, Any]) -> dict[str, Any]:
    """The team's budget and cap as its settings hold them (null: no limit)."""
    budget = team_budget(settings.get(TEAM_BUDGET))
    return {
        "budget": {"tokens": budget.tokens or None, "cost": budget.cost or None},
        "max_runs": team_cap(settings.get(TEAM_RUNS)) or None,
    }


def reviewable_agents(runtime: AppRuntime) -> list[dict[str, str]]:
    """The agents whose plans a team may send to a reviewer (an approval question marked
    reviewable in their spec)."""
    return [
        {"key": spec.key, "profile": spec.profile}
        for spec in runtime.agents
        if any(kind.reviewable for kind in spec.interrupts)
    ]


class RetentionBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    days: Annotated[int, Field(ge=1, le=3650, strict=True)] | None
    """Days a team conversation may stay inactive before it is deleted; null: each member's own
    setting."""


class DisableBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    disabled: bool


def _workspaces(runtime: AppRuntime) -> Workspaces:
    if runtime.workspaces is None:
        raise HTTPException(status_code=503, detail="Cairn is still starting")
    return runtime.workspaces


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _refused(exc: WorkspaceRefused) -> HTTPException:
    return HTTPException(status_code=422, detail=str(exc))


async def _membership(
    runtime: AppRuntime, user_id: str, workspace_id: str, *, manage: bool = False
) -> Membership:
    """The caller's live membership (a manager's when manage), else the 404 of a missing one."""
    try:
        found = await _workspaces(runtime).membership(user_id, workspace_id)
    except WorkspaceNotFound:
        log.warning("refused or missing: user %s asked for workspace %s", user_id, workspace_id)
        raise http_refusal() from None
    if manage and (found.personal or not found.manages):
        log.warning(
            "refused: user %s (%s) managing workspace %s", user_id, found.role, workspace_id
        )
        raise http_refusal()
    return found


def _member_row(row: dict[str, Any], *, full: bool) -> dict[str, Any]:
    shown = {
        "user_id": row["user_id"],
        "name": row["display_name"] or row["user_id"],
        "role": row["role"],
        "joined_at": _iso(row["joined_at"]),
    }
    if full:
        shown |= {"source": row["source"], "disabled": row["disabled_at"] is not None}
    return shown


def build_router() -> APIRouter:
    router = APIRouter()

    @router.get("/workspace", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(PAGE, headers={"Cache-Control": "no-store"})

    @router.get("/api/workspaces")
    async def overview(user_id: CurrentUserId, runtime: Runtime) -> dict[str, Any]:
        workspaces = _workspaces(runtime)
        active = await workspaces.active(user_id)
        return {
            "active": active.public(),
            "workspaces": [m.public() for m in await workspaces.memberships(user_id)],
            "roles": list(ROLES),
            "invitable": list(INVITABLE),
        }

    @router.post("/api/workspaces", dependencies=[Checked])
    async def create(
        body: CreateBody,
        request: Request,
        user_id: CurrentUserId,
        name: DisplayName,
        runtime: Runtime,
    ) -> dict[str, Any]:
        flag_client_identity(await request.json(), where="workspace", user_id=user_id)
        workspaces = _workspaces(runtime)
        try:
            made = await workspaces.create(user_id, body.name, display_name=name)
        except WorkspaceRefused as exc:
            raise _refused(exc) from None
        await workspaces.switch(user_id, made.workspace_id)
        return {"active": made.public()}

    @router.post("/api/workspaces/switch", dependencies=[Checked])
    async def switch(body: SwitchBody, user_id: CurrentUserId, runtime: Runtime) -> dict[str, Any]:
        try:
            chosen = await _workspaces(runtime).switch(user_id, body.workspace_id)
        except WorkspaceNotFound:
            log.warning("refused or missing: user %s switching to %s", user_id, body.workspace_id)
            raise http_refusal() from None
        return {"active": chosen.public()}

    @router.post("/api/workspaces/join", dependencies=[Checked])
    async def join(
        body: JoinBody, user_id: CurrentUserId, name: DisplayName, runtime: Runtime
    ) -> dict[str, Any]:
        workspaces = _workspaces(runtime)
        try:
            joined = await workspaces.accept(user_id, body.code.strip(), display_name=name)
        except WorkspaceNotFound:
            raise HTTPException(status_code=404, detail=INVITE_NOT_USABLE) from None
        await workspaces.switch(user_id, joined.workspace_id)
        return {"active": joined.public()}

    @router.get("/api/workspaces/{workspace_id}")
    async def details(
        workspace_id: str, user_id: CurrentUserId, runtime: Runtime
    ) -> dict[str, Any]:
        mine = await _membership(runtime, user_id, workspace_id)
        workspaces = _workspaces(runtime)
        manages = mine.manages and not mine.personal
        members = await workspaces.members(workspace_id)
        shown: dict[str, Any] = {
            "workspace": mine.public(),
            "me": user_id,
            "members": [
                _member_row(row, full=manages)
                for row in members
                if manages or row["disabled_at"] is None
            ],
        }
        if manages:
            settings = await workspaces.settings(workspace_id)
            shown["review"] = {
                "agents": reviewable_agents(runtime),
                "required": dict(settings.get(REVIEW_SETTING) or {}),
            }
            shown["retention_days"] = settings.get(TEAM_RETENTION)
            shown["invites"] = [
                {
                    "id": row["id"],
                    "role": row["role"],
                    "created_at": _iso(row["created_at"]),
                    "expires_at": _iso(row["expires_at"]),
                    "expired": bool(row["expired"]),
                }
                for row in await workspaces.invites(mine)
            ]
            shown["usage"] = [
                {
                    "user_id": row["user_id"],
                    "name": row["display_name"] or row["user_id"],
                    "runs": int(row["runs"]),
                    "tokens": int(row["tokens"]),
                    "cost": round(float(row["cost"]), 6),
                }
                for row in await workspaces.usage(mine)
            ]
            month = await team_month(workspaces.pool, workspace_id)
            shown["limits"] = team_limits(settings) | {
                "month": {
                    "runs": month.runs,
                    "tokens": month.tokens,
                    "cost": round(month.cost, 6),
                    "reserved_tokens": month.reserved_tokens,
                }
            }
        return shown

    @router.get("/api/workspaces/{workspace_id}/audit")
    async def audit_log(
        workspace_id: str, user_id: CurrentUserId, runtime: Runtime
    ) -> dict[str, Any]:
        await _membership(runtime, user_id, workspace_id, manage=True)
        rows = await _workspaces(runtime).audit_log(workspace_id)
        return {
            "entries": [
                {
                    "id": row["id"],
                    "at": _iso(row["at"]),
                    "actor": row["actor_id"],
                    "subject": row["subject_id"],
                    "action": row["action"],
                    "detail": row["detail"],
                }
                for row in rows
            ]
        }

    @router.post("/api/workspaces/{workspace_id}/invites", dependencies=[Checked])
    async def invite(
        workspace_id: str,
        body: InviteBody,
        request: Request,
        user_id: CurrentUserId,
        runtime: Runtime,
    ) -> dict[str, Any]:
        flag_client_identity(await request.json(), where="invitation", user_id=user_id)
        mine = await _membership(runtime, user_id, workspace_id, manage=True)
        try:
            code, expires = await _workspaces(runtime).invite(
                mine, body.role, timedelta(days=body.days)
            )
        except WorkspaceRefused as exc:
            raise _refused(exc) from None
        # The only time the code leaves the server; in the link's fragment, so no server or
        # proxy log ever records it.
        return {
            "code": code,
            "link": f"{runtime.public_url}/workspace#join={code}",
            "role": body.role,
            "expires_at": expires.isoformat(),
        }

    @router.post(
        "/api/workspaces/{workspace_id}/invites/{invite_id}/revoke", dependencies=[Checked]
    )
    async def revoke_invite(
        workspace_id: str, invite_id: str, user_id: CurrentUserId, runtime: Runtime
    ) -> dict[str, str]:
        mine = await _membership(runtime, user_id, workspace_id, manage=True)
        if not await _workspaces(runtime).revoke_invite(mine, invite_id):
            raise HTTPException(status_code=404, detail="Invitation not found")
        return {"revoked": invite_id}

    @router.post("/api/workspaces/{workspace_id}/members/{member_id}/role", dependencies=[Checked])
    async def set_role(
        workspace_id: str,
        member_id: str,
        body: RoleBody,
        user_id: CurrentUserId,
        runtime: Runtime,
    ) -> dict[str, str]:
        mine = await _membership(runtime, user_id, workspace_id, manage=True)
        try:
            await _workspaces(runtime).set_role(mine, member_id, body.role)
        except WorkspaceRefused as exc:
            raise _refused(exc) from None
        return {"user_id": member_id, "role": body.role}

    @router.post(
        "/api/workspaces/{workspace_id}/members/{member_id}/disable", dependencies=[Checked]
    )
    async def set_disabled(
        workspace_id: str,
        member_id: str,
        body: DisableBody,
        user_id: CurrentUserId,
        runtime: Runtime,
    ) -> dict[str, Any]:
        mine = await _membership(runtime, user_id, workspace_id, manage=True)
        try:
            changed = await _workspaces(runtime).set_disabled(
                mine, member_id, disabled=body.disabled
            )
        except WorkspaceRefused as exc:
            raise _refused(exc) from None
        if changed and body.disabled and runtime.revocations is not None:
            # Membership is already gone in Postgres (every request checks it); this also ends
            # the sessions and live connections they hold right now, on every worker.
            await runtime.revocations.revoke(member_id)
        return {"user_id": member_id, "disabled": body.disabled, "changed": changed}

    @router.post("/api/workspaces/{workspace_id}/settings", dependencies=[Checked])
    async def update_settings(
        workspace_id: str, body: SettingsBody, user_id: CurrentUserId, runtime: Runtime
    ) -> dict[str, Any]:
        mine = await _membership(runtime, user_id, workspace_id, manage=True)
        known = {agent["key"] for agent in reviewable_agents(runtime)}
        if unknown := sorted(set(body.review) - known):
            detail = f"Only these agents' plans can wait for a reviewer: {', '.join(sorted(known))}"
            log.warning("refused: review setting for %s", unknown[:3])
            raise HTTPException(status_code=422, detail=detail)
        review = {key: body.review.get(key, False) for key in sorted(known)}
        saved = await _workspaces(runtime).update_settings(mine, {REVIEW_SETTING: review})
        return {"review": saved.get(REVIEW_SETTING, {})}

    @router.post("/api/workspaces/{workspace_id}/limits", dependencies=[Checked])
    async def update_limits(
        workspace_id: str,
        body: LimitsBody,
        request: Request,
        user_id: CurrentUserId,
        runtime: Runtime,
    ) -> dict[str, Any]:
        flag_client_identity(await request.json(), where="workspace limits", user_id=user_id)
        mine = await _membership(runtime, user_id, workspace_id, manage=True)
        workspaces = _workspaces(runtime)
        changes = body.changes()
        saved = (
            await workspaces.update_settings(mine, changes)
            if changes
            else await workspaces.settings(workspace_id)
        )
        return team_limits(saved)

    @router.post("/api/workspaces/{workspace_id}/retention", dependencies=[Checked])
    async def set_retention(
        workspace_id: str, body: RetentionBody, user_id: CurrentUserId, runtime: Runtime
    ) -> dict[str, Any]:
        """How long the team's inactive conversations are kept (graphs.memory.privacy
        apply_retention: never longer than a member's own window; null: theirs)."""
        mine = await _membership(runtime, user_id, workspace_id, manage=True)
        saved = await _workspaces(runtime).update_settings(mine, {TEAM_RETENTION: body.days})
        return {"retention_days": saved.get(TEAM_RETENTION)}

    @router.post("/api/workspaces/{workspace_id}/leave", dependencies=[Checked])
    async def leave(workspace_id: str, user_id: CurrentUserId, runtime: Runtime) -> dict[str, Any]:
        mine = await _membership(runtime, user_id, workspace_id)
        workspaces = _workspaces(runtime)
        try:
            await workspaces.leave(mine)
        except WorkspaceRefused as exc:
            raise _refused(exc) from None
        if runtime.persistence is not None:  # what they leave behind in its gallery: steps only
            store = runtime.persistence.store
            await anonymise_author(store, user_id, workspace_id=workspace_id)
            # ... and in its source memory: their conversations' counts, unnamed.
            await anonymise_source_author(store, user_id, workspace_id=workspace_id)
        return {"active": (await workspaces.active(user_id)).public()}

    router.include_router(build_gallery_router())
    router.include_router(build_sources_router())

    return router
