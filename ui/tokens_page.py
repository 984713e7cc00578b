"""The access tokens page: personal access tokens for the agents' MCP endpoint (/mcp).

A sibling of the memory & data page with its auth and CSRF handling: the user comes only from
the verified session cookie, and every state-changing request must carry the page's request
header from an allowed origin. A token is shown once, when it is made; someone else's token id
gets the same 404 as a missing one. A token acts in the workspace its maker had active then
(auth/tokens.py), and the page says which.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict, Field

from auth.identity import CurrentUserId, flag_client_identity
from auth.tokens import TokenLimits
from auth.workspaces import WorkspaceNotFound, thread_workspace
from ui.mcp_server import PATH as MCP_PATH
from ui.mcp_server import pre_approvable, token_scopes
from ui.memory_page import Checked
from ui.runtime import AppRuntime, Runtime

if TYPE_CHECKING:
    from collections.abc import Sequence

    from auth.tokens import AccessTokens
    from auth.workspaces import Membership
    from ui.runner import AgentSpec

PAGE = Path(__file__).resolve().parent.parent / "public" / "tokens.html"


class CreateBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: Annotated[str, Field(min_length=1, max_length=80)]
    scopes: Annotated[
        list[Annotated[str, Field(max_length=80)]], Field(min_length=1, max_length=50)
    ]
    """Agent keys (checked against the agents offered over MCP)."""
    days: Annotated[int, Field(ge=1, le=365)] = 30
    pre_approve: bool = False
    max_concurrent: Annotated[int, Field(ge=1)] | None = None
    max_runs_per_hour: Annotated[int, Field(ge=1)] | None = None
    max_model_calls: Annotated[int, Field(ge=1)] | None = None


def _tokens(runtime: AppRuntime) -> AccessTokens:
    tokens = runtime.tokens
    if tokens is None:
        raise HTTPException(status_code=503, detail="Cairn is still starting")
    return tokens


async def _active(runtime: AppRuntime, user_id: str) -> Membership:
    """The workspace a token made now acts in: the one the user has active."""
    workspaces = runtime.workspaces
    if workspaces is None:
        raise HTTPException(status_code=503, detail="Cairn is still starting")
    return await workspaces.active(user_id)


def build_router(specs: Sequence[AgentSpec]) -> APIRouter:
    """The page and its API (the runtime comes from the memory page's dependency), for the
    given agents: a token scope for each offered over MCP, and the pre-approval switch naming
    the agents that offer it."""
    router = APIRouter()
    agents = [{"scope": scope, "label": label} for scope, label in token_scopes(specs).items()]
    may_pre_approve = pre_approvable(specs)

    @router.get("/tokens", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(PAGE, headers={"Cache-Control": "no-store"})

    @router.get("/api/tokens")
    async def overview(user_id: CurrentUserId, runtime: Runtime) -> dict[str, Any]:
        settings = runtime.settings
        return {
            "endpoint": f"{runtime.public_url}{MCP_PATH}",
            "enabled": settings.mcp_enabled,
            "agents": agents,
            "pre_approvable": may_pre_approve,
            "tokens": [t.public() for t in await _tokens(runtime).owned(user_id)],
            "workspace": (await _active(runtime, user_id)).public(),
            "limits": {
                "max_days": settings.mcp_token_max_days,
                "max_concurrent": settings.mcp_max_concurrent,
                "max_runs_per_hour": settings.mcp_max_runs_per_hour,
                "max_model_calls": settings.mcp_max_model_calls,
            },
        }

    @router.post("/api/tokens", dependencies=[Checked])
    async def create(
        body: CreateBody, request: Request, user_id: CurrentUserId, runtime: Runtime
    ) -> dict[str, Any]:
        flag_client_identity(await request.json(), where="access token", user_id=user_id)
        settings = runtime.settings
        if body.days > settings.mcp_token_max_days:
            detail = f"A token may live at most {settings.mcp_token_max_days} days."
            raise HTTPException(status_code=422, detail=detail)
        limits = TokenLimits(
            max_concurrent=min(
                body.max_concurrent or settings.mcp_max_concurrent, settings.mcp_max_concurrent
            ),
            max_runs_per_hour=min(
                body.max_runs_per_hour or settings.mcp_max_runs_per_hour,
                settings.mcp_max_runs_per_hour,
            ),
            max_model_calls=min(
                body.max_model_calls or settings.mcp_max_model_calls, settings.mcp_max_model_calls
            ),
        )
        tokens = _tokens(runtime)
        try:
            asked = tokens.checked_scopes(body.scopes)
        except ValueError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from None
        active = await _active(runtime, user_id)
        try:
            made = await tokens.create(
                user_id,
                name=body.name.strip() or "token",
                scopes=asked,
                days=body.days,
                limits=limits,
                pre_approve=body.pre_approve,
                workspace_id=thread_workspace(active),
            )
        except WorkspaceNotFound:  # left or disabled since the line above
            raise HTTPException(status_code=404, detail="Workspace not found") from None
        # The only time the token itself leaves the server.
        return {"token": made.secret, **made.info.public()}

    @router.post("/api/tokens/{token_id}/revoke", dependencies=[Checked])
    async def revoke(token_id: str, user_id: CurrentUserId, runtime: Runtime) -> dict[str, str]:
        if not await _tokens(runtime).revoke(user_id, token_id):
            raise HTTPException(status_code=404, detail="Token not found")
        return {"revoked": token_id}

    @router.get("/api/tokens/{token_id}/calls")
    async def calls(token_id: str, user_id: CurrentUserId, runtime: Runtime) -> dict[str, Any]:
        found = await _tokens(runtime).calls(token_id, user_id)
        return {
            "calls": [
                {
                    **c,
                    "started_at": c["started_at"].isoformat(),
                    "finished_at": c["finished_at"].isoformat() if c["finished_at"] else None,
                }
                for c in found
            ]
        }

    return router
