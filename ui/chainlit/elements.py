"""Element storage in Postgres: the bytes of what a reply showed, and kept uploads, served to their owner only."""

from __future__ import annotations

import fnmatch
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from chainlit.context import ChainlitContextException, context
from chainlit.data.storage_clients.base import BaseStorageClient
from fastapi import APIRouter, HTTPException, Response

from auth.identity import CurrentUserId
from graphs.core.fence import fenced

if TYPE_CHECKING:
    from graphs.core.persistence import Pool

log = logging.getLogger("cairn.security")

MIB = 1024 * 1024
PRODUCED_MIME_TYPES = frozenset({"application/json", "text/markdown", "application/pdf"})
"""What Cairn's replies attach: a Planner chart (Plotly JSON), a research report (.md, .pdf).
Uploads add the types users may attach (CAIRN_UPLOAD_MIME_TYPES)."""
MAX_ELEMENT_BYTES = 10 * MIB
MAX_THREAD_BYTES = 100 * MIB
"""All the element bytes one conversation may keep."""
ROUTE = "/elements"

_UUID = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_KEY = re.compile(f"threads/(?P<thread>{_UUID})/files/(?P<element>{_UUID})")
"""Chainlit's object key for an element of a conversation (ChainlitDataLayer.create_element);
its `files/<id>` for an element outside one is refused: no conversation, no owner to check."""

_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('cairn-elements:' || %s, 0))"
_ROOM = """
SELECT
  (u.identifier IS NULL OR u.identifier = %(user)s) AS owned,
  (SELECT COALESCE(sum(size), 0) FROM cairn_element_files
    WHERE thread_id = %(thread)s AND object_key <> %(key)s) AS used
FROM "Thread" t LEFT JOIN "User" u ON u.id = t."userId"
WHERE t.id = %(thread)s AND t."deletedAt" IS NULL
"""
_STORE = """
INSERT INTO cairn_element_files (object_key, thread_id, user_id, mime, size, data)
VALUES (%(key)s, %(thread)s, %(user)s, %(mime)s, %(size)s, %(data)s)
ON CONFLICT (object_key) DO UPDATE SET mime = EXCLUDED.mime, size = EXCLUDED.size,
    data = EXCLUDED.data
WHERE cairn_element_files.thread_id = EXCLUDED.thread_id
  AND cairn_element_files.user_id = EXCLUDED.user_id
"""
_READ = """
SELECT f.mime, f.data, e.name FROM cairn_element_files f
JOIN "Element" e ON e.id = %(element)s AND e."objectKey" = f.object_key
JOIN "Thread" t ON t.id = f.thread_id AND t."deletedAt" IS NULL
JOIN "User" u ON u.id = t."userId"
WHERE f.object_key = %(key)s AND f.thread_id = %(thread)s
  AND f.user_id = %(user)s AND u.identifier = %(user)s
"""
"""The bytes, for the user who stored them in their own conversation, while the element the
conversation shows them in exists."""


class ElementRefused(ValueError):
    """An element whose bytes are not kept: not of a conversation, of a type Cairn does not
    produce, too large, or in a conversation that is not the session user's."""


@dataclass(frozen=True)
class StoredElement:
    mime: str
    name: str
    data: bytes


def element_key(thread_id: str, element_id: str) -> str:
    return f"threads/{thread_id}/files/{element_id}"


def read_url(object_key: str) -> str:
    """Where the browser fetches an element's bytes (relative: the app's own origin)."""
    return f"{ROUTE}/{object_key}"


class PostgresStorageClient(BaseStorageClient):
    """Chainlit's storage client (`BaseStorageClient`) on the shared pool.

    Chainlit uploads an element's bytes from `create_element` inside the chat session, so the
    owner is the session's verified user, and the conversation is the one in the object key.
    Every worker reads the same rows; they go with their conversation (the table's foreign key to
    "Thread": sidebar delete, the memory page's delete, retention and a wipe all delete it).
    """

    def __init__(
        self,
        pool: Pool,
        *,
        mime_types: Iterable[str] = (),
        max_element_bytes: int = MAX_ELEMENT_BYTES,
        max_thread_bytes: int = MAX_THREAD_BYTES,
    ) -> None:
        self._pool = pool
        self._mime_patterns = tuple(mime_types)
        self.max_element_bytes = max_element_bytes
        self.max_thread_bytes = max_thread_bytes

    def accepts(self, mime: str) -> bool:
        if mime in PRODUCED_MIME_TYPES:
            return True
        return any(fnmatch.fnmatch(mime, pattern) for pattern in self._mime_patterns)

    async def upload_file(
        self,
        object_key: str,
        data: bytes | str,
        mime: str = "application/octet-stream",
        overwrite: bool = True,
        content_disposition: str | None = None,
    ) -> dict[str, Any]:
        body = data.encode() if isinstance(data, str) else bytes(data)
        mime = mime.split(";")[0].strip().lower()
        await self.store(object_key, body, mime=mime, user_id=_session_user())
        return {"object_key": object_key, "url": read_url(object_key)}

    async def store(self, object_key: str, body: bytes, *, mime: str, user_id: str) -> None:
        """Keep `body` under `object_key` for `user_id`; ElementRefused says why not. Fenced:
        refused once the user's data was wiped after the session began."""
        if (match := _KEY.fullmatch(object_key)) is None:
            msg = f"element key {object_key!r} names no conversation"
            raise ElementRefused(msg)
        if not self.accepts(mime):
            msg = f"element of type {mime!r} is not one Cairn keeps"
            raise ElementRefused(msg)
        if len(body) > self.max_element_bytes:
            msg = f"element of {len(body)} bytes is over the {self.max_element_bytes} limit"
            raise ElementRefused(msg)
        params = {"key": object_key, "thread": match["thread"], "user": user_id}
        async with fenced(self._pool) as conn, conn.transaction():
            # Serialised per conversation, so two elements at once cannot both pass its limit.
            await conn.execute(_LOCK, (match["thread"],))
            cur = await conn.execute(_ROOM, params)
            room = await cur.fetchone()
            if room is None or not room["owned"]:
                msg = f"conversation {match['thread']} is not {user_id}'s"
                raise ElementRefused(msg)
            if int(room["used"]) + len(body) > self.max_thread_bytes:
                msg = f"conversation {match['thread']} is at its {self.max_thread_bytes}-byte limit"
                raise ElementRefused(msg)
            await conn.execute(_STORE, params | {"mime": mime, "size": len(body), "data": body})

    async def read(self, object_key: str, *, user_id: str) -> StoredElement | None:
        """The element's bytes for its owner; None for anyone else, as for a missing one."""
        if (match := _KEY.fullmatch(object_key)) is None:
            return None
        params = {
            "key": object_key,
            "thread": match["thread"],
            "element": match["element"],
            "user": user_id,
        }
        async with self._pool.connection() as conn:
            cur = await conn.execute(_READ, params)
            row = await cur.fetchone()
        if row is None:
            return None
        return StoredElement(mime=row["mime"], name=row["name"], data=bytes(row["data"]))

    async def delete_file(self, object_key: str) -> bool:
        """Called by Chainlit's delete_thread after its author check."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "DELETE FROM cairn_element_files WHERE object_key = %s", (object_key,)
            )
        return cur.rowcount > 0

    async def get_read_url(self, object_key: str) -> str:
        return read_url(object_key)

    async def close(self) -> None:
        """The pool belongs to the app."""


def _session_user() -> str:
    try:
        user = context.session.user
    except ChainlitContextException:
        user = None
    identifier = getattr(user, "identifier", None)
    if not identifier:
        msg = "an element sent outside a signed-in chat session"
        raise ElementRefused(msg)
    return str(identifier)


def _disposition(name: str) -> str:
    """An attachment named as shown; the plain-ASCII fallback cannot end the header's quotes."""
    fallback = re.sub(r"[^A-Za-z0-9._ -]", "_", name)[:200] or "file"
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name[:200])}"


def build_router(storage: PostgresStorageClient) -> APIRouter:
    """`GET /elements/threads/<conversation>/files/<element>`: an element's bytes, for its
    owner only; any other request answers 404, as for an element that does not exist."""
    router = APIRouter()

    @router.get(ROUTE + "/{object_key:path}")
    async def element_bytes(object_key: str, user_id: CurrentUserId) -> Response:
        stored = await storage.read(object_key, user_id=user_id)
        if stored is None:
            log.info("element %s not served to %s (missing or not theirs)", object_key, user_id)
            raise HTTPException(status_code=404, detail="Not found")
        mime = f"{stored.mime}; charset=utf-8" if stored.mime.startswith("text/") else stored.mime
        return Response(
            stored.data,
            media_type=mime,
            headers={
                "Content-Disposition": _disposition(stored.name),
                # Private to the signed-in user, and gone from the browser once deleted.
                "Cache-Control": "private, no-store",
                "Content-Security-Policy": "sandbox; default-src 'none'",
            },
        )

    return router
