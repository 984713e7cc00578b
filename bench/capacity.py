"""Sessions per worker: how many chat sessions, each sending a message every 10 s, one worker
serves while the 95th percentile time to first token stays within 150 ms.

The same ladder runs against the bare Chainlit handler (`bench/bare_app.py`) and the full app (one
worker on its embedded defaults, offline model, one signed-in user per session), and the two
figures are printed side by side with the server CPU per turn at each rung.

A rung keeps N sessions open (more are opened and warmed up as N grows, each with a first turn
that claims its thread and is not measured). Each session sends at a random phase within the
interval, then about every INTERVAL_S (each gap drawn from INTERVAL_S +/- JITTER_S, so sessions
drift past each other as independent people do, instead of one unlucky cluster of phases
colliding on every round), WINDOW_TURNS times; a turn still running when the next is due delays
it (as a person waits for the reply). The ladder doubles N until a rung misses the
target or fails a turn, then bisects between the last rung that held and the first that did not.

    python -m bench.capacity [--max N] [--window-turns K] [--only app|bare]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.chat_client import ChatSession, TurnFailed
from bench.login import sign_in
from bench.servers import ROOT, Server, running
from bench.ttft import CHAT_PROFILE, app_server, expected_reply, local_users

RESULTS_DIR = ROOT / "bench" / "results"
INTERVAL_S = 10.0
JITTER_S = 2.0
TARGET_P95_MS = 150.0
FIRST_RUNG = 10
BISECT_STEPS = 2
MAX_FAILED_SHARE = 0.01
"""A rung with more failed turns than this (time-outs, wrong replies) is over capacity too."""
SIGN_IN_CONCURRENCY = 8
OPEN_BATCH = 10


class SessionsRefused(RuntimeError):
    """The server did not accept every new session of a rung."""


@dataclass
class Rung:
    sessions: int
    turns: int
    failed: int
    ttft_p50_ms: float
    ttft_p95_ms: float
    cpu_ms_per_turn: float
    postgres_cpu_ms_per_turn: float
    errors: list[str] = field(default_factory=list)

    @property
    def held(self) -> bool:
        return self.ttft_p95_ms <= TARGET_P95_MS and self.failed <= MAX_FAILED_SHARE * max(
            self.turns + self.failed, 1
        )


@dataclass
class Ladder:
    server: str
    rungs: list[Rung] = field(default_factory=list)

    @property
    def capacity(self) -> int:
        """The most sessions of a rung that held, below every rung that did not."""
        failed = [r.sessions for r in self.rungs if not r.held]
        ceiling = min(failed, default=None)
        held = [
            r.sessions for r in self.rungs if r.held and (ceiling is None or r.sessions < ceiling)
        ]
        return max(held, default=0)


class Pool:
    """The open sessions of one server, grown as the ladder climbs."""

    def __init__(self, server: Server, users: dict[str, str] | None) -> None:
        self._server = server
        self._users = users
        self.sessions: list[ChatSession] = []

    async def grow(self, count: int, errors: list[str]) -> None:
        new = count - len(self.sessions)
        if new <= 0:
            return
        names = list(self._users or {})[len(self.sessions) : count]
        if self._users:
            gate = asyncio.Semaphore(SIGN_IN_CONCURRENCY)

            async def cookie(name: str) -> str:
                async with gate:
                    assert self._users is not None
                    return await sign_in(self._server.url, name, self._users[name])

            cookies = await asyncio.gather(*(cookie(n) for n in names))
        else:
            cookies = [""] * new
        fresh = [
            ChatSession(self._server.url, cookie=c, chat_profile=CHAT_PROFILE) for c in cookies
        ]
        # Opened a few at a time: a burst of sign-ins is not what this measures.
        opened: list[object] = []
        for i in range(0, len(fresh), OPEN_BATCH):
            batch = fresh[i : i + OPEN_BATCH]
            opened += await asyncio.gather(*(s.open() for s in batch), return_exceptions=True)
        if failures := [o for o in opened if isinstance(o, BaseException)]:
            # A server that refuses sessions is over capacity: the rung fails, the ladder stops.
            errors.append(f"{len(failures)} of {new} sessions did not open: {failures[0]!r}")
            await asyncio.gather(*(s.close() for s in fresh), return_exceptions=True)
            raise SessionsRefused(errors[-1])
        # The first turn claims the thread (and, for the app, opens its conversation): unmeasured,
        # spread over a few seconds so the warm-up is not itself a burst.
        await asyncio.gather(
            *(_warm(s, f"s{len(self.sessions) + i}", i * 0.02, errors) for i, s in enumerate(fresh))
        )
        self.sessions.extend(fresh)

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self.sessions), return_exceptions=True)


async def _warm(session: ChatSession, tag: str, delay: float, errors: list[str]) -> None:
    await asyncio.sleep(delay)
    try:
        await session.turn(f"capacity warm-up {tag}")
    except TurnFailed as exc:
        errors.append(f"warm-up {tag}: {exc}")


async def _paced(
    session: ChatSession,
    tag: str,
    rng: random.Random,
    turns: int,
    ttfts: list[float],
    errors: list[str],
) -> None:
    loop = asyncio.get_running_loop()
    due = loop.time() + rng.uniform(0, INTERVAL_S)
    for k in range(turns):
        await asyncio.sleep(max(0.0, due - loop.time()))
        due += rng.uniform(INTERVAL_S - JITTER_S, INTERVAL_S + JITTER_S)
        text = f"capacity {tag} turn {k}"
        try:
            turn = await session.turn(text)
        except TurnFailed as exc:
            errors.append(f"{tag} turn {k}: {exc}")
            continue
        if turn.reply != expected_reply(text):
            errors.append(f"{tag} turn {k}: unexpected reply {turn.reply[:80]!r}")
            continue
        ttfts.append(turn.ttft_ms)


async def run_rung(server: Server, pool: Pool, sessions: int, window_turns: int) -> Rung:
    errors: list[str] = []
    try:
        await pool.grow(sessions, errors)
    except SessionsRefused:
        return Rung(sessions, 0, sessions * window_turns, 0.0, float("inf"), 0.0, 0.0, errors)
    ttfts: list[float] = []
    seeds = random.Random(sessions)
    cpu_before = server.cpu_seconds()
    await asyncio.gather(
        *(
            _paced(
                s, f"n{sessions} s{i}", random.Random(seeds.random()), window_turns, ttfts, errors
            )
            for i, s in enumerate(pool.sessions[:sessions])
        )
    )
    cpu_after = server.cpu_seconds()
    count = max(len(ttfts), 1)
    cuts = statistics.quantiles(ttfts, n=100, method="inclusive") if len(ttfts) > 1 else [0.0] * 99
    failed = sessions * window_turns - len(ttfts)
    return Rung(
        sessions=sessions,
        turns=len(ttfts),
        failed=failed,
        ttft_p50_ms=cuts[49],
        ttft_p95_ms=cuts[94] if len(ttfts) > 1 else float("inf"),
        cpu_ms_per_turn=1000 * (cpu_after[0] - cpu_before[0]) / count,
        postgres_cpu_ms_per_turn=1000 * (cpu_after[1] - cpu_before[1]) / count,
        errors=errors[:5],
    )


async def climb(
    server: Server, users: dict[str, str] | None, name: str, limit: int, window_turns: int
) -> Ladder:
    ladder = Ladder(name)
    pool = Pool(server, users)
    try:
        n, low, high = FIRST_RUNG, 0, None
        while n <= limit:
            rung = await run_rung(server, pool, n, window_turns)
            ladder.rungs.append(rung)
            _print_rung(name, rung)
            if not rung.held:
                high = n
                break
            low, n = n, n * 2
        if high is not None:
            for _ in range(BISECT_STEPS):
                mid = (low + high) // 2
                if mid in (low, high) or mid < FIRST_RUNG:
                    break
                rung = await run_rung(server, pool, mid, window_turns)
                ladder.rungs.append(rung)
                _print_rung(name, rung)
                low, high = (mid, high) if rung.held else (low, mid)
    finally:
        await pool.close()
    return ladder


def _print_rung(name: str, rung: Rung) -> None:
    verdict = "held" if rung.held else "missed"
    print(
        f"  {name:4s} {rung.sessions:4d} sessions: TTFT p50 {rung.ttft_p50_ms:7.1f} ms, "
        f"p95 {rung.ttft_p95_ms:7.1f} ms, {rung.turns} turns, {rung.failed} failed, "
        f"CPU {rung.cpu_ms_per_turn:.1f} ms/turn (+ Postgres {rung.postgres_cpu_ms_per_turn:.1f}) "
        f"-> {verdict}",
        flush=True,
    )
    for error in rung.errors:
        print(f"         {error}", flush=True)


def measure_bare(log_dir: Path, limit: int, window_turns: int) -> Ladder:
    with running("bare", "bench/bare_app.py", log_dir=log_dir) as server:
        return asyncio.run(climb(server, None, "bare", limit, window_turns))


def measure_app(log_dir: Path, limit: int, window_turns: int) -> Ladder:
    users = local_users(limit)
    with app_server(users, log_dir) as server:
        return asyncio.run(climb(server, users, "app", limit, window_turns))


def render(ladders: list[Ladder], window_turns: int) -> str:
    lines = [
        f"Sessions per worker with p95 time to first token <= {TARGET_P95_MS:.0f} ms, each session "
        f"sending a message every {INTERVAL_S:.0f} s ({window_turns} measured turns per session "
        "per rung; offline model)",
        f"{'server':8s} {'sessions':>8s}   {'CPU/turn at that rung':>24s}",
    ]
    for ladder in ladders:
        best = next((r for r in ladder.rungs if r.sessions == ladder.capacity), None)
        cpu = (
            f"{best.cpu_ms_per_turn:.1f} ms + PG {best.postgres_cpu_ms_per_turn:.1f} ms"
            if best
            else "-"
        )
        ceiling = min((r.sessions for r in ladder.rungs if not r.held), default=None)
        note = f" (missed at {ceiling})" if ceiling else " (never missed: raise --max)"
        lines.append(f"{ladder.server:8s} {ladder.capacity:8d}   {cpu:>24s}{note}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max", type=int, default=320, help="most sessions to try (default 320)")
    parser.add_argument("--window-turns", type=int, default=3, help="turns per session per rung")
    parser.add_argument("--only", choices=("app", "bare"))
    args = parser.parse_args()
    log_dir = RESULTS_DIR / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    ladders = []
    if args.only != "app":
        print("Bare Chainlit handler:", flush=True)
        ladders.append(measure_bare(log_dir, args.max, args.window_turns))
    if args.only != "bare":
        print("Full app (Assistant, one worker):", flush=True)
        ladders.append(measure_app(log_dir, args.max, args.window_turns))
    print()
    print(render(ladders, args.window_turns))
    out = RESULTS_DIR / "capacity.json"
    figures = {
        "interval_s": INTERVAL_S,
        "target_p95_ms": TARGET_P95_MS,
        "window_turns": args.window_turns,
        "ladders": [
            {"server": ld.server, "capacity": ld.capacity, "rungs": [asdict(r) for r in ld.rungs]}
            for ld in ladders
        ],
    }
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"\nFigures: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
