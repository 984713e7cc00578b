"""Time to first streamed token: a bare Chainlit handler next to a full Cairn turn, in one run."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import re
import shutil
import statistics
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from bench.chat_client import ChatSession, Turn, TurnFailed
from bench.login import sign_in
from bench.servers import ROOT, Server, free_port, running, stop_embedded_postgres

RESULTS_DIR = ROOT / "bench" / "results"
WARMUP_TURNS = 5
TARGET_ADDED_MS = 15.0
CONCURRENT_SESSIONS = 20
CHAT_PROFILE = "Assistant"
APP_SETTLE_S = 2.0
"""Extra wait after the app answers /auth/config, for its pool and first queries to settle."""
_SERVER_TURN_LOG = re.compile(r"first_token_ms=([\d.]+) total_ms=([\d.]+)")


@dataclass(frozen=True)
class Scenario:
    key: str
    label: str
    sessions: int
    turns: int
    """Measured turns per session, after WARMUP_TURNS discarded ones."""


SCENARIOS = (
    Scenario("single", "1 session x 200 turns", sessions=1, turns=200),
    Scenario("concurrent", f"{CONCURRENT_SESSIONS} sessions x 20 turns", CONCURRENT_SESSIONS, 20),
)


@dataclass(frozen=True)
class Stats:
    n: int
    p50: float
    p95: float
    mean: float
    max: float

    @classmethod
    def of(cls, samples: list[float]) -> Stats | None:
        if len(samples) < 2:
            return None
        cuts = statistics.quantiles(samples, n=100, method="inclusive")
        return cls(len(samples), cuts[49], cuts[94], statistics.fmean(samples), max(samples))


@dataclass
class Run:
    """One scenario against one server."""

    ttft: Stats | None
    total: Stats | None
    errors: list[str] = field(default_factory=list)
    ttft_in_order: list[float] = field(default_factory=list)
    """Session 0's measured TTFTs in turn order, to see drift as the thread grows."""
    server_first_token: Stats | None = None
    """The app's own log: run_turn start to first token (its `first_token_ms`)."""


def expected_reply(text: str) -> str:
    return f"(offline model) You said: {text}"


def local_users(count: int) -> dict[str, str]:
    return {f"bench{i}": f"bench-password-{i}" for i in range(count)}


async def open_sessions(
    server: Server, count: int, users: dict[str, str] | None
) -> list[ChatSession]:
    """One signed-in tab per session; each session signs in as its own user."""
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


async def run_scenario(server: Server, scenario: Scenario, users: dict[str, str] | None) -> Run:
    sessions = await open_sessions(server, scenario.sessions, users)
    errors: list[str] = []
    try:
        warm = range(WARMUP_TURNS)
        await asyncio.gather(
            *(
                play(s, warm, f"{server.name} {scenario.key} s{i} warm-up", errors)
                for i, s in enumerate(sessions)
            )
        )
        log_offset = server.log_path.stat().st_size
        measured = range(WARMUP_TURNS, WARMUP_TURNS + scenario.turns)
        per_session = await asyncio.gather(
            *(
                play(s, measured, f"{server.name} {scenario.key} s{i}", errors)
                for i, s in enumerate(sessions)
            )
        )
    finally:
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
    turns = [turn for session_turns in per_session for turn in session_turns]
    return Run(
        ttft=Stats.of([t.ttft_ms for t in turns]),
        total=Stats.of([t.total_ms for t in turns]),
        errors=errors,
        ttft_in_order=[t.ttft_ms for t in per_session[0]],
        server_first_token=Stats.of(server_first_tokens(server, log_offset)),
    )


def server_first_tokens(server: Server, offset: int) -> list[float]:
    with server.log_path.open("rb") as log:
        log.seek(offset)
        text = log.read().decode(errors="replace")
    return [float(match[1]) for match in _SERVER_TURN_LOG.finditer(text)]


async def run_all(server: Server, users: dict[str, str] | None) -> dict[str, Run]:
    return {s.key: await run_scenario(server, s, users) for s in SCENARIOS}


def measure_bare(log_dir: Path) -> dict[str, Run]:
    with running("bare", "bench/bare_app.py", log_dir=log_dir) as server:
        return asyncio.run(run_all(server, users=None))


def measure_app(log_dir: Path) -> dict[str, Run]:
    users = local_users(CONCURRENT_SESSIONS)
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
            "app", "app.py", log_dir=log_dir, env=env, port=port, settle_s=APP_SETTLE_S
        ) as server:
            return asyncio.run(run_all(server, users=users))
    finally:
        stop_embedded_postgres(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


@dataclass(frozen=True)
class Comparison:
    """App against bare for one scenario and one metric, at the medians."""

    ratio_p50: float
    added_p50_ms: float
    added_p95_ms: float

    @classmethod
    def of(cls, bare: Stats | None, app: Stats | None) -> Comparison | None:
        if bare is None or app is None:
            return None
        return cls(app.p50 / bare.p50, app.p50 - bare.p50, app.p95 - bare.p95)


def target_met(bare: dict[str, Run], app: dict[str, Run]) -> tuple[bool, float] | None:
    single = Comparison.of(bare["single"].ttft, app["single"].ttft)
    return None if single is None else (single.added_p50_ms <= TARGET_ADDED_MS, single.added_p50_ms)


def table(title: str, metric: str, bare: dict[str, Run], app: dict[str, Run]) -> list[str]:
    header = (
        f"{'scenario':<26}{'bare p50':>9}{'bare p95':>9}{'app p50':>9}{'app p95':>9}"
        f"{'ratio p50':>11}{'added p50':>11}"
    )
    lines = [title, header, "-" * len(header)]
    for scenario in SCENARIOS:
        b, a = getattr(bare[scenario.key], metric), getattr(app[scenario.key], metric)
        lines.append(f"{scenario.label:<26}{_cells(b)}{_cells(a)}{_comparison_cells(b, a)}")
    return lines


def _cells(stats: Stats | None) -> str:
    return f"{stats.p50:>9.1f}{stats.p95:>9.1f}" if stats else f"{'-':>9}{'-':>9}"


def _comparison_cells(bare: Stats | None, app: Stats | None) -> str:
    cmp = Comparison.of(bare, app)
    if cmp is None:
        return f"{'-':>11}{'-':>11}"
    return f"{cmp.ratio_p50:>10.1f}x{cmp.added_p50_ms:>+11.1f}"


def notes(bare: dict[str, Run], app: dict[str, Run]) -> list[str]:
    lines = []
    verdict = target_met(bare, app)
    if verdict is not None:
        met, added = verdict
        lines.append(
            f"Target: app adds <= {TARGET_ADDED_MS:.0f} ms p50 over bare with one session: "
            f"{'MET' if met else 'MISSED'} ({added:+.1f} ms)"
        )
    drift = _drift(app["single"].ttft_in_order)
    if drift:
        lines.append(f"App TTFT drift in the 200-turn thread: p50 {drift}")
    for key, run in app.items():
        if run.server_first_token and run.ttft:
            lines.append(
                f"App {key}: run_turn start -> first token (server log) p50 "
                f"{run.server_first_token.p50:.1f} ms of {run.ttft.p50:.1f} ms TTFT"
            )
    return lines


def _drift(samples: list[float], window: int = 50) -> str:
    if len(samples) < 2 * window:
        return ""
    first, last = samples[:window], samples[-window:]
    return (
        f"{statistics.median(first):.1f} ms over turns 1-{window}, "
        f"{statistics.median(last):.1f} ms over the last {window}"
    )


def error_lines(runs: dict[str, dict[str, Run]]) -> list[str]:
    lines = []
    for server, by_scenario in runs.items():
        for key, run in by_scenario.items():
            if run.errors:
                lines.append(f"ERRORS {server} {key}: {len(run.errors)} failed turns, e.g.:")
                lines.extend(f"  {error}" for error in run.errors[:5])
    return lines


def report(bare: dict[str, Run], app: dict[str, Run]) -> str:
    lines = [
        f"Cairn TTFT benchmark: offline model, {os.cpu_count()} CPUs, "
        f"{WARMUP_TURNS} warm-up turns per session discarded",
        "",
        *table("Time to first streamed token (ms)", "ttft", bare, app),
        "",
        *table("Whole turn, message sent -> task_end (ms)", "total", bare, app),
        "",
        *notes(bare, app),
        *error_lines({"bare": bare, "app": app}),
    ]
    return "\n".join(lines)


def results_json(bare: dict[str, Run], app: dict[str, Run]) -> dict[str, object]:
    verdict = target_met(bare, app)
    scenarios = {}
    for scenario in SCENARIOS:
        b, a = bare[scenario.key], app[scenario.key]
        scenarios[scenario.key] = {
            "label": scenario.label,
            "sessions": scenario.sessions,
            "measured_turns_per_session": scenario.turns,
            "bare": asdict(b),
            "app": asdict(a),
            "ttft": asdict(cmp) if (cmp := Comparison.of(b.ttft, a.ttft)) else None,
            "total": asdict(cmp) if (cmp := Comparison.of(b.total, a.total)) else None,
        }
    return {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "warmup_turns_per_session": WARMUP_TURNS,
        "unit": "ms",
        "target": {
            "added_p50_ms_max": TARGET_ADDED_MS,
            "scenario": "single",
            "met": verdict[0] if verdict else None,
        },
        "scenarios": scenarios,
    }


def main() -> None:
    log_dir = RESULTS_DIR / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    print("Measuring the bare Chainlit handler ...", flush=True)
    bare = measure_bare(log_dir)
    print("Measuring the full app (first start loads the embedding model) ...", flush=True)
    app = measure_app(log_dir)
    print()
    print(report(bare, app))
    out = RESULTS_DIR / "ttft.json"
    out.write_text(json.dumps(results_json(bare, app), indent=2) + "\n")
    print(f"\nFigures: {out.relative_to(ROOT)}; server logs: {log_dir.relative_to(ROOT)}/")


if __name__ == "__main__":
    main()
