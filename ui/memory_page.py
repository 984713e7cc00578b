"""The memory & data page: see and fix what Cairn believes about you, and make things go away.

Every route acts only on the signed-in user's own data, from the verified session cookie.
A foreign memory key, suggestion or thread id gets the same 404 as a missing one (and is
logged). State-changing requests are POST/PUT/DELETE and must carry the page's request
header from an allowed origin; the session cookie is SameSite=Lax.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from auth.identity import CurrentUserId, SessionClaims, flag_client_identity
from auth.oauth import LOCAL_PROVIDER_ID
from auth.ownership import ThreadNotFound
from graphs.core.runlock import ThreadBusy
from graphs.core.saver import threads_with_interrupts
from graphs.memory.manage import (
    MemoryNotFound,
    MemoryRefused,
    answer_suggestion,
    edit_memory,
    export_memories,
    forget_key,
    plan_json,
    source_json,
)
from graphs.memory.plans import PlanMemory
from graphs.memory.policy import MAX_CHARS, SENSITIVE_CATEGORIES, normalise_fact
from graphs.memory.research import ResearchMemory
from graphs.memory.scoped import MemorySettings, ScopedMemory
from ui.memory_note import CATEGORY_LABELS, category_label
from ui.runtime import AppRuntime, Runtime
from ui.surface import HeadlessSurface

log = logging.getLogger("cairn.security")

PAGE = Path(__file__).resolve().parent.parent / "public" / "memory.html"
REQUEST_HEADER = "x-cairn-request"
"""Sent by the page's own script; a cross-site form cannot set it, a cross-site script
would need a CORS preflight that the allowed origins refuse."""
WIPE_PHRASE = "delete my data"
PAUSED = "paused"
SAVED = "saved"


STILL_RUNNING = (
    "Cairn is still working in this conversation. Wait for it to finish (or stop it), "
    "then delete it."
)
"""A conversation is not deleted under a run in progress (its checkpoints would come back)."""

NO_NAME = "Your account"
"""Shown when the login carried no name: never the raw account id."""


async def display_name(claims: SessionClaims, user_id: CurrentUserId, runtime: Runtime) -> str:
    """The signed-in user's name, from the verified session: the name the login provider
    gave (kept in the signed session token), else the bundled login's account name."""
    name = str(claims.get("display_name") or "").strip()
    provider, _, subject = user_id.partition(":")
    if not name and provider == LOCAL_PROVIDER_ID and runtime.accounts is not None:
        account = await runtime.accounts.get_by_subject(subject)
        name = (account.display_name or account.username) if account else ""
    return name[:100] or NO_NAME


DisplayName = Annotated[str, Depends(display_name)]


def _not_found(what: str, user_id: str, ident: str) -> HTTPException:
    log.warning("refused or missing: user %s asked for %s %s", user_id, what, ident)
    return HTTPException(status_code=404, detail=f"{what.capitalize()} not found")


async def same_origin(request: Request, runtime: Runtime) -> None:
    """CSRF check for every state-changing route."""
    origin = request.headers.get("origin") or ""
    allowed = set(runtime.settings.origins(request.url.port or 80)) | {runtime.public_url}
    if request.headers.get(REQUEST_HEADER) != "1" or (origin and origin not in allowed):
        log.warning("refused: cross-site or scripted request to %s", request.url.path)
        raise HTTPException(status_code=403, detail="Request refused (missing page header)")


Checked = Depends(same_origin)


class EditBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    content: Annotated[str, Field(min_length=1, max_length=MAX_CHARS)]


class DecisionBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    decision: Literal["confirm", "reject"]


class SettingsBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    enabled: bool
    opted_in: list[Literal["health", "religion", "politics", "sexuality", "finance_sensitive"]] = []
    retention_days: Annotated[int, Field(ge=1, le=3650)] | None = None


class DeleteConversationBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    forget: bool = False


class WipeBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    confirm: str


router = APIRouter()
"""The memory page and its API. Routes are module-level handlers, registered on import."""


@router.get("/memory", include_in_schema=False)
async def page() -> FileResponse:
    # Static shell, no data: its script asks the API, which needs the session.
    return FileResponse(PAGE, headers={"Cache-Control": "no-store"})


@router.get("/api/memory")
async def overview(user_id: CurrentUserId, name: DisplayName, runtime: Runtime) -> dict[str, Any]:
    memory = _memory(runtime, user_id)
    settings = await memory.settings()
    conversations = await _conversations(runtime, user_id)
    names = {c["id"]: c["name"] for c in conversations}
    memories = sorted(await memory.all_memories(), key=lambda m: (m.category, m.content))
    return {
        "user": user_id,
        "display_name": name,
        "category_labels": CATEGORY_LABELS,
        "settings": {
            "enabled": settings.enabled,
            "opted_in": sorted(settings.opted_in),
            "sensitive_categories": sorted(SENSITIVE_CATEGORIES),
            "retention_days": await runtime.privacy.retention_days(user_id),
            "default_retention_days": runtime.settings.retention_days,
        },
        "memories": [_memory_json(m, names) for m in memories],
        "suggestions": await _suggestions(
            runtime,
            memory,
            names,
            [c["id"] for c in conversations if c["agent"] == "assistant"],
        ),
        "conversations": conversations,
        **await _agent_memories(runtime, user_id, names),
        "pending_jobs": len(await runtime.memory_jobs.pending(user_id=user_id))
        if runtime.memory_jobs
        else 0,
        "usage": await usage_this_month(runtime, user_id),
    }


@router.get("/api/memory/search")
async def search(
    user_id: CurrentUserId, runtime: Runtime, q: Annotated[str, Query(max_length=500)] = ""
) -> dict[str, Any]:
    if not q.strip():
        return {"keys": []}
    found = await _memory(runtime, user_id).search(
        q, limit=20, threshold=0.2, kinds=("profile", "facts")
    )
    return {"keys": [m.key for m in found]}


@router.put("/api/memory/items/{key}", dependencies=[Checked])
async def edit(key: str, body: EditBody, user_id: CurrentUserId, runtime: Runtime) -> Any:
    try:
        updated = await edit_memory(_memory(runtime, user_id), key, body.content)
    except MemoryNotFound:
        raise _not_found("memory", user_id, key) from None
    except MemoryRefused as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from None
    names = {c["id"]: c["name"] for c in await _conversations(runtime, user_id)}
    return _memory_json(updated, names)


@router.delete("/api/memory/items/{key}", dependencies=[Checked])
async def delete(key: str, user_id: CurrentUserId, runtime: Runtime) -> dict[str, str]:
    try:
        await forget_key(_memory(runtime, user_id), key)
    except MemoryNotFound:
        raise _not_found("memory", user_id, key) from None
    return {"deleted": key}


@router.delete("/api/memory/sources/{ident}", dependencies=[Checked])
async def delete_source(ident: str, user_id: CurrentUserId, runtime: Runtime) -> Any:
    gone = await _research(runtime, user_id).forget_source(_item_id(ident, "source"))
    if gone is None:
        raise _not_found("research source", user_id, ident)
    return {"deleted": ident, "source": gone.source}


@router.delete("/api/memory/plans/{key}", dependencies=[Checked])
async def delete_plan(key: str, user_id: CurrentUserId, runtime: Runtime) -> Any:
    if await _plans(runtime, user_id).forget(_item_id(key, "plan example")) is None:
        raise _not_found("plan example", user_id, key)
    return {"deleted": key}


@router.post("/api/memory/suggestions/{suggestion_id:path}", dependencies=[Checked])
async def answer(
    suggestion_id: str, body: DecisionBody, user_id: CurrentUserId, runtime: Runtime
) -> dict[str, Any]:
    kind, _, rest = suggestion_id.partition(":")
    accept = body.decision == "confirm"
    if kind == SAVED:
        try:
            stored = await answer_suggestion(_memory(runtime, user_id), rest, accept=accept)
        except MemoryNotFound:
            raise _not_found("suggestion", user_id, suggestion_id) from None
        return {"stored": stored is not None}
    if kind == PAUSED:
        thread_id, _, interrupt_id = rest.partition(":")
        return await _resume_paused(runtime, user_id, thread_id, interrupt_id, body.decision)
    raise _not_found("suggestion", user_id, suggestion_id)


@router.put("/api/memory/settings", dependencies=[Checked])
async def save_settings(
    body: SettingsBody, request: Request, user_id: CurrentUserId, runtime: Runtime
) -> dict[str, Any]:
    flag_client_identity(await request.json(), where="memory settings", user_id=user_id)
    memory = _memory(runtime, user_id)
    async with memory.locked():
        await memory.save_settings(
            MemorySettings(enabled=body.enabled, opted_in=frozenset(body.opted_in))
        )
    cancelled = 0
    if not body.enabled and runtime.memory_jobs is not None:
        # Off means off: nothing queued may still write.
        cancelled = await runtime.memory_jobs.cancel_user(user_id=user_id)
    await runtime.privacy.set_retention_days(user_id, body.retention_days)
    log.info("memory settings saved user=%s enabled=%s", user_id, body.enabled)
    return {"saved": True, "cancelled_jobs": cancelled}


@router.get("/api/memory/export")
async def export(user_id: CurrentUserId, runtime: Runtime) -> JSONResponse:
    data = await export_memories(
        _memory(runtime, user_id),
        research=_research(runtime, user_id),
        plans=_plans(runtime, user_id),
    )
    # Every time support opened or forked one of the user's conversations (README).
    data["support_access"] = (
        await runtime.support_audit.for_owner(user_id) if runtime.support_audit else []
    )
    # Every workspace audit entry about the user, as actor or subject (README "Teams").
    data["workspace_audit"] = await _workspace_audit(runtime, user_id)
    stamp = datetime.now(UTC).strftime("%Y%m%d")
    return JSONResponse(
        data,
        headers={
            "Content-Disposition": f'attachment; filename="cairn-memories-{stamp}.json"',
            "Cache-Control": "no-store",
        },
    )


async def _workspace_audit(runtime: AppRuntime, user_id: str) -> list[dict[str, Any]]:
    if runtime.workspaces is None:
        return []
    return [
        {
            key: value.isoformat() if isinstance(value, datetime) else value
            for key, value in e.items()
        }
        for e in await runtime.workspaces.audit_about(user_id)
    ]


@router.post("/api/conversations/{thread_id}/delete", dependencies=[Checked])
async def delete_conversation(
    thread_id: str, body: DeleteConversationBody, user_id: CurrentUserId, runtime: Runtime
) -> dict[str, Any]:
    try:
        done = await runtime.privacy.delete_conversation(
            user_id=user_id, thread_id=thread_id, forget=body.forget
        )
    except ThreadNotFound:
        raise HTTPException(status_code=404, detail="Conversation not found") from None
    except ThreadBusy:
        raise HTTPException(status_code=409, detail=STILL_RUNNING) from None
    return {"deleted": done.thread_id, "forgotten": done.forgotten}


@router.post("/api/account/wipe", dependencies=[Checked])
async def wipe(
    body: WipeBody,
    request: Request,
    response: Response,
    user_id: CurrentUserId,
    runtime: Runtime,
) -> dict[str, Any]:
    if body.confirm.strip().lower() != WIPE_PHRASE:
        raise HTTPException(status_code=422, detail=f'Type "{WIPE_PHRASE}" to confirm.')
    report = await runtime.privacy.wipe_account(user_id)
    await runtime.port.end_sessions(user_id)
    runtime.port.sign_out(request, response)
    return {
        "wipe_id": report.wipe_id,
        "counts": report.counts,
        "verified": report.verified,
        "leftovers": report.leftovers,
    }


@router.post("/api/account/sign-out-everywhere", dependencies=[Checked])
async def sign_out_everywhere(
    request: Request, response: Response, user_id: CurrentUserId, runtime: Runtime
) -> dict[str, Any]:
    """Every session of the account ends on every worker, this one included, and so does
    every access token (a stolen session could have made one)."""
    if runtime.revocations is None or runtime.tokens is None:
        raise HTTPException(status_code=503, detail="Cairn is still starting")
    await runtime.revocations.revoke(user_id)  # every worker ends its live chats (NOTIFY)
    revoked = await runtime.tokens.revoke_all(user_id)
    runtime.port.sign_out(request, response)
    return {"signed_out": True, "tokens_revoked": revoked}


def build_router() -> APIRouter:
    """The memory page and its API."""
    return router


async def usage_this_month(runtime: AppRuntime, user_id: str) -> dict[str, Any] | None:
    """The user's model use this month and their budget (0: none), at the configured prices."""
    if runtime.usage is None:
        return None
    month = await runtime.usage.month(user_id)
    return {
        "runs": month.runs,
        "tokens": month.tokens,
        "estimated_cost": round(month.cost, 6),
        "token_budget": runtime.usage.budget.tokens,
        "cost_budget": runtime.usage.budget.cost,
    }


def _memory(runtime: AppRuntime, user_id: str) -> ScopedMemory:
    assert runtime.persistence is not None
    return ScopedMemory(runtime.persistence.store, user_id)


ITEM_ID = re.compile(r"[0-9a-f]{32}")
"""A source's id (graphs.memory.research.source_id) and a plan example's key: 32 hex digits."""


def _item_id(ident: str, what: str) -> str:
    """The client's id, refused unless it has the one shape ids have (no NUL, no length games)."""
    if not ITEM_ID.fullmatch(ident):
        log.warning("refused: a malformed %s id (%d characters)", what, len(ident))
        raise HTTPException(status_code=422, detail=f"That is not a {what} id.")
    return ident


def _research(runtime: AppRuntime, user_id: str) -> ResearchMemory:
    assert runtime.persistence is not None
    return ResearchMemory(runtime.persistence.store, user_id)


def _plans(runtime: AppRuntime, user_id: str) -> PlanMemory:
    assert runtime.persistence is not None
    return PlanMemory(runtime.persistence.store, user_id)


async def _agent_memories(
    runtime: AppRuntime, user_id: str, names: dict[str, str]
) -> dict[str, Any]:
    """Research's source ratings and the Planner's examples, each with the conversations it
    came from (named only while they are the user's and still exist)."""
    sources = [source_json(s) for s in await _research(runtime, user_id).sources()]
    for source in sources:
        source["conversations"] = [
            {"thread_id": t, "conversation": names.get(t)} for t in source["thread_ids"]
        ]
    plans = [plan_json(e) for e in await _plans(runtime, user_id).examples()]
    for plan in plans:
        plan["conversation"] = names.get(plan["thread_id"]) if plan["thread_id"] else None
    return {"research_sources": sources, "plan_examples": plans}


def _memory_json(m: Any, names: dict[str, str]) -> dict[str, Any]:
    thread_id = m.source.get("thread_id")
    return {
        "key": m.key,
        "content": m.content,
        "category": m.category,
        "category_label": category_label(m.category),
        "updated_at": m.updated_at,
        "last_recalled_at": m.last_recalled_at,
        "confidence": m.confidence,
        "edited_at": (m.source.get("edited") or {}).get("at"),
        "source": {
            "thread_id": thread_id,
            # Only the user's own, still existing conversations are linked.
            "conversation": names.get(thread_id) if thread_id else None,
            "kind": m.source.get("kind") or ("memory job" if m.source.get("job_run_id") else None),
        },
    }


async def _conversations(runtime: AppRuntime, user_id: str) -> list[dict[str, Any]]:
    async with runtime.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT c.thread_id, c.agent, c.temporary, c.last_active_at, c.workspace_id, t.name, "
            "(SELECT max(a.at) FROM cairn_support_audit a WHERE a.thread_id = c.thread_id "
            " AND a.owner_id = c.owner_id) AS support_at, "
            "(SELECT count(*) FROM cairn_support_audit a WHERE a.thread_id = c.thread_id "
            " AND a.owner_id = c.owner_id AND a.action = 'fork') AS support_forks "
            'FROM cairn_threads c LEFT JOIN "Thread" t ON t.id = c.thread_id '
            "WHERE c.owner_id = %s ORDER BY c.last_active_at DESC",
            (user_id,),
        )
        rows = await cur.fetchall()
    return [
        {
            "id": row["thread_id"],
            "name": row["name"] or "Untitled conversation",
            "agent": row["agent"],
            "temporary": row["temporary"],
            # A team's conversation may be shared with the team (ui/share_page.py).
            "workspace_id": row["workspace_id"],
            "last_active_at": row["last_active_at"].isoformat(),
            # The owner sees that support opened the conversation (and forked it).
            "support_opened_at": row["support_at"].isoformat() if row["support_at"] else None,
            "support_forks": int(row["support_forks"]),
        }
        for row in rows
    ]


async def _suggestions(
    runtime: AppRuntime,
    memory: ScopedMemory,
    names: dict[str, str],
    assistant_threads: list[str],
) -> list[dict[str, Any]]:
    """Sensitive facts waiting for a yes or no: the assistant's paused confirmations (the
    run resumes when answered here) and the memory job's stored suggestions."""
    found: list[dict[str, Any]] = []
    graph = runtime.graphs.get("assistant")
    if graph is not None:
        # One query narrows them to those paused on a question; only those states are read.
        for thread_id in await threads_with_interrupts(runtime.pool, assistant_threads):
            state = await graph.aget_state({"configurable": {"thread_id": thread_id}})
            for interrupt in state.interrupts:
                value = interrupt.value if isinstance(interrupt.value, dict) else {}
                if value.get("kind") != "confirm_memory":
                    continue
                found.append(
                    {
                        "id": f"{PAUSED}:{thread_id}:{interrupt.id}",
                        "content": str(value.get("content", "")),
                        "category": str(value.get("category", "")),
                        "category_label": category_label(str(value.get("category", ""))),
                        "thread_id": thread_id,
                        "conversation": names.get(thread_id),
                    }
                )
    for suggestion in await memory.suggestions():
        source_thread = (suggestion.get("source") or {}).get("thread_id")
        found.append(
            {
                "id": f"{SAVED}:{suggestion.get('key')}",
                "content": str(suggestion.get("content", "")),
                "category": str(suggestion.get("category", "")),
                "category_label": category_label(str(suggestion.get("category", ""))),
                "thread_id": source_thread,
                "conversation": names.get(source_thread) if source_thread else None,
            }
        )
    return found


async def _resume_paused(
    runtime: AppRuntime, user_id: str, thread_id: str, interrupt_id: str, decision: str
) -> dict[str, Any]:
    """Answer a paused confirmation from this page: the same Command(resume=...) the chat's
    buttons send, after the same ownership and pending-interrupt checks."""
    ident = f"{thread_id}:{interrupt_id}"
    surface = HeadlessSurface()
    try:
        pending = await runtime.runner.pending(user_id=user_id, thread_id=thread_id)
    except ThreadNotFound:
        raise _not_found("suggestion", user_id, ident) from None
    asked = next((i.value for i in pending if i.id == interrupt_id), None)
    if not isinstance(asked, dict) or asked.get("kind") != "confirm_memory":
        raise _not_found("suggestion", user_id, ident)
    outcome = await runtime.runner.answer(
        surface, user_id=user_id, thread_id=thread_id, interrupt_id=interrupt_id, decision=decision
    )
    if outcome.status == "busy":
        raise HTTPException(status_code=409, detail=surface.errors[-1])
    if outcome.status in ("not_found", "refused"):
        raise _not_found("suggestion", user_id, ident)
    if outcome.status not in ("done", "paused"):
        raise HTTPException(status_code=503, detail=surface.errors[-1] if surface.errors else "")
    reply = outcome.reply or ""
    await runtime.port.append_reply(thread_id, reply)
    wanted = normalise_fact(str(asked.get("content", "")))
    stored = any(
        normalise_fact(m.content) == wanted for m in await _memory(runtime, user_id).all_memories()
    )
    return {"stored": stored, "reply": reply}
