"""Re-embedding pieces that need no database: the eval gate, the new index's name, checked vectors."""

from __future__ import annotations

import re

import pytest
from langchain_core.embeddings import Embeddings

from graphs.core.embeddings import (
    DEFAULT_TABLE,
    CheckedEmbeddings,
    EmbeddingDimsMismatch,
    Vector,
    vectors_table_for,
)
from graphs.core.store import vector_texts
from graphs.memory.reembed import verdict


def test_reads_switch_only_to_an_index_that_recalls_at_least_as_well() -> None:
    current = {"precision": 0.80, "recall": 0.60}
    assert verdict(current, {"precision": 0.80, "recall": 0.60})
    assert verdict(current, {"precision": 0.90, "recall": 0.70})
    assert not verdict(current, {"precision": 0.79, "recall": 0.90})
    assert not verdict(current, {"precision": 0.95, "recall": 0.59})


def test_each_model_gets_its_own_table_with_a_safe_name() -> None:
    names = {
        vectors_table_for("openai:text-embedding-3-small", 1536),
        vectors_table_for("openai:text-embedding-3-small", 512),
        vectors_table_for("local:sentence-transformers/all-MiniLM-L6-v2", 384),
    }
    assert len(names) == 3
    assert DEFAULT_TABLE not in names
    for name in names:
        assert re.fullmatch(r"store_vectors_[0-9a-f]{12}", name)
    assert vectors_table_for("x; DROP TABLE store", 8).startswith("store_vectors_")


class Fixed(Embeddings):
    def __init__(self, size: int) -> None:
        self.size = size

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [[0.5] * self.size for _ in texts]

    def embed_query(self, text: str) -> list[float]:
        return [0.5] * self.size


async def test_vectors_of_the_configured_size_pass_as_pgvector_values() -> None:
    checked = CheckedEmbeddings(Fixed(4), name="openai:m", dims=4)
    vectors = await checked.aembed_documents(["a", "b"])
    assert all(isinstance(v, Vector) and len(v) == 4 for v in vectors)
    assert isinstance(checked.embed_query("a"), Vector)


async def test_vectors_of_another_size_are_a_clear_error() -> None:
    checked = CheckedEmbeddings(Fixed(768), name="openai:m", dims=1536)
    with pytest.raises(EmbeddingDimsMismatch, match=r"768-dimension vectors for openai:m"):
        await checked.aembed_query("a")
    with pytest.raises(EmbeddingDimsMismatch, match="1536 dimensions are configured"):
        checked.embed_documents(["a"])


def test_vector_texts_name_fields_as_the_store_does() -> None:
    assert vector_texts(["content"], {"content": "likes tea"}) == [("content", "likes tea")]
    assert vector_texts(["content"], {"other": 1}) == []
    # Several texts at one path are numbered, as the library numbers their vectors.
    assert vector_texts(["content[*]"], {"content": ["a", "b"]}) == [
        ("content[*].0", "a"),
        ("content[*].1", "b"),
    ]
