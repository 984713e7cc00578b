"""Re-embedding the store with another model on a real Postgres: stand-in -> MiniLM, end to end.

Deletes and forgets land between backfill batches and inside one (while it is embedded); the
backfill is stopped and resumed; the recall eval gates the switch; retiring leaves a database
that starts like a fresh install.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from langchain_core.embeddings import Embeddings

from graphs.core.embeddings import (
    DEFAULT_TABLE,
    EmbeddingModelChanged,
    EmbeddingSpec,
    Vector,
    VectorIndex,
    VectorPlan,
    vectors_table_for,
)
from graphs.core.persistence import Persistence, make_pool, open_persistence, open_store
from graphs.core.settings import Settings
from graphs.memory import reembed
from graphs.memory.manage import forget_key
from graphs.memory.scoped import FACTS, ROOT, TOMBSTONES, ScopedMemory, user_label
from tests.conftest import create_database

pytestmark = pytest.mark.integration

STAND_IN_DIMS = 48


class StandIn(Embeddings):
    """Deterministic vectors from a hash of the text: no meaning at all, another dimension."""

    def __init__(self, dims: int = STAND_IN_DIMS) -> None:
        self.dims = dims

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self._vector(text) for text in texts]

    def embed_query(self, text: str) -> list[float]:
        return self._vector(text)

    def _vector(self, text: str) -> list[float]:
        rng = random.Random(hashlib.sha256(text.encode()).digest())
        return Vector(rng.gauss(0, 1) for _ in range(self.dims))


class Interrupted(StandIn):
    """A stand-in whose next embedding call first lets `meanwhile` run: what lands while the
    model embeds a batch, between the batch's read and its write."""

    def __init__(self, dims: int) -> None:
        super().__init__(dims)
        self.meanwhile: Callable[[], Awaitable[None]] | None = None

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        if self.meanwhile is not None:
            meanwhile, self.meanwhile = self.meanwhile, None
            await meanwhile()
        return self.embed_documents(texts)


STAND_IN = EmbeddingSpec("test:hash-stand-in", STAND_IN_DIMS, StandIn())
SMALL_TARGET = EmbeddingSpec("test:hash-stand-in-32", 32, StandIn(dims=32))
"""Another deterministic model to re-embed into (other name and dimensions)."""

FACTS_BY_USER = {
    "ana": [
        ("lactose", "is lactose intolerant"),
        ("run", "is recovering from a knee injury"),
        ("kid", "has a daughter who loves dinosaurs"),
        ("tea", "drinks green tea in the morning"),
        ("bike", "commutes by bike"),
    ],
    "ben": [
        ("lang", "is learning Portuguese"),
        ("car", "drives an electric car"),
        ("cat", "has two cats"),
        ("job", "works night shifts at a hospital"),
        ("music", "plays the cello"),
    ],
    "cy": [
        ("garden", "grows tomatoes on the balcony"),
        ("allergy", "is allergic to peanuts"),
        ("book", "reads science fiction"),
        ("travel", "prefers trains to planes"),
    ],
}


def settings(tmp_path: Path) -> Settings:
    return Settings(_env_file=None, data_dir=tmp_path)  # type: ignore[call-arg]


async def opened(
    url: str, tmp_path: Path, spec: EmbeddingSpec, other: EmbeddingSpec
) -> Persistence:
    return await open_persistence(
        settings(tmp_path),
        pool=make_pool(url, max_size=3),
        embedding=spec,
        other_embedding=lambda *_: other,
    )


async def put(store, user: str, key: str, content: str) -> None:
    await ScopedMemory(store, user).put(
        key, content=content, category="other", source={}, confidence=1.0, stated=True
    )


async def new_index_keys(p: Persistence, table: str) -> dict[tuple[str, str], list[float]]:
    async with p.pool.connection() as conn:
        cur = await conn.execute(f"SELECT prefix, key, embedding::text AS e FROM {table}")
        rows = await cur.fetchall()
    return {(r["prefix"], r["key"]): [float(x) for x in r["e"][1:-1].split(",")] for r in rows}


def prefix(user: str) -> str:
    return f"{ROOT}.{user_label(user)}.{FACTS}"


async def test_stand_in_to_minilm_end_to_end(
    pg_server_url: str, embedding: EmbeddingSpec, tmp_path: Path
) -> None:
    url = create_database(pg_server_url)
    minilm = embedding
    table = vectors_table_for(minilm.name, minilm.dims)

    # The app has run on the stand-in: its facts are in the store's own index.
    p = await opened(url, tmp_path, STAND_IN, minilm)
    for user, facts in FACTS_BY_USER.items():
        for key, content in facts:
            await put(p.store, user, key, content)
    # A forget record whose fact was never swept away: it must not be carried over.
    await p.store.aput(
        (ROOT, user_label("cy"), TOMBSTONES),
        "t1",
        {"key": "book", "fact": "reads science fiction", "at": "", "reason": "test"},
        index=False,
    )
    started = await reembed.begin(p.pool, STAND_IN, minilm)
    assert started.state == "copying"
    assert started.table == table
    await p.close()

    # A worker restarted after `begin` writes both indexes.
    p = await opened(url, tmp_path, STAND_IN, minilm)
    assert p.vectors is not None
    assert p.vectors.mirror is not None
    assert p.vectors.mirror.table == table

    # Configuring the new model before its index is ready refuses to start.
    with pytest.raises(EmbeddingModelChanged, match="not ready"):
        await opened(url, tmp_path, minilm, STAND_IN)

    stop = asyncio.Event()
    batches: list[reembed.Progress] = []

    async def meanwhile(now: reembed.Progress) -> None:
        batches.append(now)
        if len(batches) == 1:
            # Keys are copied in (prefix, key) order: ana's first, then ben's, then cy's.
            # A delete and a forget of items not copied yet, a delete of one already copied,
            # and a new fact written by the dual-writing worker.
            await ScopedMemory(p.store, "ben").delete("cat")
            ben = ScopedMemory(p.store, "ben")
            job = await ben.get("job")
            assert job is not None
            await ben.forget(job, reason="user asked")
            await ScopedMemory(p.store, "ana").delete("bike")
            # The dual-writing worker's new fact is in the new index at once.
            await put(p.store, "cy", "coffee", "takes coffee black")
            assert (prefix("cy"), "coffee") in await new_index_keys(p, table)
            # A worker not restarted since `begin` changes a fact already copied: only the
            # old index gets its new vector, and the catch-up pass must redo it.
            stale = open_store(p.pool, VectorPlan(VectorIndex(DEFAULT_TABLE, STAND_IN)))
            await put(stale, "ana", "kid", "has a daughter who loves horses")
            # A second backfill at the same time is refused, not run twice.
            with pytest.raises(reembed.ReembedError, match="another"):
                await reembed.backfill(p.pool, minilm)
        if len(batches) == 2:
            stop.set()  # as Ctrl-C does: the current batch is committed, then it stops

    stopped = await reembed.backfill(p.pool, minilm, batch_size=3, stop=stop, after_batch=meanwhile)
    assert stopped.state == "copying"
    assert 0 < stopped.copied < stopped.total
    # Resumed from its checkpoint: finishes; running it again changes nothing (idempotent).
    done = await reembed.backfill(p.pool, minilm, batch_size=3)
    assert done.state == "backfilled"
    again = await reembed.backfill(p.pool, minilm, batch_size=3)
    assert (again.copied, again.skipped, again.caught_up) == (
        done.copied,
        done.skipped,
        done.caught_up,
    )

    vectors = await new_index_keys(p, table)
    expected = {
        (prefix(user), key)
        for user, facts in FACTS_BY_USER.items()
        for key, _ in facts
        if (user, key) not in {("ben", "cat"), ("ben", "job"), ("ana", "bike"), ("cy", "book")}
    } | {(prefix("cy"), "coffee")}
    assert set(vectors) == expected
    assert done.skipped == 1  # the forgotten "book"
    assert done.caught_up >= 1
    assert vectors[(prefix("ana"), "kid")] == pytest.approx(
        minilm.embeddings.embed_query("has a daughter who loves horses"), abs=1e-5
    )
    # Each item under the same key, embedded by the new model.
    assert vectors[(prefix("ana"), "lactose")] == pytest.approx(
        minilm.embeddings.embed_query("is lactose intolerant"), abs=1e-5
    )

    # The recall eval on the new index (a scratch database) gates the switch.
    current, new = await reembed.compare(
        settings(tmp_path), STAND_IN, minilm, database=create_database(pg_server_url)
    )
    assert new["recall"] > current["recall"]
    assert await reembed.record_eval(p.pool, current, new) is True
    await p.close()

    # Reads switch by the setting: configured with MiniLM, a worker reads the new index ...
    p = await opened(url, tmp_path, minilm, STAND_IN)
    assert p.vectors is not None
    assert p.vectors.read.table == table
    ana = ScopedMemory(p.store, "ana")
    found = await ana.search(
        "what should I cook for dinner, something with milk?", limit=2, threshold=0.2
    )
    assert found[0].key == "lactose"
    # ... and still writes the old one, so switching back is a restart.
    await put(p.store, "ana", "bike", "commutes by bike again")
    async with p.pool.connection() as conn:
        cur = await conn.execute(f"SELECT count(*) AS n FROM {DEFAULT_TABLE} WHERE key = 'bike'")
        assert (await cur.fetchone())["n"] == 1

    # Retired: the new index is the store's own, the database as a fresh install with MiniLM.
    retired = await reembed.retire(p.pool)
    assert retired.state == "retired"
    await p.close()
    p = await opened(url, tmp_path, minilm, STAND_IN)
    try:
        assert p.vectors is not None
        assert p.vectors.mirror is None
        assert p.vectors.read.table == DEFAULT_TABLE
        found = await ScopedMemory(p.store, "ben").search(
            "which instrument do I practise?", limit=1, threshold=0.2
        )
        assert [m.key for m in found] == ["music"]
        assert await ScopedMemory(p.store, "ben").get("job") is None
        with pytest.raises(EmbeddingModelChanged):
            await opened(url, tmp_path, STAND_IN, minilm)
    finally:
        await p.close()


async def test_a_new_index_scoring_worse_is_refused(
    pg_server_url: str, embedding: EmbeddingSpec, tmp_path: Path
) -> None:
    url = create_database(pg_server_url)
    p = await opened(url, tmp_path, embedding, STAND_IN)
    try:
        for key, content in FACTS_BY_USER["ana"]:
            await put(p.store, "ana", key, content)
        await reembed.begin(p.pool, embedding, STAND_IN)
        done = await reembed.backfill(p.pool, STAND_IN)
        assert done.copied == len(FACTS_BY_USER["ana"])
        current, new = await reembed.compare(
            settings(tmp_path), embedding, STAND_IN, database=create_database(pg_server_url)
        )
        assert await reembed.record_eval(p.pool, current, new) is False
        assert (await reembed.progress(p.pool)).state == "refused"
        with pytest.raises(EmbeddingModelChanged, match="not ready"):
            await opened(url, tmp_path, STAND_IN, embedding)
        with pytest.raises(reembed.ReembedError):
            await reembed.retire(p.pool)
        abandoned = await reembed.abandon(p.pool, configured=embedding)
        assert abandoned.state == "abandoned"
    finally:
        await p.close()
    p = await opened(url, tmp_path, embedding, STAND_IN)
    try:
        assert p.vectors is not None
        assert p.vectors.mirror is None
    finally:
        await p.close()


async def test_a_delete_and_a_forget_landing_while_a_batch_is_embedded_win(
    pg_server_url: str, tmp_path: Path
) -> None:
    url = create_database(pg_server_url)
    model = Interrupted(dims=32)
    target = EmbeddingSpec("test:interrupted-stand-in", 32, model)
    p = await opened(url, tmp_path, STAND_IN, target)
    for user, facts in FACTS_BY_USER.items():
        for key, content in facts:
            await put(p.store, user, key, content)
    await reembed.begin(p.pool, STAND_IN, target)
    await p.close()
    p = await opened(url, tmp_path, STAND_IN, target)  # a worker writing both indexes
    try:
        ana = ScopedMemory(p.store, "ana")

        async def meanwhile() -> None:
            # The first batch is ana's first three keys: bike, kid, lactose. Read, and now
            # being embedded: one is deleted, one forgotten on the memory page.
            await ana.delete("bike")
            await forget_key(ana, "kid")

        model.meanwhile = meanwhile
        stop = asyncio.Event()

        async def first_batch_only(_now: reembed.Progress) -> None:
            stop.set()

        stopped = await reembed.backfill(
            p.pool, target, batch_size=3, stop=stop, after_batch=first_batch_only
        )
        assert model.meanwhile is None  # it ran, inside the first batch
        assert (stopped.state, stopped.copied) == ("copying", 1)  # lactose alone
        done = await reembed.backfill(p.pool, target, batch_size=3)
        assert done.state == "backfilled"
        again = await reembed.backfill(p.pool, target, batch_size=3)
        assert (again.state, again.copied, again.skipped, again.caught_up) == (
            done.state,
            done.copied,
            done.skipped,
            done.caught_up,
        )

        vectors = await new_index_keys(p, vectors_table_for(target.name, target.dims))
        expected = {
            (prefix(user), key)
            for user, facts in FACTS_BY_USER.items()
            for key, _ in facts
            if (user, key) not in {("ana", "bike"), ("ana", "kid")}
        }
        assert set(vectors) == expected
        assert await ana.get("bike") is None
        assert await ana.get("kid") is None
    finally:
        await p.close()


async def test_progress_counts_live_items_and_reaches_all_of_them(
    pg_server_url: str, tmp_path: Path
) -> None:
    url = create_database(pg_server_url)
    model = Interrupted(dims=32)
    target = EmbeddingSpec("test:progress-stand-in", 32, model)
    p = await opened(url, tmp_path, STAND_IN, target)
    for user, facts in FACTS_BY_USER.items():
        for key, content in facts:
            await put(p.store, user, key, content)
    await reembed.begin(p.pool, STAND_IN, target)
    await p.close()
    p = await opened(url, tmp_path, STAND_IN, target)
    table = vectors_table_for(target.name, target.dims)
    ana = ScopedMemory(p.store, "ana")
    try:

        async def inside_the_first_batch() -> None:
            await ana.delete("bike")  # read by the first batch, gone before it is written

        model.meanwhile = inside_the_first_batch
        stop = asyncio.Event()
        seen: list[reembed.Progress] = []

        async def between_batches(now: reembed.Progress) -> None:
            seen.append(now)
            if len(seen) == 1:
                copied = await new_index_keys(p, table)
                ahead = sorted(
                    (user, key)
                    for user, facts in FACTS_BY_USER.items()
                    for key, _ in facts
                    if (prefix(user), key) not in copied and (user, key) != ("ana", "bike")
                )
                for user, key in ahead[-2:]:  # two not reached yet
                    await ScopedMemory(p.store, user).delete(key)
                await ana.delete(next(k for (_, k) in copied if k != "bike"))  # one copied
                stop.set()

        stopped = await reembed.backfill(
            p.pool, target, batch_size=3, stop=stop, after_batch=between_batches
        )
        assert (stopped.copied, stopped.total) == (2, 13)  # bike is no longer waited for
        done = await reembed.backfill(p.pool, target, batch_size=3)
        assert done.state == "backfilled"
        live_copied = 14 - 1 - 2  # all but bike and the two deleted before they were reached
        assert (done.copied, done.skipped, done.total) == (live_copied, 0, live_copied)
        assert f"{live_copied}/{live_copied} items (100%)" in done.line()
    finally:
        await p.close()


PASSING = {"precision": 0.9, "recall": 0.9}


async def test_the_new_index_is_not_ready_while_it_misses_a_live_item(
    pg_server_url: str, tmp_path: Path
) -> None:
    url = create_database(pg_server_url)
    target = SMALL_TARGET
    table = vectors_table_for(target.name, target.dims)
    p = await opened(url, tmp_path, STAND_IN, target)
    try:
        for key, content in FACTS_BY_USER["cy"]:
            await put(p.store, "cy", key, content)
        # Forgotten, not swept yet: never carried over, and not missing either.
        await p.store.aput(
            (ROOT, user_label("cy"), TOMBSTONES),
            "t1",
            {"key": "book", "fact": "reads science fiction", "at": "", "reason": "test"},
            index=False,
        )
        await reembed.begin(p.pool, STAND_IN, target)
        assert (await reembed.backfill(p.pool, target)).state == "backfilled"
        # A worker not restarted since `begin` writes only the old index: a new fact, and a
        # changed one whose new vector is now out of date.
        stale = open_store(p.pool, VectorPlan(VectorIndex(DEFAULT_TABLE, STAND_IN)))
        await put(stale, "cy", "coffee", "takes coffee black")
        await put(stale, "cy", "travel", "prefers night trains to planes")

        with pytest.raises(reembed.ReembedError, match=r"2 live item\(s\).*run` again"):
            await reembed.record_eval(p.pool, PASSING, PASSING)
        assert (await reembed.progress(p.pool)).state == "backfilled"
        with pytest.raises(EmbeddingModelChanged, match="not ready"):
            await opened(url, tmp_path, target, STAND_IN)

        await reembed.backfill(p.pool, target)  # what `run` again does: catches them up
        assert await reembed.record_eval(p.pool, PASSING, PASSING) is True
        assert (await reembed.progress(p.pool)).state == "ready"
        vectors = await new_index_keys(p, table)
        assert (prefix("cy"), "book") not in vectors
        assert vectors[(prefix("cy"), "travel")] == pytest.approx(
            target.embeddings.embed_query("prefers night trains to planes"), abs=1e-5
        )
    finally:
        await p.close()


async def test_abandoning_is_refused_once_reads_have_switched(
    pg_server_url: str, tmp_path: Path
) -> None:
    url = create_database(pg_server_url)
    target = SMALL_TARGET
    table = vectors_table_for(target.name, target.dims)
    p = await opened(url, tmp_path, STAND_IN, target)
    try:
        for key, content in FACTS_BY_USER["ben"]:
            await put(p.store, "ben", key, content)
        await reembed.begin(p.pool, STAND_IN, target)
        await reembed.backfill(p.pool, target)
        assert await reembed.record_eval(p.pool, PASSING, PASSING) is True
    finally:
        await p.close()

    # Workers configured with the new model now read the new index.
    switched = await opened(url, tmp_path, target, STAND_IN)
    try:
        assert switched.vectors is not None
        assert switched.vectors.read.table == table
        with pytest.raises(reembed.ReembedError, match=r"switched.*test:hash-stand-in again"):
            await reembed.abandon(switched.pool, configured=target)
        assert (await reembed.progress(switched.pool)).state == "ready"
        found = await ScopedMemory(switched.store, "ben").search("cello", limit=5, threshold=-1)
        assert "music" in [m.key for m in found]  # its index is still there
        # Configured back with the current model (and restarted): abandoning is allowed.
        abandoned = await reembed.abandon(switched.pool, configured=STAND_IN)
        assert abandoned.state == "abandoned"
    finally:
        await switched.close()
