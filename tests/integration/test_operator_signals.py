"""Operator signals on a real Postgres: /metrics moves after real turns through the runner (run
cost and quality, checkpoint write latency, table sizes, pruning), and a traced run leaves the
process with the user id hashed, secrets redacted and the app's version on it."""

from __future__ import annotations

import http.server
import threading
import time
from datetime import timedelta

import httpx
import pytest
from fastapi import FastAPI
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from auth.ownership import claim_thread
from graphs.core.persistence import make_pool
from graphs.core.prune import CheckpointPruner
from graphs.core.settings import Settings
from graphs.core.tracing import APP_VERSION, configure_tracing, reset_tracing, user_hash
from graphs.core.usage import Budget, UsageLedger
from tests.integration.test_durable_runs import GOAL, make_runner
from ui.metrics import build_router
from ui.surface import HeadlessSurface

pytestmark = pytest.mark.integration

TOKEN = "scrape-token-0123456789abcdef"
PROMETHEUS_SCRAPE_TIMEOUT_S = 10
RAW_USER = "oidc:raw-user-5b1e9c"
AUTH_SECRET = "test-auth-secret-with-more-than-32-characters"
OPENAI_KEY = "sk-test0123456789abcdefghijklmnop"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def scrape(pool, token: str | None = TOKEN, header: str | None = None) -> httpx.Response:
    app = FastAPI()
    app.include_router(build_router(TOKEN, lambda: pool))
    headers = {"Authorization": header or f"Bearer {token}"} if token or header else {}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://cairn") as client:
        return await client.get("/metrics", headers=headers)


async def planner_turn(runner, thread_id: str, user_id: str, text: str = GOAL):
    pool = runner.threads.pool
    await claim_thread(pool, thread_id=thread_id, user_id=user_id, agent="planner")
    return await runner.message(
        HeadlessSurface(),
        user_id=user_id,
        thread_id=thread_id,
        profile="Planner",
        text=text,
        message_id="m1",
        temporary=False,
    )


async def test_metrics_count_real_turns_and_read_the_queue_from_postgres(database_url):
    runner, close = await make_runner(database_url, worker="metrics")
    pool = runner.threads.pool  # type: ignore[attr-defined]
    try:
        assert (await scrape(pool, token="wrong")).status_code == 401
        before = samples((await scrape(pool)).text)
        paused_key = ("cairn_turns_total", (("agent", "planner"), ("outcome", "paused")))

        outcome = await planner_turn(runner, "metrics-1", "alice")
        assert outcome.status == "paused"
        # A queued memory job and a dead letter, as another worker would have left them.
        async with pool.connection() as conn:
            await conn.execute(
                "INSERT INTO procrastinate_jobs (queue_name, task_name, args) "
                "VALUES ('memory', 'cairn.write_memory', '{}'::jsonb)"
            )
            await conn.execute(
                "INSERT INTO memory_dead_letters (user_id, thread_id, attempts, error) "
                "VALUES ('bob', 't', 4, 'boom')"
            )
        response = await scrape(pool)
    finally:
        await close()

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    after = samples(response.text)
    assert after[paused_key] == before.get(paused_key, 0) + 1
    duration = ("cairn_run_duration_seconds_count", (("agent", "planner"), ("outcome", "paused")))
    assert after[duration] >= 1
    assert after[("cairn_memory_jobs", (("status", "todo"),))] == 1
    assert after[("cairn_memory_dead_letters", ())] == 1
    assert after[("cairn_wipes", (("verified", "true"),))] == 0
    assert after[("cairn_db_pool", (("stat", "pool_max"),))] == 5


@pytest.mark.parametrize(
    ("agent", "profile", "text", "status"),
    [
        ("planner", "Planner", GOAL, "paused"),
        ("assistant", "Assistant", "Remember that I drink green tea.", "done"),
    ],
)
async def test_a_traced_run_carries_the_user_hashed_and_no_secret(
    database_url, monkeypatch, agent, profile, text, status
):
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    exporter = InMemorySpanExporter()
    tracing = configure_tracing(
        Settings(),
        auth_secret=AUTH_SECRET,
        env={"OPENAI_API_KEY": OPENAI_KEY},
        span_exporter=exporter,
    )
    runner, close = await make_runner(database_url, worker="traced", agent=agent)
    runner.tracing = tracing
    try:
        message = f"{text} My key is {OPENAI_KEY} and the db is postgresql://app:hunter2@db/cairn"
        thread_id = f"traced-{agent}"
        await claim_thread(runner.threads.pool, thread_id=thread_id, user_id=RAW_USER, agent=agent)
        outcome = await runner.message(
            HeadlessSurface(),
            user_id=RAW_USER,
            thread_id=thread_id,
            profile=profile,
            text=message,
            message_id="m1",
            temporary=False,
        )
        assert outcome.status == status
        tracing.flush()
    finally:
        await close()
        tracing.shutdown()
        reset_tracing()

    spans = exporter.get_finished_spans()
    assert spans, "the run was traced"
    dumped = repr(
        [
            (s.name, dict(s.attributes or {}), [dict(e.attributes or {}) for e in s.events])
            for s in spans
        ]
    )
    assert user_hash(RAW_USER, AUTH_SECRET) in dumped
    assert RAW_USER not in dumped
    versions = {
        value for s in spans for key, value in (s.attributes or {}).items() if "version" in key
    }
    assert APP_VERSION in versions
    assert text in dumped, "the run's content is traced"
    assert OPENAI_KEY not in dumped
    assert "hunter2" not in dumped
    assert "[redacted]" in dumped


def value(found: dict, name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_a_finished_run_shows_its_cost_quality_writes_and_the_tables_on_metrics(
    database_url,
):
    runner, close = await make_runner(database_url, worker="signals")
    pool = runner.threads.pool  # type: ignore[attr-defined]
    runner.usage = UsageLedger(
        pool, budget=Budget(0, 0), prices={"chat": (1.0, 2.0)}, default_estimate=0
    )
    try:
        before = samples((await scrape(pool)).text)
        paused = await planner_turn(runner, "signals-1", "alice")
        assert paused.status == "paused"
        done = await runner.answer(
            HeadlessSurface(),
            user_id="alice",
            thread_id="signals-1",
            interrupt_id=paused.interrupts[0].id,
            decision="approve",
        )
        assert done.status == "done"
        assert done.usage is not None
        await CheckpointPruner(pool=pool, locks=runner.locks, delta={}, after=timedelta(0)).run()
        after = samples((await scrape(pool)).text)
    finally:
        await close()

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("cairn_run_signals_total", agent="planner", signal="runs") == 1
    assert (
        grew("cairn_run_signals_total", agent="planner", signal="replans")
        == (done.usage.nodes["replan"])
    )
    assert done.usage.nodes["replan"] >= 1
    assert grew("cairn_run_signals_total", agent="planner", signal="step_budget_reached") == 0
    used = done.usage.input_tokens + paused.usage.input_tokens  # type: ignore[union-attr]
    assert grew("cairn_run_tokens_total", agent="planner", direction="input") == used > 0
    assert grew("cairn_run_cost_total", agent="planner") > 0
    assert grew("cairn_run_model_calls_total", agent="planner") >= 2
    assert grew("cairn_run_tool_calls_total", agent="planner", result="ok") >= 1
    assert grew("cairn_checkpoint_write_seconds_count", kind="checkpoint") >= 4
    assert grew("cairn_checkpoint_write_seconds_count", kind="writes") >= 4
    assert value(after, "cairn_table_bytes", table="checkpoints") > 0
    assert value(after, "cairn_table_bytes", table="checkpoint_blobs") > 0
    assert value(after, "cairn_database_bytes") >= value(after, "cairn_table_bytes", table="store")
    assert ("cairn_table_rows_estimate", (("table", "cairn_usage"),)) in after
    assert value(after, "cairn_checkpoint_prune_threads_pending") >= 1
    assert grew("cairn_checkpoint_prune_runs_total", outcome="done") == 1
    assert value(after, "cairn_checkpoint_prune_last_run_timestamp_seconds") > time.time() - 60


class Collector:
    """A stand-in OpenTelemetry collector: an OTLP/HTTP endpoint that keeps what it receives."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                collector.bodies.append(self.rfile.read(length))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def received(self) -> str:
        """Every span name and attribute value that reached the collector."""
        texts: list[str] = []
        for body in self.bodies:
            request = ExportTraceServiceRequest.FromString(body)
            for resource_spans in request.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        texts.append(span.name)
                        texts += [f"{a.key}={a.value}" for a in span.attributes]
                        for event in span.events:
                            texts += [f"{a.key}={a.value}" for a in event.attributes]
        return "\n".join(texts)


async def test_the_otlp_endpoint_setting_alone_sends_redacted_spans(database_url, monkeypatch):
    collector = Collector()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    tracing = configure_tracing(Settings(), auth_secret=AUTH_SECRET)
    runner, close = await make_runner(database_url, worker="otlp")
    runner.tracing = tracing
    try:
        text = f"{GOAL} Authorization: Bearer {OPENAI_KEY}"
        outcome = await planner_turn(runner, "otlp-1", RAW_USER, text=text)
        assert outcome.status == "paused"
        tracing.shutdown()  # flushes the batch to the collector
    finally:
        await close()
        reset_tracing()
        collector.close()

    received = collector.received()
    assert GOAL in received, "spans reached the collector"
    assert user_hash(RAW_USER, AUTH_SECRET) in received
    assert RAW_USER not in received
    assert OPENAI_KEY not in received


async def test_a_scrape_answers_while_every_connection_is_taken(database_url):
    pool = make_pool(database_url, min_size=1, max_size=1)
    await pool.open()
    try:
        async with pool.connection():  # the only connection, busy elsewhere
            started = time.monotonic()
            response = await scrape(pool)
            took = time.monotonic() - started
    finally:
        await pool.close()
    assert response.status_code == 200
    # Within Prometheus's default scrape timeout (10 s), not the pool's own 30 s wait.
    assert took < PROMETHEUS_SCRAPE_TIMEOUT_S
    pool_max = samples(response.text)[("cairn_db_pool", (("stat", "pool_max"),))]
    assert pool_max == 1
