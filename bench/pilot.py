"""A scripted pilot: conversations with the three agents through the real runner, offline models, one Postgres."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.embeddings import Embeddings

from graphs.assistant.graph import build_graph as build_assistant
from graphs.assistant.offline import offline_assistant
from graphs.core.embeddings import LOCAL_MODEL_DIMS, EmbeddingSpec
from graphs.core.persistence import make_pool, open_persistence
from graphs.core.runlock import ThreadRunLocks
from graphs.core.settings import Settings
from graphs.core.usage import UsageLedger
from graphs.planner.graph import build_graph as build_planner
from graphs.planner.offline import offline_planner
from graphs.planner.sql import AnalyticsDatabase, analyst_url
from graphs.planner.tools import make_tools
from graphs.research import SAMPLE_CORPUS_DIR
from graphs.research.graph import ResearchTools
from graphs.research.graph import build_graph as build_research
from graphs.research.offline import OfflineResearchModel
from graphs.tools.fetch import Fetcher
from graphs.tools.fetchlog import PostgresFetchLog
from graphs.tools.search import LocalCorpus
from ui.agents import assistant, planner, research
from ui.runner import PostgresThreads, Runner
from ui.surface import HeadlessSurface

FACTS = ("I am vegetarian", "I live in Lyon", "my daughter is called Ana", "I run marathons")
QUESTIONS = ("What should I cook tonight?", "Plan a quiet weekend for me.", "Any book ideas?")
GOALS = (
    "Which region had the highest churn last quarter?",
    "What was the revenue by region last quarter?",
    "How many customers does each plan have?",
)
TOPICS = (
    "When did the Svalbard seed vault open?",
    "How do honeybees share the location of food?",
    "Why do pollinators matter to crops?",
)
CONCURRENCY = 4
"""Conversations in flight at once, as several users would."""


class FixedEmbeddings(Embeddings):
    """Deterministic unit vectors from the text's bytes: no model download, same size as MiniLM."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self._one(text) for text in texts]

    def embed_query(self, text: str) -> list[float]:
        return self._one(text)

    def _one(self, text: str) -> list[float]:
        values = [float((sum(text.encode()) * (i + 7)) % 97) + 1.0 for i in range(LOCAL_MODEL_DIMS)]
        norm = sum(v * v for v in values) ** 0.5
        return [v / norm for v in values]


@dataclass(frozen=True)
class PilotShape:
    """How many conversations of each agent, among how many users."""

    assistant: int
    planner: int
    research: int
    users: int

    def scaled(self, factor: int) -> PilotShape:
        return PilotShape(
            self.assistant * factor,
            self.planner * factor,
            self.research * factor,
            self.users * factor,
        )

    @property
    def threads(self) -> dict[str, int]:
        return {"assistant": self.assistant, "planner": self.planner, "research": self.research}


@asynccontextmanager
async def pilot_runner(url: str) -> AsyncIterator[Runner]:
    """One worker's runner with the three agents, recording usage, as ui/runtime.py builds it."""
    settings = Settings(data_dir=Path(tempfile.mkdtemp()))
    embedding = EmbeddingSpec("test:fixed", LOCAL_MODEL_DIMS, FixedEmbeddings())
    persistence = await open_persistence(
        settings, pool=make_pool(url, max_size=8), embedding=embedding
    )
    store, saver = persistence.store, persistence.checkpointer
    corpus = LocalCorpus(SAMPLE_CORPUS_DIR, store=store)
    fetcher = Fetcher(log=PostgresFetchLog(persistence.pool), openers={"corpus": corpus.open})
    graphs: dict[str, Any] = {
        "assistant": build_assistant(checkpointer=saver, store=store, model=offline_assistant()),
        "planner": build_planner(
            checkpointer=saver,
            store=store,
            model=offline_planner(),
            tools=make_tools(AnalyticsDatabase(analyst_url(url), timeout_ms=5000)),
        ),
        "research": build_research(
            checkpointer=saver,
            store=store,
            model=OfflineResearchModel(),
            tools=ResearchTools(search=corpus, fetcher=fetcher),
            settings=Settings(research_critique_rounds=1),
        ),
    }
    locks = ThreadRunLocks(persistence.pool)
    runner = Runner(
        agents=[assistant.SPEC, planner.SPEC, research.SPEC],
        graphs=graphs,
        threads=PostgresThreads(persistence.pool),
        locks=locks,
        usage=UsageLedger.from_settings(persistence.pool, settings),
    )
    try:
        yield runner
    finally:
        await runner.drain()
        await locks.close()
        await persistence.close()


async def run_pilot(url: str, shape: PilotShape, *, seed: int = 0) -> None:
    """Every conversation of `shape`, a few at a time; a run that does not finish is an error."""
    users = [f"pilot-{seed}-{i}" for i in range(shape.users)]
    plan = [(agent, i) for agent, count in shape.threads.items() for i in range(count)]
    gate = asyncio.Semaphore(CONCURRENCY)
    async with pilot_runner(url) as runner:

        async def one(agent: str, i: int) -> None:
            async with gate:
                await CONVERSATIONS[agent](runner, users[i % len(users)], i)

        await asyncio.gather(*(one(agent, i) for agent, i in plan))


async def _send(runner: Runner, user: str, thread: str, profile: str, text: str) -> Any:
    surface = HeadlessSurface()
    outcome = await runner.message(
        surface,
        user_id=user,
        thread_id=thread,
        profile=profile,
        text=text,
        message_id=str(uuid.uuid4()),
        temporary=False,
    )
    if outcome.status not in ("done", "paused"):
        msg = f"pilot {profile} run ended {outcome.status}: {surface.errors}"
        raise RuntimeError(msg)
    return outcome


async def _approve(runner: Runner, user: str, thread: str, outcome: Any) -> None:
    surface = HeadlessSurface()
    for interrupt in outcome.interrupts:
        answered = await runner.answer(
            surface, user_id=user, thread_id=thread, interrupt_id=interrupt.id, decision="approve"
        )
        if answered.status != "done":
            msg = f"pilot approval ended {answered.status}: {surface.errors}"
            raise RuntimeError(msg)


async def assistant_conversation(runner: Runner, user: str, i: int) -> None:
    thread = f"pilot-a-{uuid.uuid4()}"
    await _send(runner, user, thread, "Assistant", f"Remember that {FACTS[i % len(FACTS)]}.")
    for question in QUESTIONS:
        await _send(runner, user, thread, "Assistant", question)


async def planner_conversation(runner: Runner, user: str, i: int) -> None:
    thread = f"pilot-p-{uuid.uuid4()}"
    outcome = await _send(runner, user, thread, "Planner", GOALS[i % len(GOALS)])
    await _approve(runner, user, thread, outcome)


async def research_conversation(runner: Runner, user: str, i: int) -> None:
    thread = f"pilot-r-{uuid.uuid4()}"
    outcome = await _send(runner, user, thread, "Research", TOPICS[i % len(TOPICS)])
    await _approve(runner, user, thread, outcome)


CONVERSATIONS = {
    "assistant": assistant_conversation,
    "planner": planner_conversation,
    "research": research_conversation,
}
