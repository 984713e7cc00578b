"""The reviewers' queue: team plans waiting for a second person's approval (auth/reviews.py).

Only members with the reviewer role of the active workspace reach it; anyone else, a foreign
review id and a made-up one get the same 404. A decision is taken once in Postgres (two
reviewers on two workers: one wins, the other is told it was decided), then carried out in
the background through the turn runner's Command(resume) path (ui/recovery.carry_out): live
in the requester's chat when they are connected to this worker, else into the stored
conversation. A worker that stops before carrying it out leaves it to another's sweep.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict, Field

from auth.identity import CurrentUserId
from auth.reviews import AlreadyDecided, ReviewNotFound, Reviews
from auth.workspaces import REVIEWER, Membership, WorkspaceNotFound
from ui.memory_page import Checked, DisplayName
from ui.recovery import carry_out, note_for
from ui.runtime import AppRuntime, Runtime

log = logging.getLogger("cairn.security")

PAGE = Path(__file__).resolve().parent.parent / "public" / "review.html"
NOT_FOUND = "Review not found"
MAX_EDIT_CHARS = 4000
_carrying: set[asyncio.Task[Any]] = set()
"""Decisions being carried out on this worker (kept so a task is not collected mid-run)."""


class DecideBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    decision: Literal["approve", "edit", "reject"]
    text: Annotated[str, Field(max_length=MAX_EDIT_CHARS)] = ""
    """For an Edit: the new steps, one per line, or one sentence of feedback."""


def _reviews(runtime: AppRuntime) -> Reviews:
    if runtime.reviews is None or runtime.workspaces is None:
        raise HTTPException(status_code=503, detail="Cairn is still starting")
    return runtime.reviews


async def _reviewer(runtime: AppRuntime, user_id: str) -> Membership:
    """The user's active workspace when they review there; else the 404 of a missing page."""
    assert runtime.workspaces is not None
    active = await runtime.workspaces.active(user_id)
    if active.personal or active.role != REVIEWER:
        raise HTTPException(status_code=404, detail=NOT_FOUND)
    return active


def _finished(task: asyncio.Task[Any], reviews: Reviews, review_id: str) -> None:
    _carrying.discard(task)
    reviews.carrying.discard(review_id)
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("carrying out a review decision failed", exc_info=exc)


def build_router() -> APIRouter:
    router = APIRouter()

    @router.get("/review", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(PAGE, headers={"Cache-Control": "no-store"})

    @router.get("/api/reviews")
    async def queue(user_id: CurrentUserId, runtime: Runtime) -> dict[str, Any]:
        reviews = _reviews(runtime)
        reviewer = await _reviewer(runtime, user_id)
        return {
            "workspace": reviewer.public(),
            "pending": [r.public() for r in await reviews.queue(reviewer)],
            "decided": [r.public() for r in await reviews.decided(reviewer)],
        }

    @router.post("/api/reviews/{review_id}/decide", dependencies=[Checked])
    async def decide(
        review_id: str,
        body: DecideBody,
        user_id: CurrentUserId,
        name: DisplayName,
        runtime: Runtime,
    ) -> dict[str, Any]:
        reviews = _reviews(runtime)
        reviewer = await _reviewer(runtime, user_id)
        text = body.text.strip()
        if body.decision == "edit" and not text:
            raise HTTPException(
                status_code=422, detail="Write the new steps (one per line) or your feedback."
            )
        try:
            review = await reviews.decide(reviewer, review_id, body.decision, text or None)
        except (ReviewNotFound, WorkspaceNotFound):
            raise HTTPException(status_code=404, detail=NOT_FOUND) from None
        except AlreadyDecided as exc:
            detail = "Another reviewer decided this plan first; the queue shows what was decided."
            if exc.status == "withdrawn":
                detail = "The requester changed or withdrew this plan; it is no longer waiting."
            raise HTTPException(status_code=409, detail=detail) from None
        reviews.carrying.add(review.id)
        task = asyncio.create_task(
            carry_out(runtime.runner, runtime.port, reviews, review, note_for(review, name))
        )
        _carrying.add(task)
        task.add_done_callback(lambda done: _finished(done, reviews, review.id))
        return {"review": review.public()}

    return router
