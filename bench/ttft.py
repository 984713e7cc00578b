"""Time to first streamed token: a bare Chainlit handler next to a full Cairn turn, in one run."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.chat_client import ChatSession, Turn, TurnFailed
from bench.login import sign_in
from bench.report import Benchmark, Run, Scenario, Stats, render, to_json
from bench.servers import ROOT, Server, free_port, running, stop_embedded_postgres

RESULTS_DIR = ROOT / "bench" / "results"
WARMUP_TURNS = 5
TARGET_ADDED_MS = 15.0
CONCURRENT_SESSIONS = 20
SCENARIOS = (
    Scenario("single", "1 session x 200 turns", sessions=1, turns=200),
    Scenario("concurrent", f"{CONCURRENT_SESSIONS} sessions x 20 turns", CONCURRENT_SESSIONS, 20),
)
CHAT_PROFILE = "Assistant"
APP_SETTLE_S = 2.0
"""Extra wait after the app answers /auth/config, for its pool and first queries to settle."""
_SERVER_TURN_LOG = re.compile(r"first_token_ms=([\d.]+) total_ms=([\d.]+)")


def expected_reply(text: str) -> str:
    return f"(offline model) You said: {text}"


def local_users(count: int) -> dict[str, str]:
    return {f"bench{i}": f"bench-password-{i}" for i in range(count)}


async def open_sessions(
    server: Server, count: int, users: dict[str, str] | None
) -> list[ChatSession]:
    """One browser tab per session; with `users`, each tab signs in as its own user."""
    if users:
        names = list(users)[:count]
        cookies = await asyncio.gather(*(sign_in(server.url, n, users[n]) for n in names))
    else:
        cookies = [""] * count
    sessions = [ChatSession(server.url, cookie=c, chat_profile=CHAT_PROFILE) for c in cookies]
    await asyncio.gather(*(session.open() for session in sessions))
    return sessions


async def play(session: ChatSession, turns: range, tag: str, errors: list[str]) -> list[Turn]:
    """Run turns one after another in one session; failures are recorded, not raised."""
    done = []
    for i in turns:
        text = f"benchmark {tag} turn {i}"
        try:
            turn = await session.turn(text)
        except TurnFailed as exc:
            errors.append(f"{tag} turn {i}: {exc}")
            continue
        if turn.reply != expected_reply(text):
            errors.append(f"{tag} turn {i}: unexpected reply {turn.reply[:120]!r}")
        done.append(turn)
    return done


async def play_all(
    server: Server, sessions: list[ChatSession], turns: range, tag: str, errors: list[str]
) -> list[list[Turn]]:
    """All sessions at once, each one turn after another."""
    return await asyncio.gather(
        *(play(s, turns, f"{server.name} {tag} s{i}", errors) for i, s in enumerate(sessions))
    )


async def run_scenario(server: Server, scenario: Scenario, users: dict[str, str] | None) -> Run:
    sessions = await open_sessions(server, scenario.sessions, users)
    errors: list[str] = []
    try:
        await play_all(server, sessions, range(WARMUP_TURNS), f"{scenario.key} warm-up", errors)
        log_offset = server.log_path.stat().st_size
        cpu_before = server.cpu_seconds()
        measured = range(WARMUP_TURNS, WARMUP_TURNS + scenario.turns)
        per_session = await play_all(server, sessions, measured, scenario.key, errors)
        cpu_after = server.cpu_seconds()
    finally:
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
    turns = [turn for session_turns in per_session for turn in session_turns]
    count = max(len(turns), 1)
    return Run(
        ttft=Stats.of([t.ttft_ms for t in turns]),
        total=Stats.of([t.total_ms for t in turns]),
        errors=errors,
        ttft_in_order=[t.ttft_ms for t in per_session[0]],
        server_first_token=Stats.of(server_first_tokens(server, log_offset)),
        cpu_ms_per_turn=1000 * (cpu_after[0] - cpu_before[0]) / count,
        postgres_cpu_ms_per_turn=1000 * (cpu_after[1] - cpu_before[1]) / count,
    )


def server_first_tokens(server: Server, offset: int) -> list[float]:
    """The app logs its own run_turn timings; the bare handler logs none."""
    with server.log_path.open("rb") as log:
        log.seek(offset)
        text = log.read().decode(errors="replace")
    return [float(match[1]) for match in _SERVER_TURN_LOG.finditer(text)]


async def run_all(server: Server, users: dict[str, str] | None) -> dict[str, Run]:
    return {s.key: await run_scenario(server, s, users) for s in SCENARIOS}


def measure_bare(log_dir: Path) -> dict[str, Run]:
    with running("bare", "bench/bare_app.py", log_dir=log_dir) as server:
        return asyncio.run(run_all(server, users=None))


@contextmanager
def app_server(users: dict[str, str], log_dir: Path) -> Iterator[Server]:
    """The full app on its embedded defaults, with `users` seeded, on a throwaway data folder."""
    data_dir = Path(tempfile.mkdtemp(prefix="cairn-bench-"))
    # The embedded Postgres runs as another system user when we are root: it must traverse this.
    data_dir.chmod(0o755)
    port = free_port()
    env = {
        "CAIRN_DATA_DIR": str(data_dir),
        "CAIRN_LOCAL_USERS": ",".join(f"{name}:{pw}" for name, pw in users.items()),
        "CAIRN_PUBLIC_URL": f"http://localhost:{port}",
    }
    try:
        with running(
            "app",
            "app.py",
            log_dir=log_dir,
            env=env,
            port=port,
            settle_s=APP_SETTLE_S,
            postgres_dir=data_dir / "postgres",
        ) as server:
            yield server
    finally:
        stop_embedded_postgres(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


def measure_app(log_dir: Path) -> dict[str, Run]:
    users = local_users(CONCURRENT_SESSIONS)
    with app_server(users, log_dir) as server:
        return asyncio.run(run_all(server, users=users))


def main() -> None:
    log_dir = RESULTS_DIR / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    print("Measuring the bare Chainlit handler ...", flush=True)
    bare = measure_bare(log_dir)
    print("Measuring the full app (its first start loads the embedding model) ...", flush=True)
    app = measure_app(log_dir)
    bench = Benchmark(SCENARIOS, bare, app, WARMUP_TURNS, TARGET_ADDED_MS)
    print()
    print(render(bench))
    out = RESULTS_DIR / "ttft.json"
    out.write_text(json.dumps(to_json(bench), indent=2) + "\n")
    print(f"\nFigures: {out.relative_to(ROOT)}; server logs: {log_dir.relative_to(ROOT)}/")


if __name__ == "__main__":
    main()
