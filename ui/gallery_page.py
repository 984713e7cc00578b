"""The team plan gallery's routes: members list it, owners and admins delete from it (audited).

The caller's membership comes from the verified session and stored membership only; a personal
workspace (it has no gallery), a workspace the caller is not a live member of, a member asking
to delete and a key the workspace does not hold all get the same 404 a made-up workspace id
gets. Entries are shown without their author or conversation (graphs.memory.gallery).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter

from auth.identity import CurrentUserId
from auth.workspaces import MANAGERS, Membership, http_refusal
from graphs.memory.gallery import TeamGallery
from ui.memory_page import ITEM_ID, Checked
from ui.runtime import AppRuntime, Runtime
from ui.team_access import started_workspaces, team_member

log = logging.getLogger("cairn.security")


async def _team(runtime: AppRuntime, user_id: str, workspace_id: str, *roles: str) -> Membership:
    return await team_member(runtime, user_id, workspace_id, *roles, what="gallery")


def _gallery(runtime: AppRuntime, workspace_id: str) -> TeamGallery:
    assert runtime.persistence is not None
    return TeamGallery(runtime.persistence.store, workspace_id)


async def list_gallery(
    workspace_id: str, user_id: CurrentUserId, runtime: Runtime
) -> dict[str, Any]:
    mine = await _team(runtime, user_id, workspace_id)
    entries = await _gallery(runtime, mine.workspace_id).entries()
    return {"entries": [e.public() for e in entries], "can_delete": mine.manages}


async def delete_entry(
    workspace_id: str, key: str, user_id: CurrentUserId, runtime: Runtime
) -> dict[str, str]:
    mine = await _team(runtime, user_id, workspace_id, *sorted(MANAGERS))
    # A key of the wrong shape cannot be in any gallery: the same answer as a missing one.
    deleted = (
        await _gallery(runtime, mine.workspace_id).delete(key) if ITEM_ID.fullmatch(key) else None
    )
    if deleted is None:
        log.warning("refused or missing: gallery entry in %s asked by %s", workspace_id, user_id)
        raise http_refusal()
    await started_workspaces(runtime).record(
        mine.workspace_id, user_id, "gallery.deleted", detail={"key": key}
    )
    return {"deleted": key}


def build_router() -> APIRouter:
    router = APIRouter()
    router.add_api_route("/api/workspaces/{workspace_id}/gallery", list_gallery, methods=["GET"])
    router.add_api_route(
        "/api/workspaces/{workspace_id}/gallery/{key}",
        delete_entry,
        methods=["DELETE"],
        dependencies=[Checked],
    )
    return router
