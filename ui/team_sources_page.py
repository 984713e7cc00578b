"""A team's research source memory: members list what it learned, owners and admins delete.

The caller's membership comes from the verified session and stored membership only; a personal
workspace (its sources are the user's own, on the memory page), a workspace the caller is not a
live member of, a member asking to delete and a source the workspace does not hold all get the
same 404 a made-up workspace id gets. Sources are shown without the conversations or members
their counts came from (graphs.memory.team_sources).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter

from auth.identity import CurrentUserId
from auth.workspaces import MANAGERS, Membership, http_refusal
from graphs.memory.team_sources import TeamSources, public
from ui.memory_page import ITEM_ID, Checked
from ui.runtime import AppRuntime, Runtime
from ui.team_access import started_workspaces, team_member

log = logging.getLogger("cairn.security")


async def _team(runtime: AppRuntime, user_id: str, workspace_id: str, *roles: str) -> Membership:
    return await team_member(runtime, user_id, workspace_id, *roles, what="sources")


def _sources(runtime: AppRuntime, workspace_id: str) -> TeamSources:
    assert runtime.persistence is not None
    return TeamSources(runtime.persistence.store, workspace_id)


async def list_sources(
    workspace_id: str, user_id: CurrentUserId, runtime: Runtime
) -> dict[str, Any]:
    mine = await _team(runtime, user_id, workspace_id)
    sources = await _sources(runtime, mine.workspace_id).sources()
    return {"sources": [public(s) for s in sources], "can_delete": mine.manages}


async def delete_source(
    workspace_id: str, key: str, user_id: CurrentUserId, runtime: Runtime
) -> dict[str, str]:
    mine = await _team(runtime, user_id, workspace_id, *sorted(MANAGERS))
    # An id of the wrong shape names no source: the same answer as a missing one.
    memory = _sources(runtime, mine.workspace_id)
    gone = await memory.forget_source(key) if ITEM_ID.fullmatch(key) else None
    if gone is None:
        log.warning("refused or missing: team source in %s asked by %s", workspace_id, user_id)
        raise http_refusal()
    await started_workspaces(runtime).record(
        mine.workspace_id, user_id, "sources.deleted", detail={"key": key, "source": gone.source}
    )
    return {"deleted": key, "source": gone.source}


def build_router() -> APIRouter:
    router = APIRouter()
    router.add_api_route("/api/workspaces/{workspace_id}/sources", list_sources, methods=["GET"])
    router.add_api_route(
        "/api/workspaces/{workspace_id}/sources/{key}",
        delete_source,
        methods=["DELETE"],
        dependencies=[Checked],
    )
    return router
