"""Runs a stopped worker left behind, resumed by this one: live in the user's chat when they
are connected here, otherwise written into the conversation for when they open it."""

from __future__ import annotations

import asyncio
import logging
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from auth.reviews import DECIDED_CHANNEL
from graphs.core import fence
from graphs.core.notify import listen_forever
from ui.surface import HeadlessSurface

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from auth.reviews import Review, Reviews
    from graphs.core.runs import StrandedRun
    from ui.port import ChatPort
    from ui.runner import Runner, RunOutcome

log = logging.getLogger("cairn.runs")

SWEEP_S = 5.0


class StoredSurface(HeadlessSurface):
    """Nobody watches here: notices and errors go into the stored conversation."""

    def __init__(self, chat: ChatPort, thread_id: str) -> None:
        super().__init__()
        self.chat = chat
        self.thread_id = thread_id

    async def failed(self, text: str, *, thread_id: str, message_id: str | None = None) -> None:
        await super().failed(text, thread_id=thread_id, message_id=message_id)
        await self.chat.append_reply(thread_id, text, once=True)

    async def notice(self, text: str) -> None:
        await super().notice(text)
        await self.chat.append_reply(self.thread_id, text, once=True)


async def resume(runner: Runner, chat: ChatPort, run: StrandedRun) -> RunOutcome:
    """In its own task: a live session's chat context must not leak into other runs.

    Authorised from now (graphs.core.fence): if the user's data is wiped meanwhile, the rest
    of the run and the reply written for it are refused."""
    fence.adopt(fence.Fence.now(run.user_id))
    on_fork = _store_edit(chat, run)
    live = chat.live_surface(thread_id=run.thread_id, user_id=run.user_id)
    if live is not None:
        return await runner.resume_stranded(run, live, on_fork=on_fork)
    stored = StoredSurface(chat, run.thread_id)
    outcome = await runner.resume_stranded(run, stored, on_fork=on_fork)
    if outcome.reply:
        await chat.append_reply(run.thread_id, outcome.reply, once=True)
    return outcome


def _store_edit(chat: ChatPort, run: StrandedRun) -> Callable[[], Awaitable[None]] | None:
    """An edit's side of the conversation, done again before its fork runs again."""
    edit = run.edit
    if edit is None:
        return None

    async def store() -> None:
        await chat.store_edit(run.thread_id, edit.message_id, edit.text)

    return store


async def recover_once(runner: Runner, chat: ChatPort) -> list[RunOutcome]:
    """One sweep: every stranded run taken by this worker and resumed, side by side."""
    runs = await runner.stranded()
    if not runs:
        return []
    return list(await asyncio.gather(*(asyncio.create_task(resume(runner, chat, r)) for r in runs)))


REVIEW_STALE_S = 30.0
"""A reviewer's decision not carried out for this long (its worker stopped) is taken up by
another worker's sweep."""
DECIDED = {"approve": "Approved", "edit": "Edited", "reject": "Rejected"}


async def carry_out(
    runner: Runner, chat: ChatPort, reviews: Reviews, review: Review, note: str | None = None
) -> RunOutcome:
    """A reviewer's decision on a team plan (auth/reviews.py), answered as the run's own
    question through the runner: live in the requester's chat when they are connected here,
    otherwise written into the conversation for when they open it. `note` (who decided, when)
    goes into the conversation first. Idempotent: a question no longer waiting is left alone,
    so a sweep (no note) may carry out the same decision again after a worker stopped; it
    writes only into the stored conversation, so a live chat never sees its "already
    answered" or "busy" while the first attempt's run is still going."""
    fence.adopt(fence.Fence.now(review.requester_id))
    live = (
        chat.live_surface(thread_id=review.thread_id, user_id=review.requester_id)
        if note is not None
        else None
    )
    surface = live if live is not None else StoredSurface(chat, review.thread_id)
    if note:
        await surface.notice(note)

    async def edited(_question: str, _seconds: int) -> str | None:
        return review.edit_text

    outcome = await runner.answer(
        surface,
        user_id=review.requester_id,
        thread_id=review.thread_id,
        interrupt_id=review.interrupt_id,
        decision=review.status,
        ask=edited,
        reviewed_by=review.decided_by or "reviewer",
    )
    if live is None and outcome.reply:
        await chat.append_reply(review.thread_id, outcome.reply, once=True)
    if outcome.status != "busy":  # busy: the first attempt still runs; the sweep looks again
        await reviews.applied(review)
    return outcome


_MARKDOWN = re.compile(r"([\\`*_\[\]()#<>!|~])")


def note_for(review: Review, reviewer_name: str, *, markdown: bool = True) -> str:
    """What the requester is told about a decision: who, what and when. The name is the
    reviewer's own (from their sign-in): escaped where it becomes a chat message's Markdown,
    so it reads as the name and never as a link or markup."""
    when = (review.decided_at or datetime.now(UTC)).astimezone(UTC)
    verb = DECIDED.get(review.status, review.status)
    name = _MARKDOWN.sub(r"\\\1", reviewer_name) if markdown else reviewer_name
    return f"{verb} by {name} (reviewer) on {when:%Y-%m-%d %H:%M} UTC."


FOLLOW = " The plan goes on: reload this conversation to follow it."


async def announce_decisions(reviews: Reviews, chat: ChatPort) -> None:
    """Until cancelled: each reviewer's decision, told to its requester in their open chat on
    this worker (a passing notice; the stored conversation has the decision's line and the
    run's reply, written by the worker that carries it out). Not on the worker carrying it
    out: that one streams the run into the requester's chat itself."""
    telling: set[asyncio.Task[None]] = set()

    async def tell(review_id: str) -> None:
        if review_id in reviews.carrying:
            return
        found = await reviews.decided_one(review_id)
        if found is None:
            return
        review, name = found
        await chat.tell_live(
            thread_id=review.thread_id,
            user_id=review.requester_id,
            text=note_for(review, name, markdown=False) + FOLLOW,
        )

    async def heard(_channel: str, payload: str) -> None:
        # Its own task: telling enters the requester's chat session as the current context.
        task = asyncio.create_task(tell(payload[:100]))
        telling.add(task)
        task.add_done_callback(telling.discard)

    await listen_forever(reviews.pool, (DECIDED_CHANNEL,), heard, what="review decisions")


async def recover_forever(
    runner: Runner,
    chat: ChatPort,
    reviews: Reviews | None = None,
    *,
    every_s: float = SWEEP_S,
) -> None:
    """A sweep every `every_s`; each run taken goes on in its own task, so a long one (a
    Research run takes minutes) does not hold up the next sweep, and a run stranded meanwhile
    is resumed at once. Reviewers' decisions whose worker stopped before carrying them out
    are carried out the same way."""
    resuming: set[asyncio.Task[RunOutcome]] = set()

    def ended(task: asyncio.Task[RunOutcome]) -> None:
        resuming.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("resuming a stranded run failed", exc_info=exc)

    while True:
        try:
            work = [resume(runner, chat, run) for run in await runner.stranded()]
            if reviews is not None:
                taken = await reviews.take_unapplied(stale_s=REVIEW_STALE_S)
                work += [carry_out(runner, chat, reviews, review) for review in taken]
            for job in work:
                task = asyncio.create_task(job)
                resuming.add(task)
                task.add_done_callback(ended)
        except Exception as exc:
            log.warning("looking for stranded runs failed: %s", exc)
        await asyncio.sleep(every_s)
