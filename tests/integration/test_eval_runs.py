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
HELDOUT_V1_FLOOR = 0.83
"""Held-out v1 (tuned on since issue 15's second pass) measured 0.852 (46 of 54)."""


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
    assert figures["retrieval"]["defaults"]["noisy_empty_queries"] == 0
    v1 = figures["retrieval_heldout"]
    assert v1["split"] == "held-out v1"
    assert v1["defaults"]["recall"] >= HELDOUT_V1_FLOOR
    assert v1["defaults"]["noisy_empty_queries"] == 0
    # Held-out v2 is reported, never tuned on: no floor here, or the floor would tune it.
    v2 = figures["retrieval_heldout2"]
    assert v2["split"] == "held-out v2"
    assert v2["sweep"] == []
    assert v2["misses_at_defaults"] == []  # counted, never listed
    assert v2["queries"] == 79
