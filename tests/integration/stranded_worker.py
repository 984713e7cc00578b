"""A worker process for test_durable_runs: approves a paused plan (Planner or Research), or sends
an Assistant message, and runs it slowly, until the test kills it with SIGKILL mid-run.

    python -m tests.integration.stranded_worker DATABASE_URL THREAD_ID INTERRUPT_ID [AGENT]

(For the Assistant, INTERRUPT_ID is unused: the worker sends a message instead.)
"""

from __future__ import annotations

import asyncio
import sys

from tests.integration.test_durable_runs import ASSISTANT_MESSAGE, SLOW_CALL_S, make_runner
from ui.surface import HeadlessSurface


async def main(url: str, thread_id: str, interrupt_id: str, agent: str = "planner") -> None:
    runner, close = await make_runner(url, worker="doomed", slow_s=SLOW_CALL_S, agent=agent)
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
        await close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
