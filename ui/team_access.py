"""A team route's caller, checked: the live membership from the verified session and stored
membership only, or the 404 a made-up workspace gets (shared by the team pages' routes)."""

from __future__ import annotations

import logging

from fastapi import HTTPException

from auth.workspaces import Membership, WorkspaceNotFound, Workspaces, http_refusal
from ui.runtime import AppRuntime

log = logging.getLogger("cairn.security")


def started_workspaces(runtime: AppRuntime) -> Workspaces:
    if runtime.workspaces is None or runtime.persistence is None:
        raise HTTPException(status_code=503, detail="Cairn is still starting")
    return runtime.workspaces


async def team_member(
    runtime: AppRuntime, user_id: str, workspace_id: str, *roles: str, what: str
) -> Membership:
    """The caller's live membership of the team holding one of roles (any, when none); a
    personal workspace, a foreign or made-up one and a role the caller lacks all get the same
    404. `what` names the thing asked for in the log."""
    try:
        found = await started_workspaces(runtime).require(user_id, workspace_id, *roles)
    except WorkspaceNotFound:
        log.warning(
            "refused or missing: user %s asked for the %s of %s", user_id, what, workspace_id
        )
        raise http_refusal() from None
    if found.personal:
        raise http_refusal()
    return found
