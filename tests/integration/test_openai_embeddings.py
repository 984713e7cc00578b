"""CAIRN_EMBEDDING_PROVIDER=openai against a local server speaking /v1/embeddings, on a real store."""

from __future__ import annotations

import hashlib
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pydantic import SecretStr

from graphs.core.embeddings import (
    EmbeddingDimsMismatch,
    EmbeddingModelChanged,
    build_embeddings,
)
from graphs.core.persistence import make_pool, open_persistence
from graphs.core.settings import Settings
from graphs.memory.scoped import ScopedMemory
from tests.conftest import create_database

pytestmark = pytest.mark.integration


class FakeEmbeddingServer:
    """Answers /v1/embeddings with deterministic vectors and records every request."""

    def __init__(self) -> None:
        self.base_url = ""
        self.requests: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.size: int | None = None
        """Vector size returned; None: the size the request asked for."""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        self.requests.append((request.path, dict(request.headers), body))
        if request.path != "/v1/embeddings":
            return web.json_response({"error": {"message": "not found"}}, status=404)
        size = self.size or body.get("dimensions") or 8
        data = [
            {"object": "embedding", "index": i, "embedding": self._vector(text, size)}
            for i, text in enumerate(body["input"])
        ]
        usage = {"prompt_tokens": 3, "total_tokens": 3}
        return web.json_response(
            {"object": "list", "data": data, "model": body["model"], "usage": usage}
        )

    @staticmethod
    def _vector(text: str, size: int) -> list[float]:
        # Texts sharing words get similar vectors: a bag of hashed words.
        vector = [0.0] * size
        for word in str(text).lower().split():
            rng = random.Random(hashlib.sha256(word.encode()).digest())
            for i in range(size):
                vector[i] += rng.gauss(0, 1)
        return vector


@pytest.fixture
async def server(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeEmbeddingServer]:
    for name in ("NO_PROXY", "no_proxy"):  # a proxy configured on the host must not intercept
        monkeypatch.setenv(name, "127.0.0.1")
    fake = FakeEmbeddingServer()
    app = web.Application()
    app.router.add_route("*", "/{path:.*}", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    fake.base_url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    yield fake
    await runner.cleanup()


def _settings(server: FakeEmbeddingServer, tmp_path: Path, *, dims: int) -> Settings:
    return Settings(
        _env_file=None,
        data_dir=tmp_path,
        embedding_provider="openai",
        embedding_model="local-embed",
        embedding_dims=dims,
        embedding_base_url=server.base_url,
        embedding_api_key=SecretStr("sk-embed"),
        model_max_retries=0,
    )  # type: ignore[call-arg]


async def test_memories_are_embedded_by_the_server_and_its_dims_recorded(
    server: FakeEmbeddingServer, pg_server_url: str, tmp_path: Path
) -> None:
    url = create_database(pg_server_url)
    settings = _settings(server, tmp_path, dims=16)
    assert settings.offline  # the chat models stay offline; only embeddings use the server
    p = await open_persistence(settings, pool=make_pool(url, max_size=3))
    try:
        async with p.pool.connection() as conn:
            cur = await conn.execute("SELECT value FROM cairn_meta WHERE key = 'embedding'")
            assert (await cur.fetchone())["value"] == {"name": "openai:local-embed", "dims": 16}
        memory = ScopedMemory(p.store, "ana")
        for key, content in [("tea", "drinks green tea"), ("bike", "commutes by bike")]:
            await memory.put(
                key, content=content, category="other", source={}, confidence=1.0, stated=True
            )
        found = await memory.search("which tea should I buy", limit=1, threshold=0.1)
        assert [m.key for m in found] == ["tea"]
    finally:
        await p.close()

    embeddings = [body for path, _, body in server.requests if path == "/v1/embeddings"]
    assert embeddings
    for body in embeddings:
        assert body["model"] == "local-embed"
        assert body["dimensions"] == 16
        # Plain strings, as every OpenAI-compatible server takes them (not tiktoken ids).
        assert all(isinstance(text, str) for text in body["input"])
    headers = next(h for path, h, _ in server.requests if path == "/v1/embeddings")
    assert headers["Authorization"] == "Bearer sk-embed"

    # Started again with other dimensions: refused with the recorded model in the message.
    with pytest.raises(EmbeddingModelChanged, match=r"openai:local-embed \(16 dims\)"):
        await open_persistence(
            _settings(server, tmp_path, dims=32), pool=make_pool(url, max_size=2)
        )


async def test_a_server_returning_another_size_is_a_clear_error(
    server: FakeEmbeddingServer, pg_server_url: str, tmp_path: Path
) -> None:
    url = create_database(pg_server_url)
    p = await open_persistence(
        _settings(server, tmp_path, dims=16), pool=make_pool(url, max_size=3)
    )
    try:
        server.size = 12  # a server that ignores `dimensions`
        memory = ScopedMemory(p.store, "ana")
        with pytest.raises(EmbeddingDimsMismatch, match=r"12-dimension vectors.*16 dimensions"):
            await memory.put(
                "tea", content="drinks green tea", category="other", source={}, confidence=1.0,
                stated=True,
            )  # fmt: skip
        assert await memory.get("tea") is None  # nothing stored half-way
        with pytest.raises(EmbeddingDimsMismatch):
            await memory.search("tea", limit=1, threshold=0.1)
    finally:
        await p.close()


def test_the_server_key_falls_back_to_the_chat_key(tmp_path: Path) -> None:
    settings = Settings(
        _env_file=None,
        data_dir=tmp_path,
        embedding_provider="openai",
        openai_api_key=SecretStr("sk-chat"),
    )  # type: ignore[call-arg]
    spec = build_embeddings(settings)
    assert (spec.name, spec.dims) == ("openai:text-embedding-3-small", 1536)
    without = Settings(_env_file=None, data_dir=tmp_path, embedding_provider="openai")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="CAIRN_EMBEDDING_API_KEY or OPENAI_API_KEY"):
        build_embeddings(without)


async def test_the_command_stops_on_ctrl_c_and_resumes(
    server: FakeEmbeddingServer, pg_server_url: str, tmp_path: Path
) -> None:
    """`python -m graphs.memory.reembed run` from the local model to the server's, interrupted."""
    import asyncio
    import os
    import signal
    import sys

    from graphs.core.embeddings import (
        LOCAL_MODEL_DIMS,
        LOCAL_MODEL_NAME,
        EmbeddingSpec,
        LocalMiniLM,
    )

    url = create_database(pg_server_url)
    local = EmbeddingSpec(f"local:{LOCAL_MODEL_NAME}", LOCAL_MODEL_DIMS, LocalMiniLM())
    p = await open_persistence(
        Settings(_env_file=None, data_dir=tmp_path),  # type: ignore[call-arg]
        pool=make_pool(url, max_size=2),
        embedding=local,
    )
    try:
        for i in range(30):
            await ScopedMemory(p.store, f"user{i % 3}").put(
                f"fact{i:02d}", content=f"likes thing number {i}", category="other",
                source={}, confidence=1.0, stated=True,
            )  # fmt: skip
    finally:
        await p.close()
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "CAIRN_DATABASE_URL": url,
        "CAIRN_DATA_DIR": str(tmp_path),
        "CAIRN_EMBEDDING_BASE_URL": server.base_url,
        "CAIRN_EMBEDDING_API_KEY": "sk-embed",
    }
    command = [sys.executable, "-m", "graphs.memory.reembed", "run", "--provider", "openai",
               "--model", "local-embed", "--dims", "16", "--batch-size", "2"]  # fmt: skip

    first = await asyncio.create_subprocess_exec(
        *command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    assert first.stdout is not None
    seen = []
    while line := (await first.stdout.readline()).decode():
        seen.append(line)
        if line.strip().startswith("copying:"):
            first.send_signal(signal.SIGINT)
            break
    rest, _ = await first.communicate()
    output = "".join(seen) + rest.decode()
    assert first.returncode == 130, output
    assert "Stopped: copying:" in output
    assert "Run the same command again to resume" in output

    second = await asyncio.create_subprocess_exec(
        *command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await second.communicate()
    output = out.decode()
    assert second.returncode in (0, 1), output  # ready or refused by the eval: both finished
    assert "Backfilled: backfilled: 30/30 items (100%): 30 re-embedded" in output
    assert "recall eval, new model" in output
