"""Shared conversations: the read-only page a teammate opens, and the owner's API to make, list
and revoke shares (listed on the memory & data page).

The viewer is the signed-in user from the verified session; the rules are auth/shares.py's. A
share the viewer may not see (made up, revoked, foreign, not in its audience) answers with the
one 404 page a missing share gets, byte for byte. State-changing routes carry the memory page's
CSRF check.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from auth.identity import CurrentUserId, flag_client_identity
from auth.oauth import LOCAL_PROVIDER_ID
from auth.ownership import NOT_FOUND as THREAD_NOT_FOUND
from auth.ownership import ThreadNotFound, require_owner
from auth.shares import (
    MAX_MEMBERS,
    Include,
    Share,
    ShareNotFound,
    ShareRefused,
    Shares,
)
from ui.memory_page import Checked
from ui.runtime import AppRuntime, Runtime
from ui.shared_conversation import (
    attachment,
    conversation_names,
    render,
    transcript,
)

log = logging.getLogger("cairn.shares")

SHARED_BY_SOMEONE = "a teammate"


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        "<meta name='referrer' content='same-origin'>"
        f"<title>{title} · Cairn</title>"
        "<script src='/public/theme.js'></script>"
        "<link rel='stylesheet' href='/public/memory.css'></head><body>"
        "<header class='bar'><a class='back' href='/'>&larr; Back to chat</a>"
        f"<h1>{title}</h1></header><main>{body}</main></body></html>",
        status_code=status,
        headers={"Cache-Control": "no-store"},
    )


def missing() -> HTMLResponse:
    """The one answer for every share the viewer may not see."""
    return _page(
        "Shared conversation not found",
        "<p>This shared conversation does not exist, or is not shared with you.</p>",
        status=404,
    )


class IncludeBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    memory_notes: bool = False
    recall: bool = False
    attachments: bool = False


class CreateShareBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    audience: Literal["workspace", "members"] = "workspace"
    members: Annotated[
        list[Annotated[str, Field(max_length=200)]], Field(max_length=MAX_MEMBERS)
    ] = []
    """User ids of live members of the conversation's workspace (audience "members")."""
    include: IncludeBody = IncludeBody()


def _shares(runtime: AppRuntime) -> Shares:
    return Shares(runtime.pool)


async def _owner_name(runtime: AppRuntime, share: Share) -> str:
    """How the page names who shared it: the name they joined the workspace with, else the
    bundled login's account name; never the raw account id."""
    names = await _shares(runtime).member_names(share.workspace_id, [share.owner_id])
    if name := names.get(share.owner_id):
        return name[:100]
    provider, _, subject = share.owner_id.partition(":")
    if provider == LOCAL_PROVIDER_ID and runtime.accounts is not None:
        account = await runtime.accounts.get_by_subject(subject)
        if account is not None:
            return (account.display_name or account.username)[:100]
    return SHARED_BY_SOMEONE


def share_json(share: Share, names: dict[str, str], members: dict[str, str]) -> dict[str, Any]:
    return {
        "id": share.id,
        "url": share.url,
        "thread_id": share.thread_id,
        "conversation": names.get(share.thread_id, "Untitled conversation"),
        "workspace_id": share.workspace_id,
        "audience": share.audience,
        "members": [{"user_id": m, "name": members.get(m)} for m in share.members],
        "include": vars(share.include),
        "created_at": share.created_at.isoformat(),
    }


router = APIRouter()
"""Shared conversations and their API. Routes are module-level handlers, registered on import."""


@router.get("/share/{share_id}", include_in_schema=False)
async def shared_page(share_id: str, user_id: CurrentUserId, runtime: Runtime) -> HTMLResponse:
    try:
        share = await _shares(runtime).visible(viewer_id=user_id, share_id=share_id)
    except ShareNotFound:
        return missing()
    owner = await _owner_name(runtime, share)
    conversation = await transcript(runtime.pool, share.thread_id, share.include, owner)
    log.info("share %s of thread %s viewed by %s", share.id, share.thread_id, user_id)
    return _page("Shared conversation", render(share.url, conversation, share.include, owner))


@router.get("/share/{share_id}/files/{element_id}", include_in_schema=False)
async def shared_file(
    share_id: str, element_id: str, user_id: CurrentUserId, runtime: Runtime
) -> Response:
    try:
        share = await _shares(runtime).visible(viewer_id=user_id, share_id=share_id)
    except ShareNotFound:
        return missing()
    found = await attachment(runtime.pool, share.thread_id, element_id[:100])
    if not share.include.attachments or found is None:
        return missing()
    name, _mime, data = found
    # A download, never shown in the app's origin: a teammate's file is not the viewer's.
    return Response(
        data,
        media_type="application/octet-stream",
        headers={
            "Content-Disposition": _disposition(name),
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "private, no-store",
            "Content-Security-Policy": "sandbox; default-src 'none'",
        },
    )


def _disposition(name: str) -> str:
    """A download named as shown; the plain-ASCII fallback cannot end the header's quotes."""
    fallback = "".join(c if c.isalnum() or c in "._ -" else "_" for c in name)[:200] or "file"
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name[:200])}"


@router.get("/api/shares")
async def list_shares(user_id: CurrentUserId, runtime: Runtime) -> dict[str, Any]:
    shares = await _shares(runtime).owned(user_id)
    names = await conversation_names(runtime.pool, [s.thread_id for s in shares])
    listed = []
    for share in shares:
        members = (
            await _shares(runtime).member_names(share.workspace_id, share.members)
            if share.members
            else {}
        )
        listed.append(share_json(share, names, members))
    return {"shares": listed}


@router.get("/api/threads/{thread_id}/sharing")
async def sharing(thread_id: str, user_id: CurrentUserId, runtime: Runtime) -> dict[str, Any]:
    """Whether the owner may share this conversation (it belongs to a team) and its live
    shares: what the chat header's Share button needs. Someone else's id: the 404 of a
    missing conversation."""
    try:
        owned = await require_owner(runtime.pool, thread_id=thread_id, user_id=user_id)
    except ThreadNotFound:
        raise HTTPException(status_code=404, detail=THREAD_NOT_FOUND) from None
    mine = [s for s in await _shares(runtime).owned(user_id) if s.thread_id == thread_id]
    members: list[dict[str, str]] = []
    if owned.workspace_id is not None and runtime.workspaces is not None:
        members = [
            {"user_id": str(row["user_id"]), "name": str(row["display_name"] or "A member")}
            for row in await runtime.workspaces.members(owned.workspace_id)
            if row["disabled_at"] is None and row["user_id"] != user_id
        ]
    return {
        "shareable": owned.workspace_id is not None,
        "shares": [s.url for s in mine],
        "members": members,
    }


@router.post("/api/threads/{thread_id}/shares", dependencies=[Checked])
async def create_share(
    thread_id: str,
    body: CreateShareBody,
    request: Request,
    user_id: CurrentUserId,
    runtime: Runtime,
) -> dict[str, Any]:
    flag_client_identity(await request.json(), where="share", user_id=user_id)
    try:
        share = await _shares(runtime).create(
            owner_id=user_id,
            thread_id=thread_id,
            audience=body.audience,
            members=body.members,
            include=Include(**body.include.model_dump()),
        )
    except ThreadNotFound:
        raise HTTPException(status_code=404, detail=THREAD_NOT_FOUND) from None
    except ShareRefused as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from None
    names = await conversation_names(runtime.pool, [thread_id])
    return share_json(share, names, {})


@router.post("/api/shares/{share_id}/revoke", dependencies=[Checked])
async def revoke_share(share_id: str, user_id: CurrentUserId, runtime: Runtime) -> dict[str, Any]:
    try:
        changed = await _shares(runtime).revoke(owner_id=user_id, share_id=share_id)
    except ShareNotFound:
        raise HTTPException(status_code=404, detail="Share not found") from None
    return {"revoked": share_id, "changed": changed}


def build_router() -> APIRouter:
    """Shared conversations and the owner's API for them."""
    return router
