"""/metrics refuses without the right bearer token; traces get hashed users and redacted secrets."""

from __future__ import annotations

import hashlib

import httpx
import pytest
from fastapi import FastAPI
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from graphs.core.settings import Settings
from graphs.core.tracing import (
    REDACTED,
    RedactingSpanExporter,
    Redactor,
    configure_tracing,
    known_secrets,
    reset_tracing,
    tracing_requested,
    user_hash,
)
from ui.metrics import authorized, build_router

TOKEN = "scrape-token-0123456789abcdef"


def unreachable_pool():
    raise AssertionError("a refused scrape must not touch the database")


async def get(token: str | None, headers: dict[str, str]) -> httpx.Response:
    app = FastAPI()
    app.include_router(build_router(token, unreachable_pool))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://cairn") as client:
        return await client.get("/metrics", headers=headers)


async def test_no_token_configured_means_no_metrics_endpoint():
    response = await get(None, {"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 404


@pytest.mark.parametrize(
    "header",
    [None, "", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", f"Basic {TOKEN}", TOKEN, "Bearer "],
)
async def test_a_wrong_or_missing_token_is_refused(header):
    headers = {} if header is None else {"Authorization": header}
    response = await get(TOKEN, headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert "cairn_" not in response.text


def test_the_right_token_is_accepted_in_any_scheme_case():
    assert authorized(f"Bearer {TOKEN}", TOKEN)
    assert authorized(f"bearer {TOKEN}", TOKEN)
    assert not authorized(f"Bearer {TOKEN}", TOKEN + "0")


def test_the_user_hash_is_keyed_and_never_the_raw_id():
    a = user_hash("github:42", "secret-one-with-enough-length")
    assert a == user_hash("github:42", "secret-one-with-enough-length")
    assert a != user_hash("github:42", "secret-two-with-enough-length")
    assert a != user_hash("github:43", "secret-one-with-enough-length")
    assert "github" not in a
    assert hashlib.sha256(b"github:42").hexdigest()[:24] not in a, "keyed, not a bare hash"


def test_secrets_are_redacted_by_key_by_value_and_by_shape():
    redact = Redactor(["the-auth-secret-value-xyz"])
    payload = {
        "headers": {"Authorization": "Bearer abc.def.ghi", "Accept": "text/plain"},
        "api_key": "k-123",
        "openai_api_key": "whatever",
        "database_url": "postgresql://u:p@h/db",
        "usage": {"input_tokens": 12, "output_tokens": 3},
        "messages": [
            "use sk-abcdefghijklmnop1234 please",
            "connect to postgres://app:hunter2@db:5432/cairn now",
            "header was Authorization: Bearer eyJhbGciOi.xyz",
            'config {"password": "swordfish", "user": "x"}',
            "signed with the-auth-secret-value-xyz",
        ],
        "count": 3,
    }
    out = redact(payload)
    text = repr(out)
    for secret in ("abc.def.ghi", "k-123", "whatever", "u:p@h", "sk-abcdefghijklmnop1234"):
        assert secret not in text
    for secret in ("hunter2", "eyJhbGciOi", "swordfish", "the-auth-secret-value-xyz"):
        assert secret not in text
    assert out["headers"]["Accept"] == "text/plain"
    assert out["usage"] == {"input_tokens": 12, "output_tokens": 3}, "counts are not secrets"
    assert out["count"] == 3
    assert out["api_key"] == REDACTED


def test_configured_secrets_are_known_to_the_redactor():
    settings = Settings(
        openai_api_key="sk-configured-key-0123456789", metrics_token="metrics-token-0123456789"
    )
    env = {
        "OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=otlp-header-secret-1",
        "LANGSMITH_API_KEY": "ls-key-0123456789",
    }
    known = known_secrets(settings, "auth-secret-0123456789", env)
    for value in (
        "sk-configured-key-0123456789",
        "metrics-token-0123456789",
        "otlp-header-secret-1",
        "ls-key-0123456789",
        "auth-secret-0123456789",
    ):
        assert value in known


def test_spans_are_redacted_before_the_exporter_sees_them():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(
        SimpleSpanProcessor(RedactingSpanExporter(exporter, Redactor(["known-secret-value"])))
    )
    with provider.get_tracer("t").start_as_current_span("call") as span:
        span.set_attribute("http.request.header.authorization", "Bearer tok123456")
        span.set_attribute(
            "gen_ai.prompt", '{"text": "key sk-abcdefghijklmnop1234 known-secret-value"}'
        )
        span.add_event("log", {"db": "postgresql://a:b@c/d"})
    [done] = exporter.get_finished_spans()
    dumped = repr((dict(done.attributes), [dict(e.attributes) for e in done.events]))
    for secret in ("tok123456", "sk-abcdefghijklmnop1234", "known-secret-value", "a:b@c"):
        assert secret not in dumped
    assert "gen_ai.prompt" in dumped


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({}, (False, False)),
        ({"LANGSMITH_TRACING": "true"}, (False, False)),  # no key: nothing leaves
        ({"LANGSMITH_TRACING": "true", "LANGSMITH_API_KEY": "k"}, (True, False)),
        ({"LANGCHAIN_TRACING_V2": "true", "LANGCHAIN_API_KEY": "k"}, (True, False)),
        ({"LANGSMITH_TRACING": "false", "LANGSMITH_API_KEY": "k"}, (False, False)),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, (False, True)),
    ],
)
def test_tracing_is_switched_on_by_the_standard_settings_only(env, wanted):
    assert tracing_requested(env) == wanted


def test_with_nothing_asked_for_runs_carry_no_trace_metadata():
    tracing = configure_tracing(Settings(), auth_secret="s" * 40, env={"LANGSMITH_TRACING": "true"})
    try:
        assert not tracing.enabled
        assert tracing.run_config(user_id="u", agent="assistant", thread_id="t") == {}
    finally:
        reset_tracing()


def test_traced_runs_go_through_the_redacting_client():
    # OpenTelemetry mode with an in-memory exporter: the same client LangSmith mode uses, without
    # the network (a LangSmith-mode client contacts its server from a background thread).
    key = "lsv2_pt_unit_test_key_0123456789"
    env = {"LANGSMITH_API_KEY": key}
    tracing = configure_tracing(
        Settings(), auth_secret="a" * 40, env=env, span_exporter=InMemorySpanExporter()
    )
    try:
        assert tracing.enabled
        config = tracing.run_config(user_id="github:42", agent="assistant", thread_id="t1")
        assert config["metadata"]["cairn_user"] == user_hash("github:42", "a" * 40)
        assert "github:42" not in repr(config)
        # The client's own step before anything is exported (langsmith Client._hide_run_*).
        inputs = tracing.client._hide_run_inputs(
            {"headers": {"Authorization": "Bearer tok-123"}, "note": f"key {key}"}
        )
        assert "tok-123" not in repr(inputs)
        assert key not in repr(inputs)
        metadata = tracing.client._hide_run_metadata({"database_url": "postgresql://a:b@h/d"})
        assert "a:b@h" not in repr(metadata)
    finally:
        tracing.shutdown()
        reset_tracing()
