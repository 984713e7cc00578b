"""The support view: a conversation's checkpoint history, one checkpoint in full, and a fork.

Only identities with the support role (CAIRN_SUPPORT_USERS) reach it; anyone else gets the 404
a missing conversation gets. Every page view and every fork is written to the support audit
(who, whose conversation, why, state digests before and after), shown here and in the owner's
export, and the owner's memory page says that support opened the conversation; it is also
entered in the audit log of the conversation's workspace (`support.viewed`, `support.forked`). Support never
sees memories (graphs/core/timetravel.visible), and a fork runs through the turn runner as the
owner's thread without long-term memory. Every value is escaped into server-made HTML; the
fork is a POST with the page's request header (the memory page's CSRF check).
"""

from __future__ import annotations

import html
import json
import logging
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, HTTPException
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import BaseModel, ConfigDict, Field

from auth.ownership import NOT_FOUND, thread_record
from auth.roles import SupportUserId
from graphs.core.timetravel import (
    MAX_FILE_CHARS,
    MAX_REASON_CHARS,
    AuditEntry,
    ForkRefused,
    checkpoint_id,
    edit_fields,
    fork_update,
    history,
    jsonable,
    snapshot_at,
    state_digest,
    summarise,
    visible,
    writer_node,
)
from ui.memory_page import Checked
from ui.runtime import Runtime
from ui.surface import HeadlessSurface

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from auth.ownership import OwnedThread
    from ui.runtime import AppRuntime

log = logging.getLogger("cairn.support")

FORK_NOTICE = "Cairn support resumed this conversation from an earlier point ({reason})."


class ForkBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    reason: Annotated[str, Field(min_length=5, max_length=MAX_REASON_CHARS)]
    field: Literal["none", "plan", "todos", "file"] = "none"
    text: Annotated[str, Field(max_length=MAX_FILE_CHARS)] = ""
    path: Annotated[str, Field(max_length=200)] = ""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _page(title: str, body: str) -> HTMLResponse:
    return HTMLResponse(
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{_e(title)} · Cairn support</title>"
        "<script src='/public/theme.js'></script>"
        "<link rel='stylesheet' href='/public/memory.css'>"
        "<script src='/public/support.js' defer></script></head><body>"
        "<header class='bar'><a class='back' href='/support'>Support</a>"
        f"<h1>{_e(title)}</h1></header><main>{body}</main></body></html>",
        headers={"Cache-Control": "no-store"},
    )


async def _thread(runtime: AppRuntime, thread_id: str) -> tuple[str, OwnedThread, Any]:
    record = await thread_record(runtime.pool, thread_id=thread_id)
    graph = runtime.graphs.get(record[1].agent) if record else None
    if record is None or graph is None:
        raise HTTPException(status_code=404, detail=NOT_FOUND)
    return record[0], record[1], graph


async def _audit(runtime: AppRuntime, entry: AuditEntry, owned: OwnedThread) -> None:
    assert runtime.support_audit is not None
    await runtime.support_audit.record(entry)
    await _workspace_audit(runtime, entry, owned)
    log.info(
        "support %s: %s on thread %s of %s (checkpoint %s)",
        entry.actor_id,
        entry.action,
        entry.thread_id,
        entry.owner_id,
        entry.checkpoint_id or "-",
    )


async def _workspace_audit(runtime: AppRuntime, entry: AuditEntry, owned: OwnedThread) -> None:
    """The access in the audit log of the conversation's workspace: its team's, or the
    owner's personal one. Like the support audit, it is written before anything is shown."""
    workspaces = runtime.workspaces
    if workspaces is None:
        return
    workspace = owned.workspace_id or (await workspaces.personal(entry.owner_id)).workspace_id
    detail: dict[str, Any] = {"thread_id": entry.thread_id, "view": entry.action}
    if entry.checkpoint_id:
        detail["checkpoint_id"] = entry.checkpoint_id
    if entry.new_checkpoint_id:
        detail["new_checkpoint_id"] = entry.new_checkpoint_id
    if entry.reason:
        detail["reason"] = entry.reason
    await workspaces.record(
        workspace,
        entry.actor_id,
        "support.forked" if entry.action == "fork" else "support.viewed",
        subject_id=entry.owner_id,
        detail=detail,
    )


def _audit_table(rows: list[dict[str, Any]]) -> str:
    lines = "".join(
        f"<tr><td>{_e(r['at'])}</td><td>{_e(r['actor_id'])}</td><td>{_e(r['action'])}</td>"
        f"<td>{_e(r['checkpoint_id'] or '')}</td><td>{_e(r['reason'] or '')}</td>"
        f"<td><code>{_e((r['before_digest'] or '')[:12])}</code></td>"
        f"<td><code>{_e((r['after_digest'] or '')[:12])}</code></td>"
        f"<td>{_e(r['new_checkpoint_id'] or '')}</td></tr>"
        for r in rows
    )
    return (
        "<section><h2>Audit</h2><table id='audit'><tr><th>when</th><th>who</th><th>action</th>"
        "<th>checkpoint</th><th>reason</th><th>before</th><th>after</th><th>fork</th></tr>"
        f"{lines}</table></section>"
    )


router = APIRouter()
"""The support pages; they use the memory page's runtime (ui/memory_page.build_router). Routes are module-level handlers, registered on import."""


@router.get("/support", include_in_schema=False)
async def index(actor: SupportUserId) -> HTMLResponse:
    return _page(
        "Open a conversation",
        "<form method='get' action='/support/open' class='card'>"
        "<label>Conversation id <input name='thread_id' required maxlength='100'></label>"
        "<button type='submit'>Open its history</button></form>"
        "<p class='hint'>Opening a conversation is recorded, and its owner is told.</p>",
    )


@router.get("/support/open", include_in_schema=False)
async def open_thread(actor: SupportUserId, thread_id: str = "") -> RedirectResponse:
    return RedirectResponse(f"/support/threads/{quote(thread_id.strip()[:100], safe='')}", 303)


@router.get("/support/threads/{thread_id}", include_in_schema=False)
async def thread_page(thread_id: str, actor: SupportUserId, runtime: Runtime) -> HTMLResponse:
    owner, owned, graph = await _thread(runtime, thread_id)
    await _audit(runtime, AuditEntry(actor, owner, thread_id, "history"), owned)
    rows = "".join(
        f"<tr data-checkpoint='{_e(c.checkpoint_id)}'>"
        f"<td><a href='/support/threads/{_e(thread_id)}/checkpoints/{_e(c.checkpoint_id)}'>"
        f"{_e(c.checkpoint_id)}</a></td><td>{_e(c.step)}</td><td>{_e(c.node)}</td>"
        f"<td>{_e(', '.join(c.next))}</td><td>{_e(c.created_at or '')}</td>"
        f"<td>{_e(json.dumps(c.summary, ensure_ascii=False))}</td></tr>"
        for c in await history(graph, thread_id)
    )
    assert runtime.support_audit is not None
    audit = await runtime.support_audit.for_thread(thread_id)
    return _page(
        "Conversation history",
        f"<p>Conversation <code>{_e(thread_id)}</code> of <code>{_e(owner)}</code>, "
        f"agent {_e(owned.agent)}{' (temporary chat)' if owned.temporary else ''}. "
        "Newest checkpoint first; every branch is listed.</p>"
        "<table id='checkpoints'><tr><th>checkpoint</th><th>step</th><th>written by</th>"
        f"<th>next</th><th>time</th><th>state</th></tr>{rows}</table>" + _audit_table(audit),
    )


@router.get("/support/threads/{thread_id}/checkpoints/{checkpoint}", include_in_schema=False)
async def checkpoint_page(
    thread_id: str, checkpoint: str, actor: SupportUserId, runtime: Runtime
) -> HTMLResponse:
    owner, owned, graph = await _thread(runtime, thread_id)
    snapshot = await snapshot_at(graph, thread_id, checkpoint)
    if snapshot is None:
        raise HTTPException(status_code=404, detail=NOT_FOUND)
    await _audit(
        runtime,
        AuditEntry(
            actor,
            owner,
            thread_id,
            "state",
            checkpoint_id=checkpoint,
            before_digest=state_digest(snapshot.values),
        ),
        owned,
    )
    shown = jsonable(visible(snapshot.values))
    return _page(
        "Checkpoint",
        f"<p>Checkpoint <code>{_e(checkpoint)}</code> of conversation "
        f"<a href='/support/threads/{_e(thread_id)}'>{_e(thread_id)}</a>; next: "
        f"{_e(', '.join(snapshot.next) or '(finished)')}; digest "
        f"<code>{_e(state_digest(snapshot.values))}</code>.</p>"
        f"<h2>Summary</h2><pre id='summary'>"
        f"{_e(json.dumps(summarise(snapshot.values), indent=2, ensure_ascii=False))}</pre>"
        f"<h2>State</h2><pre id='state'>"
        f"{_e(json.dumps(shown, indent=2, ensure_ascii=False))}</pre>"
        + _fork_form(thread_id, checkpoint, snapshot.values),
    )


@router.post("/support/threads/{thread_id}/checkpoints/{checkpoint}/fork", dependencies=[Checked])
async def fork(
    thread_id: str, checkpoint: str, body: ForkBody, actor: SupportUserId, runtime: Runtime
) -> dict[str, Any]:
    return await _fork(runtime, actor, thread_id, checkpoint, body)


def build_router() -> APIRouter:
    """The support pages; they use the memory page's runtime (ui/memory_page.build_router)."""
    return router


def _fork_form(thread_id: str, checkpoint: str, values: dict[str, Any]) -> str:
    fields = edit_fields(values)
    options = "<option value='none'>nothing (replay from here)</option>" + "".join(
        f"<option value='{f}'>{label}</option>"
        for f, label in (("plan", "the plan"), ("todos", "the todo list"), ("file", "a file"))
        if f in fields
    )
    plan = "\n".join(str(s) for s in values.get("plan") or [])
    todos = "\n".join(str(t.get("content", "")) for t in values.get("todos") or [])
    files = visible(values).get("files") or {}
    first = next(iter(sorted(files)), "notes/")
    content = (files.get(first) or {}).get("content", "") if isinstance(files, dict) else ""
    prefill = json.dumps({"plan": plan, "todos": todos, "file": str(content)}, ensure_ascii=False)
    return (
        f"<section><h2>Fork from this checkpoint</h2><form id='fork' class='card' "
        f"data-url='/support/threads/{_e(thread_id)}/checkpoints/{_e(checkpoint)}/fork' "
        f"data-prefill='{_e(prefill)}'>"
        f"<label>Edit <select name='field' id='fork-field'>{options}</select></label>"
        f"<label>File path <input name='path' id='fork-path' value='{_e(first)}' maxlength='200'>"
        "</label><label>New value (one step or todo per line)"
        "<textarea name='text' id='fork-text' rows='8'></textarea></label>"
        "<label>Reason (recorded in the audit) <textarea name='reason' id='fork-reason' "
        f"rows='2' required minlength='5' maxlength='{MAX_REASON_CHARS}'></textarea></label>"
        "<button type='submit'>Fork and resume</button>"
        "<p class='status' id='fork-status' role='status'></p></form>"
        "<p class='hint'>The fork is a new branch: this checkpoint and everything after it stay "
        "as they are. It runs as the owner's conversation, without their memories.</p></section>"
    )


async def _fork(
    runtime: AppRuntime, actor: str, thread_id: str, checkpoint: str, body: ForkBody
) -> dict[str, Any]:
    owner, owned, graph = await _thread(runtime, thread_id)
    snapshot = await snapshot_at(graph, thread_id, checkpoint)
    if snapshot is None:
        raise HTTPException(status_code=404, detail=NOT_FOUND)
    try:
        values = fork_update(snapshot.values, body.field, body.text, body.path)
    except ForkRefused as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from None
    parent_id = checkpoint_id(snapshot.parent_config)
    parent = await snapshot_at(graph, thread_id, parent_id) if parent_id else None
    made: dict[str, str] = {}

    async def start(compiled: Any) -> RunnableConfig:
        # Under the run lock: the new branch, then its audit row, then the run.
        new = await compiled.aupdate_state(
            snapshot.config, values, as_node=writer_node(snapshot, parent)
        )
        forked = await compiled.aget_state(new)
        made["id"] = str(checkpoint_id(new))
        await _audit(
            runtime,
            AuditEntry(
                actor,
                owner,
                thread_id,
                "fork",
                checkpoint_id=checkpoint,
                reason=body.reason.strip(),
                before_digest=state_digest(snapshot.values),
                after_digest=state_digest(forked.values),
                new_checkpoint_id=made["id"],
            ),
            owned,
        )
        return new

    surface = HeadlessSurface()
    outcome = await runtime.runner.fork(surface, owner_id=owner, thread_id=thread_id, start=start)
    if outcome.status == "busy":
        raise HTTPException(status_code=409, detail=surface.errors[-1])
    if outcome.status in ("not_found", "refused"):
        raise HTTPException(status_code=404, detail=NOT_FOUND)
    await runtime.port.append_reply(
        thread_id,
        FORK_NOTICE.format(reason=body.reason.strip()[:200])
        + (f"\n\n{outcome.reply}" if outcome.reply else ""),
    )
    return {
        "status": outcome.status,
        "new_checkpoint_id": made.get("id"),
        "reply": outcome.reply,
        "errors": surface.errors,
    }
