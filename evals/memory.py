"""`python -m evals.memory`: recall quality, write decisions and forgetting, on a real Postgres store."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel

from evals.report import render
from evals.retrieval import RetrievalResult, evaluate_retrieval, retrieval_json
from evals.writes import WriteResult, came_back_json, evaluate_writes, load_cases, writes_json
from graphs.assistant.offline import offline_assistant
from graphs.core.embeddings import EmbeddingSpec, build_embeddings
from graphs.core.models import chat_model
from graphs.core.persistence import make_pool, open_persistence
from graphs.core.settings import Settings
from graphs.memory.evaluation.retrieval import LABELLED_SET, load_retrieval_set
from graphs.memory.evaluation.scratch import Memoised, eval_database

HERE = Path(__file__).parent
RETRIEVAL_DATA = LABELLED_SET
"""The tuning split: package data, as the re-embedding gate scores on it in an installed Cairn."""
HELDOUT_DATA = HERE / "data" / "retrieval_heldout.jsonl"
"""Held-out v1: written as held out, but its misses were read while the method was built, so it
is no longer clean; it is now tuned on, beside the tuning split (swept, misses listed)."""
HELDOUT2_DATA = HERE / "data" / "retrieval_heldout2.jsonl"
"""Held-out v2: new users written (and committed on their own) before any change it could
inform. Never tuned on: run at the defaults only, and only its figures are printed, not its
misses, so that reading the report does not spoil it. Never edit it; when it has been looked at
too often, write a fresh one."""
WRITES_DATA = HERE / "data" / "writes.jsonl"
RESULTS = HERE / "results" / "memory.json"


@dataclass(frozen=True)
class Writer:
    model: BaseChatModel
    label: str
    offline: bool


def writer(choice: str, settings: Settings) -> Writer:
    """The memory-writer model the app would use: the real one when a key is configured."""
    if choice == "real" and settings.offline:
        msg = "--model real needs OPENAI_API_KEY"
        raise SystemExit(msg)
    if choice == "offline" or settings.offline:
        return Writer(offline_assistant(), "offline stand-in (graphs.assistant.offline)", True)
    name = settings.model_memory_writer
    server = settings.openai_base_url or "api.openai.com"
    model = chat_model("memory_writer", settings, streaming=False)
    return Writer(model, f"{name} (memory_writer role) at {server}", False)


# --- running --------------------------------------------------------------------------------


async def evaluate(
    url: str, settings: Settings, model: BaseChatModel, embedding: EmbeddingSpec
) -> tuple[list[RetrievalResult], WriteResult]:
    """Both evals on one freshly set-up store, exactly as the app opens it."""
    memoised = EmbeddingSpec(embedding.name, embedding.dims, Memoised(embedding.embeddings))
    persistence = await open_persistence(
        settings, pool=make_pool(url, max_size=4), embedding=memoised
    )
    try:
        retrieval = [
            await evaluate_retrieval(persistence.store, load_retrieval_set(RETRIEVAL_DATA)),
            await evaluate_retrieval(
                persistence.store, load_retrieval_set(HELDOUT_DATA), split="held-out v1"
            ),
            await evaluate_retrieval(
                persistence.store,
                load_retrieval_set(HELDOUT2_DATA),
                split="held-out v2",
                sweep=False,
            ),
        ]
        writes = await evaluate_writes(persistence.store, model, load_cases(WRITES_DATA))
    finally:
        await persistence.close()
    return retrieval, writes


def results_json(
    writer: Writer, embedding: str, retrieval: list[RetrievalResult], writes: WriteResult
) -> dict[str, Any]:
    return {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "model": {"label": writer.label, "offline": writer.offline},
        "embedding": embedding,
        "retrieval": retrieval_json(retrieval[0]),
        "retrieval_heldout": retrieval_json(retrieval[1]),
        "retrieval_heldout2": retrieval_json(retrieval[2]),
        "writes": writes_json(writes),
        "forgotten_came_back": came_back_json(writes),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m evals.memory", description=__doc__)
    parser.add_argument(
        "--database-url",
        help="an empty database to run in (default: a throwaway one, see evals/README.md)",
    )
    parser.add_argument(
        "--model",
        choices=("auto", "offline", "real"),
        default="auto",
        help="memory writer: auto = the real model when OPENAI_API_KEY is set, else offline",
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="where to write the JSON")
    return parser.parse_args(argv)


async def amain(argv: list[str] | None = None) -> int:
    """Run, print, save; exit status 1 when any forgotten fact came back."""
    args = parse_args(argv)
    settings = Settings()
    chosen = writer(args.model, settings)
    embedding = build_embeddings(settings)
    async with eval_database(args.database_url, settings) as url:
        retrieval, writes = await evaluate(url, settings, chosen.model, embedding)
    print(
        render(
            model=chosen.label,
            offline=chosen.offline,
            embedding=embedding.name,
            retrieval=retrieval,
            writes=writes,
        )
    )
    args.results.parent.mkdir(parents=True, exist_ok=True)
    figures = results_json(chosen, embedding.name, retrieval, writes)
    args.results.write_text(json.dumps(figures, indent=2, ensure_ascii=False) + "\n")
    print(f"\nFigures written to {args.results}")
    return 0 if writes.came_back == 0 else 1


def main() -> None:
    sys.exit(asyncio.run(amain()))


if __name__ == "__main__":
    main()
