"""What the wipe's cut-off check (graphs.core.fence) costs a write: a two-node graph run with
its checkpoints, a thread claim and a memory put, with and without a user's authority.

`python -m bench.fence` (embedded Postgres in a throwaway folder; prints medians in ms).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

from auth.ownership import claim_thread
from graphs.core import fence
from graphs.core.persistence import make_pool, open_persistence, start_embedded_postgres
from graphs.core.settings import Settings

ROUNDS = 200


class Steps(TypedDict):
    done: list[str]


async def first(state: Steps) -> Steps:
    return {"done": [*state["done"], "a"]}


async def second(state: Steps) -> Steps:
    return {"done": [*state["done"], "b"]}


async def timed(work: Any) -> float:
    started = time.perf_counter()
    await work
    return (time.perf_counter() - started) * 1000


async def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="cairn-bench-fence-"))
    url = await asyncio.to_thread(start_embedded_postgres, folder, throwaway=True)
    db = await open_persistence(Settings(data_dir=folder), pool=make_pool(url))
    builder = StateGraph(Steps)
    builder.add_node(first)
    builder.add_node(second)
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    builder.add_edge("second", END)
    graph = builder.compile(checkpointer=db.checkpointer)
    results: dict[str, dict[str, list[float]]] = {}
    try:
        for fenced in (False, True, False, True):  # interleaved, so drift hits both alike
            label = "fenced" if fenced else "plain"
            runs = results.setdefault(label, {"run": [], "claim": [], "put": []})
            for _ in range(ROUNDS // 2):
                user, thread = f"user-{uuid.uuid4()}", f"thread-{uuid.uuid4()}"
                authority = fence.Fence.now(user)
                with fence.acting_for(authority) if fenced else _nothing():
                    runs["claim"].append(
                        await timed(
                            claim_thread(db.pool, thread_id=thread, user_id=user, agent="a")
                        )
                    )
                    runs["run"].append(
                        await timed(
                            graph.ainvoke(
                                {"done": []},
                                {"configurable": {"thread_id": thread}},
                                durability="sync",
                            )
                        )
                    )
                    runs["put"].append(
                        await timed(db.store.aput((user, "bench"), "k", {"v": 1}, index=False))
                    )
    finally:
        await db.close()
    for label, runs in results.items():
        medians = ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in runs.items())
        print(f"{label:7s} median ms: {medians}")


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    asyncio.run(main())
