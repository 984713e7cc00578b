"""Cairn's one settings object: read from CAIRN_* environment variables (and .env), validated at start-up."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

PROJECT_ROOT = Path(__file__).resolve().parents[2]

CHAINLIT_CI_PLACEHOLDER_KEY = "sk-FAKE-OPENAI-API-KEY"

ModelRole = Literal["chat", "planner", "executor", "researcher", "critic", "memory_writer"]

_MINI, _FULL = (0.0004, 0.0016), (0.002, 0.008)
DEFAULT_PRICES: dict[ModelRole, tuple[float, float]] = {
    "chat": _MINI,
    "planner": _FULL,
    "executor": _MINI,
    "researcher": _MINI,
    "critic": _FULL,
    "memory_writer": _MINI,
}
"""Per 1,000 input / output tokens: the list prices of the default models (gpt-4.1-mini,
gpt-4.1) per role; an operator with other models sets CAIRN_MODEL_PRICES."""


def default_model_cache() -> Path:
    """The user's cache folder (XDG), where derived files such as exported models go."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cairn"


class Settings(BaseSettings):
    """Every knob the app reads. Unsafe combinations are refused, not warned about."""

    model_config = SettingsConfigDict(
        env_prefix="CAIRN_",
        env_file=".env",
        extra="ignore",
        populate_by_name=True,
        # Validation errors are logged at start-up; they must not carry secrets with them.
        hide_input_in_errors=True,
    )

    production: bool = False
    """Production mode: refuses the bundled login, generated secrets and wildcard origins."""

    host: str = "127.0.0.1"
    """The address this worker listens on (`python -m app`)."""
    port: int = Field(default=8000, ge=1, le=65535)
    """The port this worker listens on (`python -m app`, `make run PORT=...`)."""

    public_url: str | None = None
    """Address users open in their browser; OAuth redirects are built from it.
    Unset: http://localhost:<port the app listens on>."""

    data_dir: Path = PROJECT_ROOT / ".data"
    """Folder for the embedded Postgres, the generated auth secret and signing keys."""

    database_url: SecretStr | None = None
    """Postgres 15+ with pgvector. Unset: a private embedded Postgres in data_dir."""

    pool_min_size: int = 1
    pool_max_size: int = 10
    pool_timeout_s: float = Field(default=10.0, gt=0, le=120)
    """How long a request waits for a database connection (Postgres away) before the user
    gets an error with Retry."""

    workers: int = Field(default=1, ge=1, le=256)
    """How many app workers serve this deployment (behind one load balancer, on one Postgres).
    More than one requires CAIRN_AUTH_SECRET: every worker must verify every session cookie."""

    # Models: any OpenAI-compatible Chat Completions server. No key -> offline model.
    openai_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("CAIRN_OPENAI_API_KEY", "OPENAI_API_KEY")
    )
    openai_base_url: str | None = Field(
        default=None, validation_alias=AliasChoices("CAIRN_OPENAI_BASE_URL", "OPENAI_BASE_URL")
    )
    model_chat: str = "gpt-4.1-mini"
    model_planner: str = "gpt-4.1"
    model_executor: str = "gpt-4.1-mini"
    model_researcher: str = "gpt-4.1-mini"
    model_critic: str = "gpt-4.1"
    model_memory_writer: str = "gpt-4.1-mini"
    model_timeout_s: float = 60.0
    model_max_retries: int = 2
    model_calls_per_second: float = Field(default=0.0, ge=0.0)
    """Model calls per second on the provider key, for every worker together (a token bucket
    in Postgres, taken before each call). 0: no limit (the provider's own 429s still retry)."""
    model_call_burst: int = Field(default=10, ge=1)
    """Model calls that may start at once before `model_calls_per_second` paces them."""

    # Embeddings.
    embedding_provider: Literal["local", "openai"] = "local"
    """local: all-MiniLM-L6-v2 on the CPU (384 dims); openai: the embeddings endpoint."""
    embedding_model: str = "text-embedding-3-small"
    """Model name when embedding_provider is openai."""
    embedding_dims: int = Field(default=1536, ge=1, le=16_000)
    """Dimensions when embedding_provider is openai (recorded in the database; every vector
    the server returns is checked against it)."""
    embedding_base_url: str | None = None
    """Any server speaking /v1/embeddings when embedding_provider is openai (default: the
    chat models' OPENAI_BASE_URL)."""
    embedding_api_key: SecretStr | None = None
    """Its key (default: OPENAI_API_KEY); the chat models may stay offline."""
    embedding_threads: int = Field(default=2, ge=1, le=64)
    """onnxruntime threads per local embedding call; they do not spin between calls.
    (The torch runtime always uses one: its spinning threads cost more than they give.)"""
    embedding_runtime: Literal["onnx", "torch"] = "onnx"
    """onnx: the local model exported once to onnxruntime (same vectors, ~2x faster);
    torch: sentence-transformers on PyTorch. onnx falls back to torch if the export fails."""
    model_cache_dir: Path = Field(default_factory=default_model_cache)
    """Where the exported embedding model is kept (shared by every data_dir on the machine)."""

    # Long-term memory.
    memory_idle_seconds: float = Field(default=60.0, ge=0.0)
    """How long a conversation must be quiet before its memory job runs."""
    memory_job_attempts: int = Field(default=4, ge=1, le=20)
    """Tries per memory job before it is dead-lettered."""
    retention_days: int = Field(default=365, ge=1, le=3650)
    """Conversations inactive this long are deleted (each user may choose a shorter window)."""
    retention_cron: str = "17 * * * *"
    """When the retention job looks for expired conversations (cron; a 6th field is seconds)."""
    checkpoint_prune_after_hours: float = Field(default=168.0, ge=1.0, le=24 * 3650)
    """Intermediate super-step checkpoints older than this are pruned (graphs/core/prune.py);
    heads, questions, fork points and snapshots stay. README, "Checkpoint pruning"."""
    checkpoint_prune_cron: str = "41 * * * *"
    """When the pruning job runs (cron; a 6th field is seconds)."""

    show_run_metrics: bool = False
    """Show a Research report's run metrics (citation precision, tokens, wall time) in the chat:
    for operators trying the app; users do not see them by default (evals print them too)."""

    # Planner.
    planner_step_budget: int = Field(default=6, ge=1, le=30)
    """Plan steps a Planner run may execute before it stops with an honest partial answer."""
    planner_review_rounds: int = Field(default=3, ge=1, le=10)
    """How many times a reviewer may send a plan back for a redraft."""
    analytics_database_url: SecretStr | None = None
    """Postgres the Planner's read-only SQL tools query, connecting as a SELECT-only role the
    operator created. Unset: the bundled demo schema of Cairn's own database, reached as the
    `cairn_analyst` role the start-up migration creates."""
    sql_timeout_ms: int = Field(default=5000, ge=100, le=120_000)
    """statement_timeout for each analytics query."""
    sql_max_rows: int = Field(default=200, ge=1, le=10_000)
    """Rows an analytics query may return; the rest are cut off (and the cut is reported)."""
    sql_max_chars: int = Field(default=12_000, ge=500, le=200_000)
    """Characters of query output handed to the model."""

    # Auth and sessions.
    auth_secret: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("CAIRN_AUTH_SECRET", "CHAINLIT_AUTH_SECRET"),
    )
    """Signs session JWTs. Generated and kept in data_dir for local use; required in production."""
    session_hours: int = Field(default=8, ge=1, le=24 * 30)
    """How long a login lasts."""
    allow_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Origins allowed to call the app (comma separated). Empty: public_url only."""
    image_allowed_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Origins model-written Markdown may show images from (comma separated); besides the app's own, none."""
    local_users: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Seeded accounts for the bundled login, 'name:password' comma separated."""
    local_signup: bool = True
    oidc_groups: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Team membership from the sign-in's groups claim (comma separated), each
    'group=Workspace name:role' (role: admin, member or reviewer): signing in as a member of the
    group makes you that in the workspace (made on first use); leaving the group takes it away
    at your next sign-in. Memberships from invitations are not touched."""
    oidc_groups_claim: str = Field(default="groups", pattern=r"^[A-Za-z0-9_.:/-]{1,100}$")
    """The claim of the provider's user info that lists the user's groups."""
    local_groups: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Groups the bundled login reports for its accounts (comma separated, 'name=group|group'),
    to try CAIRN_OIDC_GROUPS without a real provider."""
    """Whether the bundled login offers account creation."""
    forwarded_allow_ips: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Addresses or networks of the reverse proxies in front of the workers (comma separated):
    only a request from one of them has its client address taken from X-Forwarded-For. Empty:
    never (the connecting address is the client), like uvicorn's --forwarded-allow-ips."""
    support_users: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Identities (as auth/ makes them: `cairn:<uuid>`, `<provider>:<subject>`) with the support
    role: they may open any conversation's checkpoint history and fork it, audited."""

    # Operator signals.
    metrics_token: SecretStr | None = None
    """Bearer token a Prometheus scraper sends to /metrics. Unset: /metrics is not served."""
    # The agents over MCP (/mcp, personal access tokens).
    mcp_enabled: bool = True
    """Serve the agents as MCP tools at /mcp to holders of a personal access token."""
    mcp_token_max_days: int = Field(default=90, ge=1, le=365)
    """The longest a personal access token may live."""
    mcp_max_concurrent: int = Field(default=2, ge=1, le=20)
    """Runs one token may have going at once (the most a user may choose)."""
    mcp_max_runs_per_hour: int = Field(default=30, ge=1, le=1000)
    """Runs one token may start in an hour (the most a user may choose)."""
    mcp_max_model_calls: int = Field(default=60, ge=1, le=1000)
    """Model calls one run of one token may make (the most a user may choose)."""

    # Input limits.
    max_message_chars: int = Field(default=8000, ge=1)
    max_upload_mb: int = Field(default=5, ge=1, le=100)
    max_upload_files: int = Field(default=5, ge=1, le=20)
    """Files one message may carry (the browser's limit too; a hand-written client is refused)."""
    upload_mime_types: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["text/plain", "text/markdown", "text/csv"]
    )

    # Research agent.
    research_search_provider: Literal["local", "ddgs", "tavily", "searxng"] = "local"
    """Where web_search looks: the local sample corpus (offline default) or a web provider."""
    research_corpus_dir: Path = PROJECT_ROOT / "graphs" / "research" / "corpus"
    """Folder of Markdown/text/HTML documents served by the local corpus provider."""
    tavily_api_key: SecretStr | None = None
    searxng_url: str | None = None
    """Base URL of a SearxNG instance with the JSON format enabled."""
    research_critique_rounds: int = Field(default=2, ge=0, le=5)
    """Critique rounds before still-unsupported claims are removed."""
    research_max_subagents: int = Field(default=3, ge=1, le=10)
    """Research subagents running at once, per thread and per user."""
    research_subagent_tool_calls: int = Field(default=12, ge=1, le=100)
    """Tool calls one research subagent may make."""
    research_subagent_tokens: int = Field(default=120_000, ge=1_000)
    """Tokens one research subagent may use (as the model server reports them)."""
    research_subagent_timeout_s: float = Field(default=180.0, gt=0)
    research_run_timeout_s: float = Field(default=900.0, gt=0)
    """One research round of the orchestrator; at the limit it keeps the files written so far."""

    # Usage and budgets (graphs/core/usage.py).
    monthly_token_budget: int = Field(default=0, ge=0)
    """Model tokens (input + output) one user may use in a calendar month (UTC), counted in
    Postgres across every worker and the MCP endpoint. 0: no limit."""
    monthly_cost_budget: float = Field(default=0.0, ge=0.0)
    """The same in money, at `model_prices`. 0: no limit."""
    model_prices: dict[ModelRole, tuple[float, float]] = Field(
        default_factory=lambda: dict(DEFAULT_PRICES)
    )
    """Price per 1,000 input and output tokens per role, as JSON (`{"chat": [0.0004, 0.0016]}`);
    roles not given keep their default (the list prices of the default models)."""
    run_token_estimate: int = Field(default=4000, ge=0)
    """Tokens a run is assumed to use before this deployment has measured any of its agent's
    runs; after that the measured 95th percentile is reserved against the budget."""
    max_runs_per_user: int = Field(default=3, ge=0)
    """Runs (chat turns, button answers, MCP calls) one user may have going at once, counted in
    Postgres across every worker; one more is refused before it starts. 0: no limit."""

    @field_validator("openai_api_key", mode="before")
    @classmethod
    def _ignore_placeholder_key(cls, value: object) -> object:
        # `chainlit run` with CI=true exports this fake key; it must not switch off offline mode.
        if value in ("", CHAINLIT_CI_PLACEHOLDER_KEY):
            return None
        return value

    @field_validator(
        "allow_origins",
        "image_allowed_origins",
        "local_users",
        "oidc_groups",
        "local_groups",
        "upload_mime_types",
        "support_users",
        "forwarded_allow_ips",
        mode="before",
    )
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("model_prices")
    @classmethod
    def _prices_over_defaults(
        cls, value: dict[ModelRole, tuple[float, float]]
    ) -> dict[ModelRole, tuple[float, float]]:
        if any(price < 0 for pair in value.values() for price in pair):
            msg = "CAIRN_MODEL_PRICES: prices cannot be negative"
            raise ValueError(msg)
        return {**DEFAULT_PRICES, **value}

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _proxy_networks(cls, value: list[str]) -> list[str]:
        # A typo must not pass silently (uvicorn would treat it as a host name and trust nothing,
        # or "*" everything): each entry is an address or a network.
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                msg = f"CAIRN_FORWARDED_ALLOW_IPS: {entry!r} is not an IP address or network"
                raise ValueError(msg) from None
        return value

    @model_validator(mode="after")
    def _require_shared_secret(self) -> Settings:
        # A secret generated per data folder differs between workers: a session signed by
        # one would be refused by the next, and a failover would sign everyone out.
        if self.workers > 1 and (
            self.auth_secret is None or len(self.auth_secret.get_secret_value()) < 32
        ):
            msg = (
                f"CAIRN_WORKERS={self.workers} requires CAIRN_AUTH_SECRET: the same secret "
                "(32+ random characters) for every worker, so each accepts the others' sessions"
            )
            raise ValueError(msg)
        return self

    @model_validator(mode="after")
    def _refuse_unsafe_production(self) -> Settings:
        if not self.production:
            return self
        problems = []
        if self.auth_secret is None or len(self.auth_secret.get_secret_value()) < 32:
            problems.append("CAIRN_AUTH_SECRET (32+ characters) is required")
        if "*" in self.allow_origins:
            problems.append("CAIRN_ALLOW_ORIGINS must not contain '*'")
        if self.database_url is None:
            problems.append("CAIRN_DATABASE_URL is required (no embedded Postgres in production)")
        if self.local_users:
            problems.append("CAIRN_LOCAL_USERS is for local use only")
        if not (self.public_url or "").startswith("https://"):
            problems.append("CAIRN_PUBLIC_URL must be https")
        if self.metrics_token is not None and len(self.metrics_token.get_secret_value()) < 24:
            problems.append("CAIRN_METRICS_TOKEN, when set, needs 24+ characters")
        if problems:
            msg = "Unsafe production settings: " + "; ".join(problems)
            raise ValueError(msg)
        return self

    @property
    def offline(self) -> bool:
        """True when no model key is configured and the deterministic offline model is used."""
        return self.openai_api_key is None

    def base_url(self, port: int) -> str:
        """The public address, defaulting to localhost on the port the app listens on."""
        return (self.public_url or f"http://localhost:{port}").rstrip("/")

    def origins(self, port: int) -> list[str]:
        return self.allow_origins or [self.base_url(port)]

    def model_name(self, role: ModelRole) -> str:
        return str(getattr(self, f"model_{role}"))

    def ensure_auth_secret(self) -> str:
        """The session-signing secret: configured, or generated once and kept in data_dir."""
        if self.auth_secret is not None:
            return self.auth_secret.get_secret_value()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return _read_or_create_secret(self.data_dir / "auth_secret")


def _read_or_create_secret(path: Path) -> str:
    """The secret in `path`, created once: whole or not at all, the same for every reader.

    Written to a private temporary file first and then hard-linked into place: link() fails
    if the name exists, so of several processes starting at once one secret wins, and no one
    can read the file before it is complete (created-then-written let a racing start read it
    empty).
    """
    try:
        return _complete_secret(path)
    except FileNotFoundError:
        pass
    fd, temp = tempfile.mkstemp(prefix=".auth_secret-", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(48))
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(temp, path)
    finally:
        os.unlink(temp)
    return _complete_secret(path)


def _complete_secret(path: Path) -> str:
    secret = path.read_text().strip()
    if len(secret) < 32:
        msg = f"{path} holds no usable secret: delete it (signs everyone out) or set CAIRN_AUTH_SECRET"
        raise RuntimeError(msg)
    return secret


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
