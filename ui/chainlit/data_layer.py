"""Chainlit's conversation store on the app's shared psycopg pool, with thread owners that never change.

Chainlit's documented extension point (`cl.data_layer`), so it stays out of
ui/chainlit/patches/; the Chainlit 2.12.0 code it overrides or copies is pinned by
tests/unit/test_chainlit_patches.py like the patches are.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
from chainlit.context import ChainlitContextException, context
from chainlit.data.chainlit_data_layer import ISO_FORMAT, ChainlitDataLayer
from chainlit.data.utils import queue_until_user_message
from chainlit.element import Element
from chainlit.step import StepDict
from chainlit.types import PaginatedResponse, Pagination, ThreadDict, ThreadFilter
from psycopg.rows import dict_row
from psycopg.types.string import TextLoader

from auth.ownership import team_thread_usable
from graphs.core.errors import is_database_outage
from graphs.core.fence import (
    STATEMENT_CTE,
    Fence,
    WriteRefused,
    acting_for,
    current,
    fenced,
    statement_args,
)
from graphs.core.fence import statement as fence_statement
from ui.chainlit.elements import ElementRefused
from ui.output_guard import sanitise_step

if TYPE_CHECKING:
    from chainlit.data.storage_clients.base import BaseStorageClient

    from graphs.core.persistence import Pool

log = logging.getLogger("cairn.security")

_PLACEHOLDER = re.compile(r"\$(\d+)")

_UPSERT_STEP = f"""
WITH {STATEMENT_CTE}, thread AS (
    INSERT INTO "Thread" (id, metadata, "updatedAt")
    SELECT %(thread_id)s, '{{}}', now()
    WHERE %(thread_id)s::text IS NOT NULL
      AND (SELECT ok FROM fence)
      AND NOT EXISTS (SELECT 1 FROM cairn_deleted_threads WHERE thread_id = %(thread_id)s)
    ON CONFLICT (id) DO NOTHING
), parent AS (
    INSERT INTO "Step" (id, metadata, type, "startTime", "endTime")
    SELECT %(parent_id)s, '{{}}', 'run', %(time)s, %(time)s
    WHERE %(parent_id)s::text IS NOT NULL AND (SELECT ok FROM fence)
    ON CONFLICT (id) DO NOTHING
)
INSERT INTO "Step" (
    id, "threadId", "parentId", input, metadata, name, output,
    type, "startTime", "endTime", "showInput", "isError"
)
SELECT
    %(id)s, %(thread_id)s, %(parent_id)s, %(input)s, %(metadata)s, %(name)s, %(output)s,
    %(type)s, %(time)s, %(time)s, %(show_input)s, %(is_error)s
FROM fence WHERE fence.ok
ON CONFLICT (id) DO UPDATE SET
    "parentId" = COALESCE(EXCLUDED."parentId", "Step"."parentId"),
    input = COALESCE(NULLIF(EXCLUDED.input, ''), "Step".input),
    metadata = CASE WHEN EXCLUDED.metadata <> '{{}}' THEN EXCLUDED.metadata ELSE "Step".metadata END,
    name = COALESCE(EXCLUDED.name, "Step".name),
    output = COALESCE(NULLIF(EXCLUDED.output, ''), "Step".output),
    type = CASE WHEN EXCLUDED.type = 'run' THEN "Step".type ELSE EXCLUDED.type END,
    "threadId" = COALESCE(EXCLUDED."threadId", "Step"."threadId"),
    "endTime" = COALESCE(EXCLUDED."endTime", "Step"."endTime"),
    "startTime" = LEAST(EXCLUDED."startTime", "Step"."startTime"),
    "showInput" = COALESCE(EXCLUDED."showInput", "Step"."showInput"),
    "isError" = COALESCE(EXCLUDED."isError", "Step"."isError")
WHERE "Step"."threadId" IS NULL OR "Step"."threadId" = EXCLUDED."threadId"
"""  # noqa: S608 (constants only)
"""chainlit.data.chainlit_data_layer.ChainlitDataLayer.create_step's upsert, same columns and
conflict rules, with its thread and parent look-ups folded in. A client picks its own message
ids, so an update never reaches a step of another conversation (Chainlit's would move it).
The wipe's check is in the statement (graphs.core.fence.STATEMENT_CTE): one statement per step,
no transaction block (some eight steps per Assistant turn: issue 13)."""

OPEN_STEP_GRACE_S = 1.0
"""How long a run or tool step just sent may stay unstored. If its worker dies in that time the
open step is not in the history (its reply and the run's checkpoints are); anything open longer,
a research topic or a slow tool, is stored as before, and a finished step at once."""

_DEFERRABLE = frozenset({"run", "tool", "llm", "embedding", "retrieval", "rerank", "undefined"})
"""Chainlit's step types that are not messages."""

DATA_LAYER_PINS = {
    "chainlit.data.utils.queue_until_user_message": "c5da8ad58a521aa7",
    "chainlit.data.chainlit_data_layer.ChainlitDataLayer.create_step": "f3794927dffc7ddb",
    "chainlit.data.chainlit_data_layer.ChainlitDataLayer.delete_step": "871d76ad60d04a90",
    "chainlit.data.chainlit_data_layer.ChainlitDataLayer.update_thread": "00154d047c1e7f26",
    "chainlit.data.chainlit_data_layer.ChainlitDataLayer.get_thread_author": "d8fc90def8c0ed72",
    "chainlit.data.chainlit_data_layer.ChainlitDataLayer.get_thread": "4f41f49c86cbf01f",
    "chainlit.data.chainlit_data_layer.ChainlitDataLayer.delete_thread": "2e50738dd0c43185",
    "chainlit.data.chainlit_data_layer.ChainlitDataLayer.execute_query": "071081a3100fe41a",
    "chainlit.data.chainlit_data_layer.ChainlitDataLayer.create_element": "0dc78f91f0333720",
    "chainlit.data.chainlit_data_layer.ChainlitDataLayer.delete_element": "e0f7f8c94d8d8351",
    "chainlit.data.storage_clients.base.BaseStorageClient": "ab1941d58e276e8b",
}
"""The Chainlit code this module relies on (qualified name: digest of its source as checked),
tripped by tests/unit/test_chainlit_patches.py when an upgrade changes it."""


_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_MARKUP = re.compile(r"(^|\s)#{1,6}\s+|[*_`~>|]+")


def plain_title(name: str, *, limit: int = 100) -> str:
    """A conversation's name as the sidebar shows it: plain text. Chainlit names a conversation
    after its first message, whose Markdown the sidebar printed as typed (`**`, `#`, links)."""
    text = _LINK.sub(r"\1", name)
    text = _MARKUP.sub(" ", text)
    text = " ".join(text.split())
    return text[:limit] or "New conversation"


def _open_step(step_dict: StepDict) -> bool:
    """A run or tool step as Chainlit's Step.send describes it (dated), not yet finished. The
    undated placeholder Chainlit's create_element makes for an element's missing step is not
    one: the element's row needs it at once."""
    return (
        step_dict.get("type") in _DEFERRABLE
        and bool(step_dict.get("createdAt"))
        and not step_dict.get("end")
    )


def _step_params(step_dict: StepDict) -> dict[str, Any]:
    """_UPSERT_STEP's parameters for a step as Chainlit sends it."""
    # Stored steps are shown again on every reopen: what is kept is already inert.
    step_dict = sanitise_step(step_dict)
    created = step_dict.get("createdAt")
    timestamp = datetime.strptime(created, ISO_FORMAT) if created else datetime.now()
    return {
        "id": step_dict["id"],
        "thread_id": step_dict.get("threadId"),
        "parent_id": step_dict.get("parentId"),
        "input": step_dict.get("input"),
        "metadata": json.dumps(step_dict.get("metadata", {})),
        "name": step_dict.get("name"),
        "output": step_dict.get("output"),
        "type": step_dict["type"],
        "time": timestamp,
        "show_input": str(step_dict.get("showInput", "json")),
        "is_error": step_dict.get("isError", False),
    }


def _with_output(step: StepDict) -> StepDict:
    if step.get("output") is None:
        step["output"] = ""
    return step


_DELETE_STEP = """
WITH step AS (
    SELECT id FROM "Step" WHERE id = %(step_id)s AND "threadId" = %(thread_id)s
), elements AS (
    DELETE FROM "Element" WHERE "stepId" IN (SELECT id FROM step)
), files AS (
    DELETE FROM cairn_element_files WHERE thread_id = %(thread_id)s AND object_key IN (
        SELECT "objectKey" FROM "Element" WHERE "stepId" IN (SELECT id FROM step))
), feedback AS (
    DELETE FROM "Feedback" WHERE "stepId" IN (SELECT id FROM step)
)
DELETE FROM "Step" WHERE id IN (SELECT id FROM step)
"""
"""ChainlitDataLayer.delete_step, limited to the session's own conversation, with the bytes of
the step's elements (ui/chainlit/elements.py)."""

_DELETE_ELEMENT = """
WITH element AS (
    DELETE FROM "Element" WHERE id = %(element_id)s AND "threadId" = %(thread_id)s
    RETURNING "objectKey"
)
DELETE FROM cairn_element_files
WHERE thread_id = %(thread_id)s AND object_key IN (SELECT "objectKey" FROM element)
"""
"""ChainlitDataLayer.delete_element, in one conversation only (Chainlit's finds the element in
any), with its bytes."""


def _under(
    authority: Fence | None, write: Callable[[], Awaitable[None]]
) -> Callable[[], Awaitable[None]]:
    if authority is None:
        return write

    async def fenced_write() -> None:
        with acting_for(authority):
            await write()

    return fenced_write


class PendingWrites:
    """Conversation writes that failed because Postgres was away, replayed in order once it is
    back: a message sent during an outage, and the error shown for it, stay in the
    conversation. Kept in this process until then (the user's open chat holds them too)."""

    RETRY_EVERY_S = 1.0
    LIMIT = 10_000

    def __init__(self) -> None:
        self._writes: deque[tuple[str, Callable[[], Awaitable[None]]]] = deque()
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._writes)

    def add(self, what: str, write: Callable[[], Awaitable[None]]) -> None:
        if len(self._writes) >= self.LIMIT:
            dropped, _ = self._writes.popleft()
            log.error("conversation write dropped (outage backlog full): %s", dropped)
        # Replayed under the authority it was made under (the replay task is shared by every
        # session of this worker), so a wipe's cut-off still refuses it.
        self._writes.append((what, _under(current(), write)))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._replay(), name="cairn-pending-writes")

    async def _replay(self) -> None:
        while self._writes:
            what, write = self._writes[0]
            try:
                await write()
            except Exception as exc:
                if is_database_outage(exc):
                    await asyncio.sleep(self.RETRY_EVERY_S)
                    continue
                log.exception("conversation write failed after the outage: %s", what)
            self._writes.popleft()
        log.info("conversation writes held during the outage are stored")

    async def settled(self, timeout_s: float) -> bool:
        """Wait, up to `timeout_s`, until the writes held during an outage are stored; whether
        they are (a Retry pressed as Postgres comes back reads the message they hold)."""
        task = self._task
        if self._writes and task is not None and not task.done():
            await asyncio.wait({task}, timeout=timeout_s)
        return not self._writes

    async def write(self, what: str, write: Callable[[], Awaitable[None]]) -> None:
        """Now, or after the writes already waiting (order kept) if Postgres is away."""
        if self._writes:
            self.add(what, write)
            return
        try:
            await write()
        except Exception as exc:
            if not is_database_outage(exc):
                raise
            log.warning("database away: %s kept until it is back", what)
            self.add(what, write)


class PostgresDataLayer(ChainlitDataLayer):
    """Chainlit's own Postgres data layer, run through psycopg instead of a second asyncpg pool.

    Its SQL uses asyncpg's `$n` placeholders with parameters passed in order; they are
    rewritten to psycopg's named style. JSON columns come back as text, as asyncpg returns them.

    Every write but a delete is fenced (graphs.core.fence): made under the session's authority
    (set by the request guard for every HTTP request and chat connection), it is refused once
    the user's data was wiped, so a tab left open on another worker cannot bring back the
    Chainlit user, a thread or a step after the wipe.
    """

    def __init__(
        self,
        pool: Pool,
        *,
        on_delete: Callable[[str], Awaitable[None]] | None = None,
        storage: BaseStorageClient | None = None,
    ) -> None:
        super().__init__(database_url="", storage_client=storage)
        self._pool = pool
        self._on_delete = on_delete
        self.pending = PendingWrites()
        self._deferred: dict[str, tuple[str | None, asyncio.TimerHandle]] = {}
        """Open steps waiting to be stored (create_step): step id -> (thread id, timer)."""
        self._storing: set[asyncio.Task[None]] = set()

    async def connect(self) -> None:
        """The shared pool is opened by the app at start-up."""

    async def execute_query(
        self, query: str, params: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        args: dict[str, Any] | None = None
        if params:
            values = list(params.values())
            args = {f"p{i + 1}": value for i, value in enumerate(values)}
            query = _PLACEHOLDER.sub(r"%(p\1)s", query.replace("%", "%%"))
        reading = query.lstrip()[:6].upper() in ("SELECT", "DELETE")
        async with self._pool.connection() if reading else fenced(self._pool) as conn:
            cur = conn.cursor(row_factory=dict_row)
            cur.adapters.register_loader("jsonb", TextLoader)
            cur.adapters.register_loader("json", TextLoader)
            # A fenced connection is in pipeline mode: leaving this (nested) pipeline syncs, so
            # the result (an INSERT's RETURNING, say) is there to read.
            async with conn.pipeline():
                await cur.execute(query, args)  # type: ignore[arg-type]
            if cur.description is None:
                return []
            return await cur.fetchall()

    async def get_thread(self, thread_id: str) -> ThreadDict | None:
        """Chainlit's thread, its steps sanitised again (rows stored before sanitising existed).

        A step stored without output (the run step of on_chat_start) comes back with "", as
        Chainlit sends it live: its UI reads the first step's output as text on resume, and a
        null there was a page error on every reopened conversation that begins with one.
        """
        thread = await super().get_thread(thread_id)
        if thread is not None and thread.get("steps"):
            thread["steps"] = [_with_output(sanitise_step(step)) for step in thread["steps"]]
        return thread

    async def list_threads(
        self, pagination: Pagination, filters: ThreadFilter
    ) -> PaginatedResponse[ThreadDict]:
        """Chainlit's list, without the conversations of teams the owner is no longer a live
        member of (they cannot be opened either: get_thread_author)."""
        page = await super().list_threads(pagination, filters)
        ids = [thread["id"] for thread in page.data]
        if ids:
            rows = await self.execute_query(
                "SELECT c.thread_id FROM cairn_threads c WHERE c.thread_id = ANY($1) "  # noqa: S608
                f"AND NOT {team_thread_usable('c.thread_id')}",
                {"ids": ids},
            )
            hidden = {str(row["thread_id"]) for row in rows}
            page.data = [thread for thread in page.data if thread["id"] not in hidden]
        return page

    async def get_thread_author(self, thread_id: str) -> str:
        rows = await self.execute_query(
            'SELECT u.identifier FROM "Thread" t JOIN "User" u ON t."userId" = u.id '  # noqa: S608
            f'WHERE t.id = $1 AND t."deletedAt" IS NULL AND {team_thread_usable("t.id")}',
            {"thread_id": thread_id},
        )
        return str(rows[0]["identifier"]) if rows else ""

    async def step_author(self, step_id: str) -> str:
        """The identifier of who owns the conversation a message is in; "" when there is none."""
        rows = await self.execute_query(
            'SELECT u.identifier FROM "Step" s JOIN "Thread" t ON s."threadId" = t.id '  # noqa: S608
            'JOIN "User" u ON t."userId" = u.id WHERE s.id = $1 AND t."deletedAt" IS NULL '
            f"AND {team_thread_usable('t.id')}",
            {"step_id": step_id},
        )
        return str(rows[0]["identifier"]) if rows else ""

    async def step_exists(self, step_id: str) -> bool:
        """Whether a step of this id is stored (in any conversation) or waiting to be."""
        if step_id in self._deferred:
            return True
        rows = await self.execute_query('SELECT 1 FROM "Step" WHERE id = $1', {"step_id": step_id})
        return bool(rows)

    async def feedback_step(self, feedback_id: str) -> str | None:
        rows = await self.execute_query(
            'SELECT "stepId" FROM "Feedback" WHERE id = $1', {"feedback_id": feedback_id}
        )
        return str(rows[0]["stepId"]) if rows else None

    async def update_thread(
        self,
        thread_id: str,
        name: str | None = None,
        user_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        tags: list[str] | None = None,
    ) -> None:
        await self.pending.write(
            f"conversation {thread_id}",
            lambda: self._update_thread(thread_id, name, user_id, metadata, tags),
        )

    async def _update_thread(
        self,
        thread_id: str,
        name: str | None,
        user_id: str | None,
        metadata: dict[str, Any] | None,
        tags: list[str] | None,
    ) -> None:
        rows = await self.execute_query(
            'SELECT "userId" FROM "Thread" WHERE id = $1', {"thread_id": thread_id}
        )
        if not rows and user_id is None and await self._recently_deleted(thread_id):
            # Chainlit saves session metadata on disconnect and creates missing threads for
            # late steps; for a conversation just deleted that would bring it back as an
            # ownerless row.
            return
        # Chainlit upserts "userId" on every call; an existing owner must never be replaced.
        if rows and user_id is not None and rows[0]["userId"] not in (None, user_id):
            log.warning("refused: user row %s tried to take thread %s", user_id, thread_id)
            return
        if name is not None:
            name = plain_title(name)
        await super().update_thread(thread_id, name, user_id, metadata, tags)

    async def _recently_deleted(self, thread_id: str) -> bool:
        rows = await self.execute_query(
            "SELECT 1 FROM cairn_deleted_threads WHERE thread_id = $1", {"thread_id": thread_id}
        )
        return bool(rows)

    @queue_until_user_message()
    async def create_step(self, step_dict: StepDict) -> None:
        """A step as it is sent. A run or tool step that is still open is stored only if it is
        still open OPEN_STEP_GRACE_S later: most finish sooner (recall, a model call, the turn's
        own run step), and their update then stores them once (issue 13: three statements fewer
        per Assistant turn). Messages are stored at once."""
        params = _step_params(step_dict)
        if _open_step(step_dict):
            self._defer(params)
            return
        await self._write_step(params)

    @queue_until_user_message()
    async def update_step(self, step_dict: StepDict) -> None:
        """A step as it is now: it replaces the stored one (and one waiting to be stored)."""
        await self._write_step(_step_params(step_dict))

    def _defer(self, params: dict[str, Any]) -> None:
        step_id = str(params["id"])
        self._cancel_deferred(step_id)
        loop = asyncio.get_running_loop()
        # The callback runs in this task's context: the session's authority (the wipe's fence).
        handle = loop.call_later(OPEN_STEP_GRACE_S, self._store_deferred, step_id, params)
        self._deferred[step_id] = (params["thread_id"], handle)

    def _store_deferred(self, step_id: str, params: dict[str, Any]) -> None:
        if self._deferred.pop(step_id, None) is None:
            return
        task = asyncio.create_task(self._write_step(params))
        self._storing.add(task)
        task.add_done_callback(self._storing.discard)

    def _cancel_deferred(self, step_id: str) -> None:
        if (entry := self._deferred.pop(step_id, None)) is not None:
            entry[1].cancel()

    async def _write_step(self, params: dict[str, Any]) -> None:
        """Chainlit's create_step (and so update_step) as one statement instead of three or four.

        Chainlit selects the thread and the parent step first and creates placeholders for
        missing ones; here the placeholders are CTEs (`ON CONFLICT DO NOTHING`), and the
        foreign keys, checked at the end of the statement, see them. A conversation deleted
        in the last day is not brought back: its step fails the thread key and is dropped.
        """
        self._cancel_deferred(str(params["id"]))
        await self.pending.write(f"step {params['id']}", lambda: self._upsert_step(params))

    async def _upsert_step(self, params: dict[str, Any]) -> None:
        try:
            async with fence_statement(self._pool) as conn:
                await conn.execute(_UPSERT_STEP, params | statement_args())
        except psycopg.errors.ForeignKeyViolation:
            # The conversation was deleted while this step was on its way: drop the step.
            log.info("step %s dropped: its conversation is gone", params["id"])
        except WriteRefused:
            # Its user's data was wiped (maybe on another worker) after this session began.
            log.warning("step %s dropped: its session has ended", params["id"])

    async def delete_step(self, step_id: str) -> None:
        """Only a step of the session's conversation: the id of a refused message is the
        client's, and may name a message in someone else's conversation."""
        try:
            thread_id = context.session.thread_id
        except ChainlitContextException:
            log.warning("refused: step %s deleted outside a chat session", step_id)
            return
        self._cancel_deferred(step_id)
        async with self._pool.connection() as conn:
            await conn.execute(_DELETE_STEP, {"step_id": step_id, "thread_id": thread_id})

    @queue_until_user_message()
    async def create_element(self, element: Element) -> None:
        """Chainlit's, its bytes kept by the storage client (ui/chainlit/elements.py). One whose
        bytes are refused is not stored at all: it stays in the live chat only."""
        try:
            await super().create_element(element)
        except (ElementRefused, WriteRefused) as exc:
            log.warning("element %s (%s) not kept: %s", element.id, element.name, exc)
        except Exception:
            # Chainlit runs this in a task nobody awaits: the error would go unreported.
            log.exception("element %s (%s) could not be stored", element.id, element.name)

    @queue_until_user_message()
    async def delete_element(self, element_id: str, thread_id: str | None = None) -> None:
        """An element of the given conversation (else the session's), and its bytes."""
        if thread_id is None:
            try:
                thread_id = context.session.thread_id
            except ChainlitContextException:
                log.warning("refused: element %s deleted outside a chat session", element_id)
                return
        async with self._pool.connection() as conn:
            await conn.execute(_DELETE_ELEMENT, {"element_id": element_id, "thread_id": thread_id})

    async def delete_thread(self, thread_id: str) -> None:
        """Chainlit's rows, and first everything else the conversation left behind.

        Chainlit calls this after its author check (ours: unknown and foreign look alike).
        """
        for step_id, (step_thread, _) in list(self._deferred.items()):
            if step_thread == thread_id:
                self._cancel_deferred(step_id)
        if self._on_delete is not None:
            await self._on_delete(thread_id)
        await super().delete_thread(thread_id)

    async def close(self) -> None:
        """The pool belongs to the app, which closes it on shutdown."""


_APPEND = (
    'INSERT INTO "Step" (id, "threadId", name, type, output, metadata, "startTime", '
    '"endTime", "createdAt", "showInput", "isError") '
    "SELECT %(id)s, id, %(author)s, 'assistant_message', %(text)s, '{}', t, t, t, 'json', false "
    "FROM \"Thread\", (SELECT now() AT TIME ZONE 'UTC' AS t) AS now_utc WHERE id = %(thread)s"
)
_NOT_LAST = (
    ' AND %(text)s IS DISTINCT FROM (SELECT s.output FROM "Step" s '
    "WHERE s.\"threadId\" = %(thread)s AND s.type = 'assistant_message' "
    'ORDER BY s."createdAt" DESC LIMIT 1)'
)


async def append_message(
    pool: Pool, thread_id: str, text: str, *, author: str = "Cairn", once: bool = False
) -> None:
    """A message added to a stored conversation from outside a live chat session (a run
    finished on behalf of a user who is not connected, a page's answer to a paused question).

    Chainlit's data layer records steps only inside a live session (data/utils.py
    `queue_until_user_message`), so the row is written here, after the thread's other steps;
    it is sanitised on read like every stored step. The only writer of step rows outside
    `PostgresDataLayer` besides `store_edit`. `once`: not when the thread already ends on this
    reply.
    """
    if not text:
        return
    params = {"id": str(uuid.uuid4()), "author": author, "text": text, "thread": thread_id}
    async with fenced(pool) as conn:  # refused once the user's data was wiped
        await conn.execute(_APPEND + (_NOT_LAST if once else ""), params)


_STORE_EDIT = """
WITH edited AS (
    SELECT "createdAt" FROM "Step"
    WHERE id = %(message)s AND "threadId" = %(thread)s AND type = 'user_message'
), later AS (
    SELECT id FROM "Step" WHERE "threadId" = %(thread)s AND id <> %(message)s
      AND "createdAt" >= (SELECT "createdAt" FROM edited)
), elements AS (
    DELETE FROM "Element" WHERE "stepId" IN (SELECT id FROM later)
), feedback AS (
    DELETE FROM "Feedback" WHERE "stepId" IN (SELECT id FROM later)
), gone AS (
    DELETE FROM "Step" WHERE id IN (SELECT id FROM later)
)
UPDATE "Step" SET output = %(text)s
WHERE id = %(message)s AND "threadId" = %(thread)s AND type = 'user_message'
"""
"""Steps stored in the same millisecond as the edited message count as later: a turn's own
steps start right after its message, the previous turn's long before."""


async def store_edit(pool: Pool, thread_id: str, message_id: str, text: str) -> None:
    """The stored conversation as an edit leaves it, in one statement: the user's message with
    its new text and nothing after it. Done again by a run resumed for an edit whose worker
    stopped before or while changing the conversation, so it changes nothing the second time."""
    params = {"thread": thread_id, "message": message_id, "text": text}
    async with fenced(pool) as conn:  # refused once the user's data was wiped
        await conn.execute(_STORE_EDIT, params)


async def add_outside_turn(
    pool: Pool, *, thread_id: str, user_id: str, profile: str, text: str
) -> None:
    """A message sent from outside the chat (over MCP): the conversation is created in the
    user's sidebar if it is new (named after its first message, opening in its agent's
    profile), and the message added to it. The caller has checked ownership (cairn_threads);
    a Thread row of another user is never touched, nor one of a deleted conversation."""
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(
            'INSERT INTO "Thread" (id, name, metadata, "userId", "updatedAt") '
            'SELECT %(thread)s, %(name)s, %(metadata)s, u.id, now() FROM "User" u '
            "WHERE u.identifier = %(user)s "
            "AND NOT EXISTS (SELECT 1 FROM cairn_deleted_threads WHERE thread_id = %(thread)s) "
            'ON CONFLICT (id) DO UPDATE SET "updatedAt" = now() '
            'WHERE "Thread"."userId" = EXCLUDED."userId"',
            {
                "thread": thread_id,
                "name": text[:100],
                "metadata": json.dumps({"chat_profile": profile}),
                "user": user_id,
            },
        )
        await conn.execute(
            'INSERT INTO "Step" (id, "threadId", name, type, output, metadata, "startTime", '
            '"endTime", "createdAt", "showInput", "isError") '
            "SELECT %s, t.id, 'user', 'user_message', %s, '{}', n.t, n.t, n.t, 'json', false "
            'FROM "Thread" t JOIN "User" u ON u.id = t."userId", '
            "(SELECT now() AT TIME ZONE 'UTC' AS t) AS n WHERE t.id = %s AND u.identifier = %s",
            (str(uuid.uuid4()), text, thread_id, user_id),
        )


async def stored_user_message(pool: Pool, thread_id: str, message_id: str) -> str | None:
    """The text of a user's message in a stored conversation (for Retry after an outage)."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            'SELECT output FROM "Step" WHERE id = %s AND "threadId" = %s AND type = %s',
            (message_id, thread_id, "user_message"),
        )
        row = await cur.fetchone()
    return None if row is None else str(row["output"] or "")


async def unanswered_message(pool: Pool, thread_id: str) -> str | None:
    """The message a conversation ends on an outage error for (ui.surface.retry_message), if it
    does: the user has not retried it yet."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT metadata->>'retry_message_id' AS message_id FROM \"Step\" "
            'WHERE "threadId" = %s ORDER BY "startTime" DESC, "createdAt" DESC LIMIT 1',
            (thread_id,),
        )
        row = await cur.fetchone()
    return None if row is None else row["message_id"]
