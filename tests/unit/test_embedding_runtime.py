"""The local embedding model on onnxruntime: same vectors as PyTorch, cached, with a fallback."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from graphs.core import onnx_minilm
from graphs.core.embeddings import LocalMiniLM, Vector
from graphs.core.persistence import _VectorDumper

SENTENCES = [
    "I'm vegetarian",
    "My manager is Priya and I moved from Pune to Bengaluru last spring.",
    "what should I cook for dinner tonight",
    "",
    "naïve café — 東京 🚀",
    "word " * 400,  # longer than the model's 256 tokens: truncated the same way
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh export into an empty cache (not the machine's shared one)."""
    folder = tmp_path_factory.mktemp("model-cache")
    LocalMiniLM(runtime="onnx", cache_dir=folder, threads=1).embed_query("warm up")
    return folder


def test_the_export_is_cached_under_a_name_tied_to_the_weights_and_runtime(exported: Path) -> None:
    (model,) = exported.glob("*.onnx")
    assert model == onnx_minilm.cache_file(exported)
    assert not list(exported.glob(".export-*"))  # the temporary folder is gone


def test_onnx_vectors_match_pytorch(exported: Path) -> None:
    onnx = LocalMiniLM(runtime="onnx", cache_dir=exported, threads=2)
    torch = LocalMiniLM(runtime="torch")

    got, expected = onnx.embed_documents(SENTENCES), torch.embed_documents(SENTENCES)

    assert (onnx.runtime, torch.runtime) == ("onnx", "torch")
    difference = np.abs(np.array(got) - np.array(expected)).max()
    assert difference < onnx_minilm.MAX_PARITY_ERROR
    assert all(len(v) == 384 for v in got)
    assert np.allclose(np.linalg.norm(np.array(got), axis=1), 1.0, atol=1e-5)


def test_one_query_alone_or_in_a_padded_batch_gets_the_same_vector(exported: Path) -> None:
    model = LocalMiniLM(runtime="onnx", cache_dir=exported)

    alone = model.embed_query("I'm vegetarian")
    in_batch = model.embed_documents(["I'm vegetarian", "a much longer sentence " * 10])[0]

    assert np.abs(np.array(alone) - np.array(in_batch)).max() < 1e-5


def test_a_failed_export_falls_back_to_pytorch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(path: Path) -> None:
        raise RuntimeError("exported embedding model differs from PyTorch by 1.0e-01")

    monkeypatch.setattr(onnx_minilm, "export", broken)
    model = LocalMiniLM(runtime="onnx", cache_dir=tmp_path)

    vector = model.embed_query("still works")

    assert model.runtime == "torch"
    assert len(vector) == 384
    assert not list(tmp_path.glob("*.onnx"))


def test_vectors_go_to_postgres_in_pgvectors_binary_format() -> None:
    vector = Vector([0.5, -1.25, 3.0])

    data = _VectorDumper(Vector).dump(vector)

    assert data == struct.pack(">HH3f", 3, 0, 0.5, -1.25, 3.0)
