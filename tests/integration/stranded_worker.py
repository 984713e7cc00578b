"""A worker process for test_durable_runs: approves a paused plan (Planner or Research), or sends
an Assistant message, and runs it slowly, until the test kills it with SIGKILL mid-run.

    python -m tests.integration.stranded_worker DATABASE_URL THREAD_ID INTERRUPT_ID [AGENT]

(For the Assistant, INTERRUPT_ID is unused: the worker sends a message instead.) With
CAIRN_TEST_BEAT_S set, the worker beats its runs that often, as an app worker does.
"""

from __future__ import annotations

import asyncio
import os
import sys

from graphs.core.runs import heartbeat_forever
from tests.integration.test_durable_runs import ASSISTANT_MESSAGE, SLOW_CALL_S, make_runner
from ui.surface import HeadlessSurface


async def main(url: str, thread_id: str, interrupt_id: str, agent: str = "planner") -> None:
    runner, close = await make_runner(url, worker="doomed", slow_s=SLOW_CALL_S, agent=agent)
    if beat_s := os.environ.get("CAIRN_TEST_BEAT_S"):
        assert runner.journal is not None
        beats = asyncio.create_task(heartbeat_forever(runner.journal, every_s=float(beat_s)))
    try:
        if agent == "assistant":  # a plain turn, no pause to answer
            await runner.message(
                HeadlessSurface(),
                user_id="alice",
                thread_id=thread_id,
                profile="Assistant",
                text=ASSISTANT_MESSAGE,
                message_id="m-doomed",
                temporary=False,
            )
            return
        await runner.answer(
            HeadlessSurface(),
            user_id="alice",
            thread_id=thread_id,
            interrupt_id=interrupt_id,
            decision="approve",
        )
    finally:
        if beat_s:
            beats.cancel()
        await close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
