"""The TTFT benchmark's figures: percentiles, app-versus-bare comparisons, the table and the JSON."""

from __future__ import annotations

import os
import platform
import statistics
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any


@dataclass(frozen=True)
class Scenario:
    key: str
    label: str
    sessions: int
    turns: int
    """Measured turns per session, after the discarded warm-up turns."""


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
    """One scenario against one server; times in ms."""

    ttft: Stats | None
    total: Stats | None
    errors: list[str] = field(default_factory=list)
    ttft_in_order: list[float] = field(default_factory=list)
    """Session 0's measured TTFTs in turn order, to see drift as the thread grows."""
    server_first_token: Stats | None = None
    """The app's own log: run_turn start to first token (its `first_token_ms`)."""
    cpu_ms_per_turn: float = 0.0
    """CPU the Chainlit process used per measured turn (all its threads)."""
    postgres_cpu_ms_per_turn: float = 0.0
    """CPU the embedded Postgres used per measured turn (the app only)."""


@dataclass(frozen=True)
class Comparison:
    """App against bare for one scenario and one metric."""

    ratio_p50: float
    added_p50_ms: float
    added_p95_ms: float

    @classmethod
    def of(cls, bare: Stats | None, app: Stats | None) -> Comparison | None:
        if bare is None or app is None:
            return None
        return cls(app.p50 / bare.p50, app.p50 - bare.p50, app.p95 - bare.p95)


@dataclass(frozen=True)
class Benchmark:
    """Everything one run measured, ready to print or save."""

    scenarios: tuple[Scenario, ...]
    bare: dict[str, Run]
    app: dict[str, Run]
    warmup_turns: int
    target_added_ms: float
    """The goal: app p50 TTFT minus bare p50 TTFT with one session."""
    target_scenario: str = "single"

    def target_met(self) -> tuple[bool, float] | None:
        key = self.target_scenario
        cmp = Comparison.of(self.bare[key].ttft, self.app[key].ttft)
        return None if cmp is None else (cmp.added_p50_ms <= self.target_added_ms, cmp.added_p50_ms)


def render(bench: Benchmark) -> str:
    lines = [
        f"Cairn TTFT benchmark: offline model, {os.cpu_count()} CPUs, "
        f"{bench.warmup_turns} warm-up turns per session discarded",
        "",
        *_table(bench, "Time to first streamed token (ms)", "ttft"),
        "",
        *_table(bench, "Whole turn, message sent -> task_end (ms)", "total"),
        "",
        *_notes(bench),
        *_errors(bench),
    ]
    return "\n".join(lines)


def _table(bench: Benchmark, title: str, metric: str) -> list[str]:
    header = (
        f"{'scenario':<26}{'bare p50':>9}{'bare p95':>9}{'app p50':>9}{'app p95':>9}"
        f"{'ratio p50':>11}{'added p50':>11}"
    )
    lines = [title, header, "-" * len(header)]
    for scenario in bench.scenarios:
        bare = getattr(bench.bare[scenario.key], metric)
        app = getattr(bench.app[scenario.key], metric)
        lines.append(f"{scenario.label:<26}{_cells(bare)}{_cells(app)}{_comparison(bare, app)}")
    return lines


def _cells(stats: Stats | None) -> str:
    return f"{stats.p50:>9.1f}{stats.p95:>9.1f}" if stats else f"{'-':>9}{'-':>9}"


def _comparison(bare: Stats | None, app: Stats | None) -> str:
    cmp = Comparison.of(bare, app)
    if cmp is None:
        return f"{'-':>11}{'-':>11}"
    return f"{cmp.ratio_p50:>10.1f}x{cmp.added_p50_ms:>+11.1f}"


RECALL_TURN_TARGET_MS = 30.0
"""The Assistant's whole turn, long-term-memory recall included (the foundation's 15 ms target
predates recall)."""


def _notes(bench: Benchmark) -> list[str]:
    lines = []
    if verdict := bench.target_met():
        met, added = verdict
        lines.append(
            f"Target: app adds <= {bench.target_added_ms:.0f} ms p50 TTFT over bare with one "
            f"session: {'MET' if met else 'MISSED'} ({added:+.1f} ms)"
        )
        lines.append(
            f"Target for an Assistant turn with recall (issue 3): adds <= "
            f"{RECALL_TURN_TARGET_MS:.0f} ms: {'MET' if added <= RECALL_TURN_TARGET_MS else 'MISSED'}"
        )
    if drift := _drift(bench.app[bench.target_scenario].ttft_in_order):
        lines.append(f"App TTFT as its one thread grows: p50 {drift}")
    for scenario in bench.scenarios:
        bare, app = bench.bare[scenario.key], bench.app[scenario.key]
        lines.append(
            f"Server CPU per turn, {scenario.label}: bare {bare.cpu_ms_per_turn:.1f} ms, "
            f"app {app.cpu_ms_per_turn:.1f} ms + its Postgres {app.postgres_cpu_ms_per_turn:.1f} ms"
        )
        if app.server_first_token and app.ttft:
            lines.append(
                f"  app's own log, run_turn start -> first token: p50 "
                f"{app.server_first_token.p50:.1f} ms of the {app.ttft.p50:.1f} ms TTFT"
            )
    return lines


def _drift(samples: list[float], window: int = 50) -> str:
    if len(samples) < 2 * window:
        return ""
    first, last = samples[:window], samples[-window:]
    return (
        f"{statistics.median(first):.1f} ms over its first {window} measured turns, "
        f"{statistics.median(last):.1f} ms over its last {window}"
    )


def _errors(bench: Benchmark) -> list[str]:
    lines = []
    for server, runs in (("bare", bench.bare), ("app", bench.app)):
        for key, run in runs.items():
            if run.errors:
                lines.append(f"ERRORS {server} {key}: {len(run.errors)} failed turns, e.g.:")
                lines.extend(f"  {error}" for error in run.errors[:5])
    return lines


def to_json(bench: Benchmark) -> dict[str, Any]:
    verdict = bench.target_met()
    return {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "unit": "ms",
        "warmup_turns_per_session": bench.warmup_turns,
        "target": {
            "scenario": bench.target_scenario,
            "added_p50_ms_max": bench.target_added_ms,
            "added_p50_ms": verdict[1] if verdict else None,
            "met": verdict[0] if verdict else None,
        },
        "scenarios": {s.key: _scenario_json(bench, s) for s in bench.scenarios},
    }


def _scenario_json(bench: Benchmark, scenario: Scenario) -> dict[str, Any]:
    bare, app = bench.bare[scenario.key], bench.app[scenario.key]
    ttft, total = Comparison.of(bare.ttft, app.ttft), Comparison.of(bare.total, app.total)
    return {
        **asdict(scenario),
        "bare": asdict(bare),
        "app": asdict(app),
        "ttft_app_vs_bare": asdict(ttft) if ttft else None,
        "total_app_vs_bare": asdict(total) if total else None,
    }
