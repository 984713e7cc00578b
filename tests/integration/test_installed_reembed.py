"""The re-embedding gate runs in an installed Cairn, where evals/ does not exist."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import create_database
from tests.installed import build_wheel, install, run_installed

pytestmark = pytest.mark.integration

# Two deterministic stand-in models (no meaning, different dimensions): the gate's figures.
GATE = """
import asyncio, hashlib, json, random, tempfile
from pathlib import Path
from langchain_core.embeddings import Embeddings
from graphs.core.embeddings import EmbeddingSpec, Vector
from graphs.core.settings import Settings
from graphs.memory.reembed import compare

class StandIn(Embeddings):
    def __init__(self, dims): self.dims = dims
    def embed_documents(self, texts): return [self.embed_query(t) for t in texts]
    def embed_query(self, text):
        rng = random.Random(hashlib.sha256(text.encode()).digest())
        return Vector(rng.gauss(0, 1) for _ in range(self.dims))

settings = Settings(_env_file=None, data_dir=Path(tempfile.mkdtemp()))
old = EmbeddingSpec("test:old", 48, StandIn(48))
new = EmbeddingSpec("test:new", 32, StandIn(32))
print(json.dumps(asyncio.run(compare(settings, old, new, database=DATABASE))))
"""


def test_the_eval_gate_runs_from_the_installed_package(pg_server_url: str, tmp_path: Path) -> None:
    site = install(build_wheel(tmp_path / "build"), tmp_path / "site")
    database = create_database(pg_server_url)
    gate = run_installed(site, GATE.replace("DATABASE", repr(database)))
    assert gate.returncode == 0, gate.stderr
    current, new = json.loads(gate.stdout.splitlines()[-1])
    assert current["expected"] == new["expected"] > 0
    assert {"precision", "recall", "f1"} <= current.keys()
