"""Tracing to LangSmith and/or OpenTelemetry, switched on by their standard settings only; the
user id is hashed and secrets are redacted before anything leaves the process.

- LangSmith: `LANGSMITH_TRACING=true` (or `LANGCHAIN_TRACING_V2=true`) and `LANGSMITH_API_KEY`
  (or `LANGCHAIN_API_KEY`).
- OpenTelemetry: `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`), with the exporter's own
  standard variables (`OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_SERVICE_NAME`, ...).

Both go through one LangSmith client (LangChain's tracer) whose anonymizer redacts every run's
inputs, outputs, errors and metadata; OpenTelemetry spans pass a redacting exporter as well.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import importlib.metadata
import logging
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from collections.abc import Sequence

    from langchain_core.runnables import RunnableConfig
    from langsmith import Client
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from graphs.core.settings import Settings

log = logging.getLogger("cairn.tracing")


def _app_version() -> str:
    try:
        return importlib.metadata.version("cairn")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout never installed
        return "0+unknown"


APP_VERSION = _app_version()
"""Cairn's version, on every trace (run metadata and the OpenTelemetry resource)."""
REDACTED = "[redacted]"
TRUTHY = frozenset({"1", "true", "yes", "on"})

SECRET_KEY = re.compile(
    r"(?i)(api[_-]?key|secret|token|password|passwd|authorization|cookie|database[_-]?url|dsn"
    r"|conninfo|credentials?)$"
)
"""A mapping key whose value is a secret (`access_token`, `x-api-key`, `Authorization`, ...);
`input_tokens` and the like are counts and stay."""
SECRET_TEXT = (
    (re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]+"), "Bearer " + REDACTED),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{12,}"), REDACTED),
    (re.compile(r"(?i)\b(postgres(?:ql)?(?:\+\w+)?://)[^\s'\"<>]+"), r"\1" + REDACTED),
    (
        re.compile(
            r"(?i)([\"']?\b(?:password|passwd|pwd|api[_-]?key|access[_-]?token|secret)[\"']?"
            r"\s*[=:]\s*[\"']?)[^\s,;&'\"}]+"
        ),
        r"\1" + REDACTED,
    ),
)
"""Secrets inside free text: bearer tokens, OpenAI-style keys, database URLs, `password=...`."""


def tracing_requested(env: Mapping[str, str]) -> tuple[bool, bool]:
    """(LangSmith, OpenTelemetry) as the standard settings ask."""
    langsmith = (
        env.get("LANGSMITH_TRACING", env.get("LANGCHAIN_TRACING_V2", "")).strip().lower() in TRUTHY
    )
    has_key = bool(env.get("LANGSMITH_API_KEY") or env.get("LANGCHAIN_API_KEY"))
    if langsmith and not has_key:
        log.warning("LangSmith tracing is on but no API key is set: not tracing to LangSmith")
    otel = bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )
    return langsmith and has_key, otel


def user_hash(user_id: str, secret: str) -> str:
    """A stable pseudonym for traces: keyed with the auth secret, so it cannot be reversed by
    hashing guessed ids without it."""
    digest = hmac.new(secret.encode(), user_id.encode(), hashlib.sha256).hexdigest()
    return f"u-{digest[:24]}"


class Redactor:
    """Removes secrets from anything about to be traced: known secret values wherever they
    appear, values under secret-named keys, and secret-looking text."""

    def __init__(self, known: Iterable[str] = ()) -> None:
        # Longest first, so a secret containing another is replaced whole.
        self.known = sorted({k for k in known if k and len(k) >= 8}, key=len, reverse=True)

    def __call__(self, value: Any) -> Any:
        return self.redact(value)

    def redact(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {
                k: (REDACTED if _secret_key(k, v) else self.redact(v)) for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return type(value)(self.redact(v) for v in value)
        return value

    def text(self, text: str) -> str:
        for secret in self.known:
            text = text.replace(secret, REDACTED)
        for pattern, replacement in SECRET_TEXT:
            text = pattern.sub(replacement, text)
        return text


def _secret_key(key: Any, value: Any) -> bool:
    return isinstance(key, str) and value is not None and SECRET_KEY.search(key) is not None


def known_secrets(settings: Settings, auth_secret: str, env: Mapping[str, str]) -> list[str]:
    """Every configured secret value, so it is replaced wherever it shows up in a trace."""
    values = [auth_secret]
    for secret in (
        settings.database_url,
        settings.openai_api_key,
        settings.analytics_database_url,
        settings.tavily_api_key,
        settings.metrics_token,
    ):
        if secret is not None:
            values.append(secret.get_secret_value())
    names = ("LANGSMITH_API_KEY", "LANGCHAIN_API_KEY", "OPENAI_API_KEY", "CHAINLIT_AUTH_SECRET")
    values += [env[name] for name in names if env.get(name)]
    values += _header_values(env.get("OTEL_EXPORTER_OTLP_HEADERS", ""))
    return values


def _header_values(headers: str) -> list[str]:
    return [part.split("=", 1)[1].strip() for part in headers.split(",") if "=" in part]


class RedactingSpanExporter:
    """An OpenTelemetry span exporter that redacts span and event attributes, then hands the
    spans to the real exporter (OTLP in production, in-memory in tests)."""

    def __init__(self, inner: SpanExporter, redactor: Redactor) -> None:
        self.inner = inner
        self.redactor = redactor

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.inner.export([self._redacted(s) for s in spans])

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def _redacted(self, span: ReadableSpan) -> ReadableSpan:
        from opentelemetry.sdk.trace import Event, ReadableSpan

        events = [
            Event(e.name, self.redactor(dict(e.attributes or {})), e.timestamp) for e in span.events
        ]
        return ReadableSpan(
            name=self.redactor.text(span.name),
            context=span.context,
            parent=span.parent,
            resource=span.resource,
            attributes=self.redactor(dict(span.attributes or {})),
            events=events,
            links=span.links,
            kind=span.kind,
            status=span.status,
            start_time=span.start_time,
            end_time=span.end_time,
            instrumentation_scope=span.instrumentation_scope,
        )


@dataclass
class Tracing:
    """This process's tracing: off, or one LangSmith client (to LangSmith, OTel or both)."""

    secret: str
    client: Client | None = None
    provider: TracerProvider | None = None

    @property
    def enabled(self) -> bool:
        return self.client is not None

    def run_config(self, *, user_id: str, agent: str, thread_id: str) -> RunnableConfig:
        """What a traced run carries: the user as a keyed hash (never the raw id)."""
        if not self.enabled:
            return {}
        return {
            "metadata": {
                "cairn_user": user_hash(user_id, self.secret),
                "cairn_agent": agent,
                "cairn_thread": thread_id,
                "cairn_version": APP_VERSION,
            },
            "tags": [f"agent:{agent}"],
        }

    def flush(self) -> None:
        if self.client is not None:
            self.client.flush()
        if self.provider is not None:
            self.provider.force_flush()

    def shutdown(self) -> None:
        self.flush()
        if self.provider is not None:
            self.provider.shutdown()


@contextlib.contextmanager
def job_trace(job_run_id: str) -> Iterator[None]:
    """Every traced model call inside carries the background job run it belongs to (and the
    app's version): a trace names the attempt that made it, `job-<id>-attempt-<n>`."""
    import langsmith

    metadata = {"cairn_job_run_id": job_run_id, "cairn_version": APP_VERSION}
    with langsmith.tracing_context(metadata=metadata):
        yield


def configure_tracing(
    settings: Settings,
    *,
    auth_secret: str,
    env: Mapping[str, str] | None = None,
    span_exporter: SpanExporter | None = None,
) -> Tracing:
    """Switch tracing on or off for this process from the standard settings.

    `span_exporter` replaces the OTLP exporter (tests pass an in-memory one; it also turns
    OpenTelemetry on). Whatever is asked for, LangChain traces only through the redacting client
    configured here; with nothing asked for, nothing is traced (not even with a stray
    `LANGSMITH_TRACING=true` and no key)."""
    import langsmith

    env = os.environ if env is None else env
    to_langsmith, to_otel = tracing_requested(env)
    to_otel = to_otel or span_exporter is not None
    tracing = Tracing(secret=auth_secret)
    if not (to_langsmith or to_otel):
        langsmith.configure(enabled=False)
        return tracing
    redactor = Redactor(known_secrets(settings, auth_secret, env))
    if to_otel:
        tracing.provider = _tracer_provider(redactor, span_exporter)
    mode: Literal["langsmith", "otel", "hybrid"] = (
        "hybrid" if to_langsmith and to_otel else "otel" if to_otel else "langsmith"
    )
    tracing.client = langsmith.Client(
        anonymizer=redactor,
        tracing_mode=mode,
        otel_tracer_provider=tracing.provider,
        api_key=(env.get("LANGSMITH_API_KEY") or env.get("LANGCHAIN_API_KEY")) or None,
    )
    langsmith.configure(client=tracing.client, enabled=True)
    log.info("tracing on: %s", mode)
    return tracing


def _tracer_provider(redactor: Redactor, exporter: SpanExporter | None) -> TracerProvider:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    # OTEL_SERVICE_NAME, when set, names the service (Resource.create reads it); else "cairn".
    named = bool(os.environ.get("OTEL_SERVICE_NAME"))
    attributes = {"service.version": APP_VERSION} | ({} if named else {"service.name": "cairn"})
    provider = TracerProvider(resource=Resource.create(attributes))
    if exporter is not None:
        processor: Any = SimpleSpanProcessor(RedactingSpanExporter(exporter, redactor))  # type: ignore[arg-type]
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        processor = BatchSpanProcessor(RedactingSpanExporter(OTLPSpanExporter(), redactor))  # type: ignore[arg-type]
    provider.add_span_processor(processor)
    return provider


def reset_tracing() -> None:
    """Back to LangSmith's own defaults (tests)."""
    import langsmith

    langsmith.configure(client=None, enabled=None)
