"""Hearing other workers: Postgres LISTEN on a connection of its own, opened again when lost."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from psycopg import AsyncConnection

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from graphs.core.pool import Pool

log = logging.getLogger("cairn.notify")

RETRY_S = 1.0


async def listen_forever(
    pool: Pool,
    channels: Sequence[str],
    heard: Callable[[str, str], Awaitable[object]],
    *,
    what: str,
) -> None:
    """Until cancelled: heard(channel, payload) for every notification on `channels`, in the
    order they commit. A lost connection is opened again after RETRY_S; what was sent
    meanwhile is missed, so a listener only speeds up what Postgres enforces anyway. `what`
    names the listener in the log."""
    while True:
        try:
            conninfo = pool.conninfo  # the app's pools are built from a URL string
            assert isinstance(conninfo, str)
            conn = await AsyncConnection.connect(conninfo, autocommit=True)
            async with conn:
                for channel in channels:
                    await conn.execute(f"LISTEN {channel}")
                async for notice in conn.notifies():
                    await heard(notice.channel, notice.payload)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("listening for %s failed (%s); trying again", what, exc)
        await asyncio.sleep(RETRY_S)
