"""A worker process for test_durable_runs: accepts an edit of an Assistant message and stops
right there (its `on_fork` never returns), until the test kills it with SIGKILL.

    python -m tests.integration.edit_worker DATABASE_URL THREAD_ID MESSAGE_ID TEXT WHEN

WHEN is `journalled` (stopped before the conversation changes) or `shown` (stopped once the
stored conversation shows the edit, before the fork writes anything).
"""

from __future__ import annotations

import asyncio
import sys

from tests.integration.test_durable_runs import make_runner
from ui.chainlit.data_layer import store_edit
from ui.surface import HeadlessSurface


async def main(url: str, thread_id: str, message_id: str, text: str, when: str) -> None:
    runner, close = await make_runner(url, worker="doomed-edit", agent="assistant")
    pool = runner.threads.pool  # type: ignore[attr-defined]

    async def on_fork() -> None:
        if when == "shown":  # what the chat's edit handler stores (ui/chainlit/chat.py)
            await store_edit(pool, thread_id, message_id, text)
        await asyncio.Event().wait()  # killed here

    try:
        await runner.edit(
            HeadlessSurface(),
            user_id="alice",
            thread_id=thread_id,
            message_id=message_id,
            text=text,
            on_fork=on_fork,
        )
    finally:
        await close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
