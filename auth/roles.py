"""Roles granted by configuration: who is support (CAIRN_SUPPORT_USERS)."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import Depends, HTTPException

from auth.identity import CurrentUserId
from graphs.core.errors import NOT_FOUND
from graphs.core.settings import get_settings

log = logging.getLogger("cairn.security")


def is_support(user_id: str) -> bool:
    """True for an identity listed in CAIRN_SUPPORT_USERS (exactly as auth/ makes it)."""
    return bool(user_id) and user_id in get_settings().support_users


async def _support_user_id(user_id: CurrentUserId) -> str:
    if not is_support(user_id):
        # Anyone else gets the answer a missing conversation gets: the pages do not exist.
        log.warning("refused: user %s reached a support page", user_id)
        raise HTTPException(status_code=404, detail=NOT_FOUND)
    return user_id


SupportUserId = Annotated[str, Depends(_support_user_id)]
"""For FastAPI routes: the signed-in user's id when they have the support role, else 404."""
