"""Re-embedding figures: backfill throughput, a put's cost while writes go to both indexes, start-up.

`python -m bench.reembed [ITEMS]`: a throwaway embedded Postgres, ITEMS facts (default 2,000)
stored under a stand-in embedding, re-embedded into the local MiniLM index.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from langchain_core.embeddings import Embeddings

from graphs.core.embeddings import EmbeddingSpec, Vector, check_embedding_record, local_embeddings
from graphs.core.persistence import make_pool, open_persistence, start_embedded_postgres
from graphs.core.settings import Settings
from graphs.memory import reembed
from graphs.memory.scoped import ScopedMemory

PUTS = 100


class StandIn(Embeddings):
    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self.embed_query(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        rng = random.Random(hashlib.sha256(text.encode()).digest())
        return Vector(rng.gauss(0, 1) for _ in range(48))


async def put_ms(store: object, label: str) -> float:
    memory = ScopedMemory(store, f"bench-{label}")  # type: ignore[arg-type]
    times = []
    for i in range(PUTS):
        started = time.perf_counter()
        await memory.put(
            f"fact{i}",
            content=f"User likes hobby number {i} on {label} days",
            category="other",
            source={},
            confidence=1.0,
            stated=True,
        )
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def main(items: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="cairn-bench-reembed-"))
    os.chmod(folder, 0o755)  # the embedded server runs as another user
    url = await asyncio.to_thread(start_embedded_postgres, folder, throwaway=True)
    settings = Settings(_env_file=None, data_dir=folder)  # type: ignore[call-arg]
    stand_in = EmbeddingSpec("bench:stand-in", 48, StandIn())
    minilm = local_embeddings(settings)
    await asyncio.to_thread(minilm.embeddings.embed_query, "warm up")
    p = await open_persistence(
        settings,
        pool=make_pool(url, max_size=4),
        embedding=stand_in,
        other_embedding=lambda *_: minilm,
    )
    for i in range(items):
        await ScopedMemory(p.store, f"user{i % 100}").put(
            f"fact{i}",
            content=f"User's fact number {i}: likes {random.choice(['tea', 'trains', 'chess'])}",
            category="other",
            source={},
            confidence=1.0,
            stated=True,
        )
    startup = []
    for _ in range(50):
        started = time.perf_counter()
        await check_embedding_record(p.pool, stand_in)
        startup.append((time.perf_counter() - started) * 1000)
    single = await put_ms(p.store, "single")
    await reembed.begin(p.pool, stand_in, minilm)
    await p.close()
    p = await open_persistence(
        settings,
        pool=make_pool(url, max_size=4),
        embedding=stand_in,
        other_embedding=lambda *_: minilm,
    )
    both = await put_ms(p.store, "both")
    started = time.perf_counter()
    done = await reembed.backfill(p.pool, minilm)
    seconds = time.perf_counter() - started
    await p.close()
    print(
        f"embedding record check at start-up: {statistics.median(startup):.2f} ms p50 (unchanged path)"
    )
    print(
        f"memory put, one index: {single:.1f} ms p50; writing both (MiniLM mirror): {both:.1f} ms p50"
    )
    print(
        f"backfill of {done.total} items into MiniLM: {seconds:.1f} s, "
        f"{done.total / seconds:.0f} items/s (batch {reembed.BATCH_SIZE})"
    )


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 2_000))
