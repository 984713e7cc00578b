"""Thread ACL: unknown and foreign threads get the same answer on every Chainlit thread route."""

from __future__ import annotations

import logging

from chainlit.data import get_data_layer
from fastapi import HTTPException

from auth.ownership import NOT_FOUND

log = logging.getLogger("cairn.security")

ACL_PINS = {
    "chainlit.data.acl.is_thread_author": "522c3ed9c195fc54",
}
"""The Chainlit code this module relies on (qualified name: digest of its source as checked),
tripped by tests/unit/test_chainlit_patches.py when an upgrade changes it."""


async def require_thread_author(username: str, thread_id: str) -> bool:
    """Replaces chainlit.data.acl.is_thread_author on every Chainlit thread route.

    Chainlit answers 404 for an unknown thread and 401 for someone else's, which tells an
    attacker which ids exist; here both are the same 404, and the foreign one is logged.
    """
    data_layer = get_data_layer()
    author = await data_layer.get_thread_author(thread_id) if data_layer else ""
    if not author or author != username:
        if author:
            log.warning("refused: %s asked for thread %s of another user", username, thread_id)
        raise HTTPException(status_code=404, detail=NOT_FOUND)
    return True
