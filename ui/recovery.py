"""Runs a stopped worker left behind, resumed by this one: live in the user's chat when they
are connected here, otherwise written into the conversation for when they open it."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from graphs.core import fence
from ui.chainlit_patches import enter_live_session
from ui.data_layer import append_message
from ui.surface import ChatSurface, HeadlessSurface

if TYPE_CHECKING:
    from graphs.core.pool import Pool
    from graphs.core.runs import StrandedRun
    from ui.runner import Runner, RunOutcome

log = logging.getLogger("cairn.runs")

SWEEP_S = 5.0


class StoredSurface(HeadlessSurface):
    """Nobody watches here: notices and errors go into the stored conversation."""

    def __init__(self, pool: Pool, thread_id: str) -> None:
        super().__init__()
        self.pool = pool
        self.thread_id = thread_id

    async def failed(self, text: str, *, thread_id: str, message_id: str | None = None) -> None:
        await super().failed(text, thread_id=thread_id, message_id=message_id)
        await append_message(self.pool, thread_id, text)

    async def notice(self, text: str) -> None:
        await super().notice(text)
        await append_message(self.pool, self.thread_id, text)


async def resume(runner: Runner, pool: Pool, run: StrandedRun) -> RunOutcome:
    """In its own task: a live session's chat context must not leak into other runs.

    Authorised from now (graphs.core.fence): if the user's data is wiped meanwhile, the rest
    of the run and the reply written for it are refused."""
    fence.adopt(fence.Fence.now(run.user_id))
    if enter_live_session(thread_id=run.thread_id, user_id=run.user_id):
        return await runner.resume_stranded(run, ChatSurface(signals_task=True))
    outcome = await runner.resume_stranded(run, StoredSurface(pool, run.thread_id))
    if outcome.reply:
        await append_message(pool, run.thread_id, outcome.reply)
    return outcome


async def recover_once(runner: Runner, pool: Pool) -> list[RunOutcome]:
    """One sweep: every stranded run taken by this worker and resumed, side by side."""
    runs = await runner.stranded()
    if not runs:
        return []
    return list(await asyncio.gather(*(asyncio.create_task(resume(runner, pool, r)) for r in runs)))


async def recover_forever(runner: Runner, pool: Pool, *, every_s: float = SWEEP_S) -> None:
    """A sweep every `every_s`; each run taken goes on in its own task, so a long one (a
    Research run takes minutes) does not hold up the next sweep, and a run stranded meanwhile
    is resumed at once."""
    resuming: set[asyncio.Task[RunOutcome]] = set()

    def ended(task: asyncio.Task[RunOutcome]) -> None:
        resuming.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("resuming a stranded run failed", exc_info=exc)

    while True:
        try:
            for run in await runner.stranded():
                task = asyncio.create_task(resume(runner, pool, run))
                resuming.add(task)
                task.add_done_callback(ended)
        except Exception as exc:
            log.warning("looking for stranded runs failed: %s", exc)
        await asyncio.sleep(every_s)
