"""Where an Assistant turn's CPU goes, below Chainlit: the embedding, the graph, the checkpoints.

`bench.ttft` measures the whole turn through a real socket (the app against a bare Chainlit
handler). This measures the parts in one process, on an embedded Postgres, on uvloop as the app
serves, so the whole-turn figure can be read as a sum:

- **query embedding**: MiniLM on onnxruntime for one message (what recall waits for);
- **graph, checkpoints in memory**: the Assistant graph as the app runs it (offline model, recall
  against the Postgres store with the query embedding started first, `messages` + `updates` +
  `tasks` streamed), with LangGraph's in-memory saver;
- **graph, checkpoints in Postgres**: the same with the app's saver and `async` durability, i.e.
  the graph part of a real turn.

CPU is `time.process_time()` (every thread of the process, so the embedding's worker thread
counts) and `time.thread_time()` of the event-loop thread, which is what bounds how many turns
one worker can run. The variants are interleaved for ROUNDS rounds so that a busy neighbour on a
shared machine shifts them alike; medians are printed with the range.

    .venv/bin/python -m bench.turn_cpu [--turns N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop
from langchain_core.runnables import RunnableConfig
from langgraph.types import StreamMode

from graphs.core.persistence import (
    Persistence,
    make_pool,
    open_persistence,
    start_embedded_postgres,
)
from graphs.core.settings import Settings

RESULTS = Path(__file__).parent / "results" / "turn_cpu.json"
WARMUP_TURNS = 10
STREAM_MODES: list[StreamMode] = ["updates", "messages", "tasks"]
"""As the runner streams an Assistant turn (ui.runner: "updates" plus the spec's modes)."""


@dataclass(frozen=True)
class Sample:
    process_ms: float
    loop_ms: float
    wall_ms: float


Turn = Callable[[int], Awaitable[None]]


async def _measure(turn: Turn, turns: range) -> Sample:
    process, loop, wall = time.process_time(), time.thread_time(), time.perf_counter()
    for i in turns:
        await turn(i)
    n = len(turns)
    return Sample(
        process_ms=1000 * (time.process_time() - process) / n,
        loop_ms=1000 * (time.thread_time() - loop) / n,
        wall_ms=1000 * (time.perf_counter() - wall) / n,
    )


LONG_REPLY_WORDS = 300
"""A real model's reply streams a few hundred tokens; the offline echo streams seven words."""


def _long_replies() -> Any:
    from graphs.assistant.offline import OfflineAssistant
    from graphs.core.offline import Turn as ModelTurn
    from graphs.core.offline import say

    class LongReplies(OfflineAssistant):
        def respond(self, turn: ModelTurn) -> Any:
            return say(" ".join(f"word{i}" for i in range(LONG_REPLY_WORDS)))

    return LongReplies()


def _graph_turn(p: Persistence, checkpointer: Any, label: str, model: Any = None) -> Turn:
    from langchain_core.messages import HumanMessage

    from graphs.assistant.graph import build_graph
    from graphs.assistant.offline import offline_assistant
    from graphs.core.context import Context
    from graphs.core.runs import DURABILITY

    graph = build_graph(
        checkpointer=checkpointer, store=p.store, model=model or offline_assistant()
    )
    thread_id = f"bench-cpu-{label}-{uuid.uuid4()}"
    context = Context(user_id=f"bench:cpu-{label}", thread_id=thread_id)
    config: RunnableConfig = {"configurable": {"thread_id": thread_id}, "recursion_limit": 25}
    prefetch = p.embedding.embeddings.prefetch  # type: ignore[attr-defined]

    async def turn(i: int) -> None:
        text = f"benchmark {label} turn {i}: what should I plan for this weekend?"
        prefetch(text)  # as ui.chat does when the message arrives
        async for _ in graph.astream(
            {"messages": [HumanMessage(text)]},
            config,
            context=context,
            stream_mode=STREAM_MODES,
            durability=DURABILITY,
        ):
            pass

    return turn


def _embedding_turn(p: Persistence) -> Turn:
    embeddings = p.embedding.embeddings

    async def turn(i: int) -> None:
        await embeddings.aembed_query(f"benchmark embedding turn {i}: what should I plan?")

    return turn


async def measure(p: Persistence, turns: int, rounds: int) -> dict[str, list[Sample]]:
    from langgraph.checkpoint.memory import InMemorySaver

    variants = {
        "query embedding": _embedding_turn(p),
        "graph, checkpoints in memory": _graph_turn(p, InMemorySaver(), "memory"),
        "graph, checkpoints in Postgres": _graph_turn(p, p.checkpointer, "postgres"),
        f"same, {LONG_REPLY_WORDS}-word reply": _graph_turn(
            p, p.checkpointer, "long", _long_replies()
        ),
    }
    for turn in variants.values():
        await _measure(turn, range(WARMUP_TURNS))
    samples: dict[str, list[Sample]] = {name: [] for name in variants}
    for r in range(rounds):
        start = WARMUP_TURNS + r * turns
        for name, turn in variants.items():
            samples[name].append(await _measure(turn, range(start, start + turns)))
    return samples


def _summary(samples: list[Sample]) -> dict[str, float]:
    def med(values: list[float]) -> float:
        return round(statistics.median(values), 2)

    process = [s.process_ms for s in samples]
    return {
        "process_cpu_ms": med(process),
        "process_cpu_ms_min": round(min(process), 2),
        "process_cpu_ms_max": round(max(process), 2),
        "loop_cpu_ms": med([s.loop_ms for s in samples]),
        "wall_ms": med([s.wall_ms for s in samples]),
    }


def render(summary: dict[str, dict[str, float]], turns: int, rounds: int) -> str:
    lines = [
        f"CPU per Assistant turn below Chainlit ({rounds} interleaved rounds x {turns} turns; "
        "median, [min-max] of the rounds)",
        f"  {'part':34s} {'CPU, all threads':>24s} {'event-loop thread':>18s} {'wall':>8s}",
    ]
    for name, s in summary.items():
        spread = f"[{s['process_cpu_ms_min']:.1f}-{s['process_cpu_ms_max']:.1f}]"
        lines.append(
            f"  {name:34s} {s['process_cpu_ms']:8.2f} ms {spread:>13s} "
            f"{s['loop_cpu_ms']:15.2f} ms {s['wall_ms']:6.2f} ms"
        )
    pg, mem = summary["graph, checkpoints in Postgres"], summary["graph, checkpoints in memory"]
    emb = summary["query embedding"]
    long = summary[f"same, {LONG_REPLY_WORDS}-word reply"]
    per_token = (long["process_cpu_ms"] - pg["process_cpu_ms"]) / (LONG_REPLY_WORDS - 7) * 1000
    lines += [
        f"  Each streamed token costs the graph {per_token:.0f} us of CPU (the long reply against "
        "the seven-word echo).",
        f"  Postgres checkpoints add {pg['process_cpu_ms'] - mem['process_cpu_ms']:.2f} ms; the graph "
        f"without its query embedding is {pg['process_cpu_ms'] - emb['process_cpu_ms']:.2f} ms.",
        "  A whole turn adds Chainlit (bench.ttft's bare handler), ownership, the run lock and the",
        "  steps to the Postgres line.",
    ]
    return "\n".join(lines)


async def main(turns: int, rounds: int) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="cairn-bench-") as folder:
        os.chmod(folder, 0o755)  # the embedded Postgres may run as another user
        url = os.environ.get("CAIRN_DATABASE_URL") or ""
        url = url or await asyncio.to_thread(start_embedded_postgres, Path(folder), throwaway=True)
        p = await open_persistence(Settings(data_dir=Path(folder)), pool=make_pool(url, max_size=8))
        try:
            await p.embedding.embeddings.warm_up()  # type: ignore[attr-defined]
            samples = await measure(p, turns, rounds)
        finally:
            await p.close()
    return {name: _summary(s) for name, s in samples.items()}


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    summary = uvloop.run(main(args.turns, args.rounds))
    print(render(summary, args.turns, args.rounds))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps({"turns": args.turns, "rounds": args.rounds, **summary}, indent=2)
    )


if __name__ == "__main__":
    cli()
