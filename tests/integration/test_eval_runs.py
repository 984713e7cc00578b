"""The memory eval (`make eval`) end to end: forgotten facts stay gone, recall does not regress."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals.memory import amain
from tests.conftest import create_database

pytestmark = pytest.mark.integration

RECALL_FLOOR = 0.83
"""Recall on the tuning split at the recall defaults with local MiniLM measured 0.860 (74 of 86
expected memories); the floor leaves room for two borderline scores to flip. Before issue 15
(the before-figures) it was 0.558."""


async def test_the_memory_eval_never_brings_a_forgotten_fact_back(
    pg_server_url: str, tmp_path: Path
) -> None:
    results = tmp_path / "memory.json"
    argv = ["--database-url", create_database(pg_server_url), "--model", "offline"]

    status = await amain([*argv, "--results", str(results)])

    figures = json.loads(results.read_text())
    came_back = figures["forgotten_came_back"]
    assert came_back["total"] == 0, came_back
    assert status == 0
    assert figures["retrieval"]["defaults"]["recall"] >= RECALL_FLOOR
    assert figures["retrieval"]["defaults"]["recall"] > figures["retrieval"]["before"]["recall"]
    assert figures["retrieval_heldout"]["split"] == "held-out v1"
    heldout = figures["retrieval_heldout2"]
    assert heldout["split"] == "held-out v2"
    assert heldout["sweep"] == []  # never tuned on
    assert heldout["misses_at_defaults"] == []  # counted, never listed
    assert heldout["defaults"]["noisy_empty_queries"] == 0
