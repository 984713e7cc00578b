"""A memory-job worker process for test_memory_jobs: it takes the queued job, then hangs in the
model call until the test kills it with SIGKILL, leaving the job `doing`.

    python -m tests.integration.stalled_job_worker DATABASE_URL
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

from langchain_core.runnables import Runnable, RunnableLambda

from graphs.core.embeddings import LOCAL_MODEL_DIMS, LOCAL_MODEL_NAME, EmbeddingSpec
from graphs.core.persistence import make_pool, open_persistence
from graphs.core.settings import Settings
from graphs.memory.jobs import MemoryJobs
from tests.integration.test_durable_runs import FixedEmbeddings


class HangingModel:
    """A memory-writer model that never answers."""

    def with_structured_output(self, schema: Any, **kwargs: Any) -> Runnable[Any, Any]:
        async def respond(_input: Any) -> Any:
            print("job taken", flush=True)
            await asyncio.Event().wait()

        return RunnableLambda(respond)


async def main(url: str) -> None:
    persistence = await open_persistence(
        Settings(data_dir=Path(tempfile.mkdtemp())),
        pool=make_pool(url, max_size=4),
        # Named as the store's model: this process never gets as far as embedding anything.
        embedding=EmbeddingSpec(f"local:{LOCAL_MODEL_NAME}", LOCAL_MODEL_DIMS, FixedEmbeddings()),
    )

    async def load_messages(_thread_id: str) -> list[Any]:
        return [("user", "I live in Kyoto")]

    jobs = MemoryJobs(
        pool=persistence.pool,
        store=persistence.store,
        model=HangingModel(),  # type: ignore[arg-type]
        load_messages=load_messages,
        idle_seconds=0.1,
        heartbeat_s=0.5,
    )
    await jobs.open()
    jobs.start_worker()
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
