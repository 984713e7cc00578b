"""`python -m graphs.memory.reembed run|status|retire|abandon`: the re-embedding command."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from graphs.core.embeddings import (
    EmbeddingModelChanged,
    EmbeddingSpec,
    build_embeddings,
    local_embeddings,
    openai_embeddings,
)
from graphs.core.persistence import database_url, make_pool
from graphs.memory.reembed.backfill import BATCH_SIZE, BatchHook, backfill
from graphs.memory.reembed.evaluate import compare
from graphs.memory.reembed.state import (
    Progress,
    ReembedError,
    abandon,
    active,
    begin,
    progress,
    read_record,
    record_eval,
    retire,
)

if TYPE_CHECKING:
    from graphs.core.pool import Pool
    from graphs.core.settings import Settings


async def _retire_switched(pool: Pool, configured: EmbeddingSpec) -> Progress:
    """`retire` from the command: run with the settings the switched workers run with (the
    new model), after a last catch-up pass."""
    state = await active(pool)
    if (configured.name, configured.dims) != (state.target, state.dims):
        msg = (
            f"configure the new model ({state.target}, {state.dims} dims) as the app's "
            "embedding model, restart every worker with it, then retire the old index"
        )
        raise ReembedError(msg)
    await backfill(pool, configured)
    return await retire(pool)


def target_from(args: argparse.Namespace, settings: Settings) -> EmbeddingSpec:
    if args.provider == "local":
        return local_embeddings(settings)
    if not args.model or not args.dims:
        msg = "--provider openai needs --model and --dims"
        raise ReembedError(msg)
    return openai_embeddings(settings, args.model, args.dims)


async def run(
    pool: Pool,
    settings: Settings,
    current: EmbeddingSpec,
    target: EmbeddingSpec,
    *,
    batch_size: int = BATCH_SIZE,
    stop: asyncio.Event | None = None,
    after_batch: BatchHook | None = None,
    out: Callable[[str], None] = print,
) -> Progress:
    """begin + backfill + eval: what `run` does, resumable at every step."""
    started = await begin(pool, current, target)
    out(
        f"Re-embedding the store from {current.name} to {target.name} into {started.table}.\n"
        "Restart the app's workers now: once restarted they write to both indexes (writes "
        "from a worker not yet restarted are caught up at the end)."
    )
    clock = time.monotonic()

    async def report(now: Progress) -> None:
        rate = (now.copied + now.skipped + now.caught_up) / max(time.monotonic() - clock, 1e-6)
        out(f"  {now.line()}, {rate:.0f} items/s")
        if after_batch is not None:
            await after_batch(now)

    done = await backfill(pool, target, batch_size=batch_size, stop=stop, after_batch=report)
    if done.state in ("copying", "catching_up"):
        out(f"Stopped: {done.line()}. Run the same command again to resume.")
        return done
    out(f"Backfilled: {done.line()}.")
    if done.state == "backfilled" or done.eval is None:
        current_score, new_score = await compare(settings, current, target)
        await record_eval(pool, current_score, new_score)
    return await report_eval(pool, target, out)


async def report_eval(pool: Pool, target: EmbeddingSpec, out: Callable[[str], None]) -> Progress:
    state = await active(pool)
    figures = state.eval or {}
    for label in ("current", "new"):
        score = figures.get(label, {})
        out(
            f"  recall eval, {label} model: precision {score.get('precision', 0):.3f}, "
            f"recall {score.get('recall', 0):.3f}, F1 {score.get('f1', 0):.3f}"
        )
    if state.state == "ready":
        out(
            f"The new index scores at least as well. Switch reads by configuring the app "
            f"with {target.name} ({target.dims} dims) and restarting it; once every worker "
            "runs with it, `python -m graphs.memory.reembed retire` drops the old index."
        )
    else:
        out(
            "The new index scores worse than the current one: reads stay on the current "
            "model (a worker configured with the new one refuses to start). "
            "`python -m graphs.memory.reembed abandon` drops it."
        )
    return state


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m graphs.memory.reembed",
        description="Re-embed the store with another embedding model (README: Changing the "
        "embedding model). Ctrl-C stops after the current batch; the same command resumes.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser(
        "run", help="start or resume: backfill the new index, then run the recall eval on it"
    )
    start.add_argument("--provider", choices=("local", "openai"), required=True)
    start.add_argument("--model", help="the openai-compatible model's name")
    start.add_argument("--dims", type=int, help="the openai-compatible model's dimensions")
    start.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    commands.add_parser("status", help="where the re-embedding stands")
    commands.add_parser("retire", help="drop the old index once reads use the new one")
    commands.add_parser("abandon", help="drop the new index and stay on the current model")
    return parser.parse_args(argv)


async def amain(argv: list[str] | None = None) -> int:
    from graphs.core.migrations import migrate
    from graphs.core.settings import Settings

    args = parse_args(argv)
    settings = Settings()
    pool = make_pool(await database_url(settings), max_size=4)
    await pool.open(wait=True, timeout=30)
    try:
        await migrate(pool)
        if args.command == "status":
            now = await progress(pool)
            print(now.line() if now else "No re-embedding has been run on this database.")
            print(json.dumps(await read_record(pool), indent=2))
            return 0
        if args.command in ("retire", "abandon"):
            configured = build_embeddings(settings)
            if args.command == "abandon":
                done = await abandon(pool, configured=configured)
            else:
                done = await _retire_switched(pool, configured)
            print(f"{done.target}: {done.state}. Restart the app's workers.")
            return 0
        stop = asyncio.Event()
        _stop_on_signals(stop)
        done = await run(
            pool,
            settings,
            build_embeddings(settings),
            target_from(args, settings),
            batch_size=args.batch_size,
            stop=stop,
        )
        return {"ready": 0, "refused": 1}.get(done.state, 130)
    except (ReembedError, EmbeddingModelChanged) as refused:
        print(f"refused: {refused}", file=sys.stderr)
        return 2
    finally:
        await pool.close()


def _stop_on_signals(stop: asyncio.Event) -> None:
    """Ctrl-C or SIGTERM: stop after the batch being written; a second one: stop now (the
    uncommitted batch is simply redone on resume)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()

    def handle() -> None:
        if stop.is_set() and task is not None:
            task.cancel()
            return
        stop.set()
        print("Stopping after this batch (again to stop at once)...", file=sys.stderr)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, handle)


def main() -> None:
    try:
        sys.exit(asyncio.run(amain()))
    except asyncio.CancelledError:
        print("Stopped. Run the same command again to resume.", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
