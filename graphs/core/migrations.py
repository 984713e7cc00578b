"""Every migration of Cairn's database, in the one order they apply, applied at start-up.

One list, here, for the whole app; each script lives with the layer that owns its tables and is
named here by module (`owned`): Cairn's core tables (run journal, usage, limits, time travel,
re-embedding) below, Chainlit's conversation and element tables in ui/chainlit/schema.py, the
bundled login, tokens, sessions, workspaces, reviews and shares in auth/schema.py, the
research fetch log in graphs/research/schema.py and the Planner's demo dataset in
graphs/planner/schema.py. Naming rather than importing them keeps core below every layer.

An id is recorded in `cairn_migrations.name` once its script ran, and a database skips every
id it has recorded. So ids are never renamed, renumbered or reused, and a released script is
never edited: a change is a new entry at the end, with the next number. Ids are unique and
their numbers increase down the list (tests/unit/test_migrations.py); the gap before 0100 is
from when the Planner kept its own list, and stays so existing databases keep their record.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from graphs.core.pool import Pool

# Any number; it only has to be the same for every worker starting against one database.
_MIGRATION_LOCK_ID = 7_246_021


def owned(module: str, name: str) -> Callable[[], str]:
    """The script `name` of the layer `module` that owns its tables, read when it is applied:
    the list stays one, in order, here, while each layer keeps its own schema (and core
    imports no layer above it)."""

    def script() -> str:
        return str(getattr(importlib.import_module(module), name))

    script.__qualname__ = f"{module}.{name}"
    return script


class Migration(NamedTuple):
    id: str
    """Recorded in cairn_migrations.name: its meaning never changes."""
    sql: str | Callable[[], str]
    """The script (several statements), or a function returning it for one kept by a library."""

    def script(self) -> str:
        return self.sql if isinstance(self.sql, str) else self.sql()


CORE_SQL = """
        CREATE TABLE IF NOT EXISTS cairn_meta (
            key text PRIMARY KEY,
            value jsonb NOT NULL
        );
        -- Owner of every LangGraph thread, recorded when the thread is created. The graph and
        -- the data layer are only reached after checking this row.
        CREATE TABLE IF NOT EXISTS cairn_threads (
            thread_id text PRIMARY KEY,
            owner_id text NOT NULL,
            agent text NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now()
        );
        CREATE INDEX IF NOT EXISTS cairn_threads_owner_idx ON cairn_threads (owner_id);
        """


def procrastinate_schema() -> str:
    """The job queue's tables (graphs/memory/jobs.py), as the installed procrastinate ships them.

    Loaded only when the migration has to run: importing procrastinate costs ~70 ms."""
    from procrastinate.schema import SchemaManager

    return SchemaManager.get_schema()


# Memory writes that failed every attempt (graphs/memory/jobs.py).
DEAD_LETTER_SQL = """
CREATE TABLE IF NOT EXISTS memory_dead_letters (
    id bigserial PRIMARY KEY,
    user_id text NOT NULL,
    thread_id text NOT NULL,
    job_id bigint,
    attempts integer NOT NULL,
    error text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS memory_dead_letters_user_idx ON memory_dead_letters (user_id);
"""

PRIVACY_SQL = """
        -- Retention ages out conversations by their last activity; a temporary chat never
        -- reads or writes long-term memory.
        ALTER TABLE cairn_threads
            ADD COLUMN IF NOT EXISTS last_active_at timestamptz NOT NULL DEFAULT now(),
            ADD COLUMN IF NOT EXISTS temporary boolean NOT NULL DEFAULT false;
        CREATE INDEX IF NOT EXISTS cairn_threads_last_active_idx
            ON cairn_threads (last_active_at);
        -- Sessions (signed cookies) issued before revoked_at are refused: "delete all my
        -- data" ends every session of the account. Holds no content, only the id and time.
        CREATE TABLE IF NOT EXISTS cairn_session_revocations (
            user_id text PRIMARY KEY,
            revoked_at timestamptz NOT NULL
        );
        -- Per-user retention window for inactive conversations (days; NULL = server default).
        CREATE TABLE IF NOT EXISTS cairn_retention (
            user_id text PRIMARY KEY,
            days integer CHECK (days IS NULL OR days BETWEEN 1 AND 3650)
        );
        -- The account-wipe workflow's log: one row per run, its step, and its verification.
        CREATE TABLE IF NOT EXISTS cairn_wipes (
            id bigserial PRIMARY KEY,
            user_id text NOT NULL,
            started_at timestamptz NOT NULL DEFAULT now(),
            finished_at timestamptz,
            step text NOT NULL DEFAULT 'started',
            counts jsonb NOT NULL DEFAULT '{}'::jsonb,
            verified boolean NOT NULL DEFAULT false
        );
        CREATE INDEX IF NOT EXISTS cairn_wipes_user_idx ON cairn_wipes (user_id);
        -- Ids of conversations deleted in the last day, so a late write from a browser tab
        -- still open on one cannot bring it back as an ownerless row.
        CREATE TABLE IF NOT EXISTS cairn_deleted_threads (
            thread_id text PRIMARY KEY,
            deleted_at timestamptz NOT NULL DEFAULT now()
        );
        """

# The Planner's demo dataset and the analyst role (graphs/planner/sql.py).
# Deterministic pseudo-random numbers in SQL: a multiplicative hash of the row number.
RUNS_SQL = """
-- Runs in progress, one row per thread while a run works on it (graphs/core/runs.py): the
-- worker it belongs to and that worker's heartbeat. A row whose heartbeat stopped belongs to
-- a dead worker; a live one takes it over and resumes the thread from its last checkpoint.
CREATE TABLE IF NOT EXISTS cairn_runs (
    thread_id text PRIMARY KEY,
    user_id text NOT NULL,
    agent text NOT NULL,
    worker_id text NOT NULL,
    status text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'failed')),
    attempts integer NOT NULL DEFAULT 0,
    started_at timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS cairn_runs_heartbeat ON cairn_runs (heartbeat_at)
    WHERE status = 'running';
"""

TIME_TRAVEL_SQL = """
-- Time travel (graphs/core/timetravel.py). Which checkpoint each user message was sent on, so
-- editing it forks the thread from there; one row per (thread, Chainlit message id).
-- checkpoint_id NULL: the thread's first message (the fork starts from the thread's root).
CREATE TABLE IF NOT EXISTS cairn_message_checkpoints (
    thread_id text NOT NULL,
    message_id text NOT NULL,
    checkpoint_id text,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (thread_id, message_id)
);
-- Every support access to a conversation's checkpoints and every fork: who, whose, why, and
-- digests of the state before and after. Shown to support on the page and to the owner in
-- their export; deleted with the conversation (README, "Time travel").
CREATE TABLE IF NOT EXISTS cairn_support_audit (
    id bigserial PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    actor_id text NOT NULL,
    owner_id text NOT NULL,
    thread_id text NOT NULL,
    action text NOT NULL CHECK (action IN ('history', 'state', 'fork')),
    checkpoint_id text,
    reason text,
    before_digest text,
    after_digest text,
    new_checkpoint_id text
);
CREATE INDEX IF NOT EXISTS cairn_support_audit_thread ON cairn_support_audit (thread_id, at);
CREATE INDEX IF NOT EXISTS cairn_support_audit_owner ON cairn_support_audit (owner_id, at);
"""


# Re-embedding the store with another model (graphs.memory.reembed): one row per target model,
# its progress checkpointed after every batch so the backfill can stop and resume. The new
# index's vectors table itself is made by the command (its dimension is the new model's).
REEMBED_SQL = """
CREATE TABLE IF NOT EXISTS cairn_reembed (
    target text PRIMARY KEY,
    dims integer NOT NULL,
    source jsonb NOT NULL,
    vectors_table text NOT NULL,
    state text NOT NULL DEFAULT 'copying',
    cursor_prefix text,
    cursor_key text,
    total bigint NOT NULL DEFAULT 0,
    copied bigint NOT NULL DEFAULT 0,
    skipped bigint NOT NULL DEFAULT 0,
    caught_up bigint NOT NULL DEFAULT 0,
    eval jsonb,
    started_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
"""

# The wipe's cut-off check (graphs.core.fence) in Postgres. Both take the user's advisory lock
# shared until commit, then read the cut-off by a query of their own: in a VOLATILE function each
# query takes a fresh snapshot (READ COMMITTED), so a cut-off committed while the lock was awaited
# is seen (a statement's own snapshot is taken before a lock wait inside it, and would miss it).
# The key is graphs.core.fence.lock_key's.
# - cairn_fence_ended: the check in a transaction of several writes (fence.check).
# - cairn_fence: the check inside a single write statement (fence.STATEMENT_CTE), raising
#   SQLSTATE CRN01 when ended, so the statement and its implicit transaction are undone; with no
#   user (no authority) it checks nothing.
# Issue 13: one statement per fenced write fewer, and no transaction block for one-statement ones.
FENCE_CHECK_SQL = """
CREATE OR REPLACE FUNCTION cairn_fence_ended(p_user text, p_since float8) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtextextended('cairn-user:' || p_user, 0));
    RETURN EXISTS (
        SELECT 1 FROM cairn_session_revocations
        WHERE user_id = p_user
          AND floor(extract(epoch FROM revoked_at)) >= floor(p_since)
    );
END
$$;

CREATE OR REPLACE FUNCTION cairn_fence(p_user text, p_since float8) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_user IS NULL THEN
        RETURN true;
    END IF;
    IF cairn_fence_ended(p_user, p_since) THEN
        RAISE EXCEPTION 'this session has ended' USING ERRCODE = 'CRN01';
    END IF;
    RETURN true;
END
$$;
"""

CHECKPOINT_PRUNE_SQL = """
-- Checkpoint pruning (graphs/core/prune.py): the cut-off of the thread's last prune. Checkpoints
-- older than it were pruned; the thread is looked at again once it was active after it.
ALTER TABLE cairn_threads ADD COLUMN IF NOT EXISTS checkpoints_pruned_before timestamptz;
"""

# Worker leases (graphs/core/runs.py): each worker beats its own row, and each token call records
# the worker running it, so a call whose worker died is closed by a live worker's sweep instead of
# counting against its token's concurrency limit for an hour (auth/tokens.py).
WORKER_LEASES_SQL = """
CREATE TABLE IF NOT EXISTS cairn_workers (
    worker_id text PRIMARY KEY,
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE cairn_token_calls ADD COLUMN IF NOT EXISTS worker_id text;
CREATE INDEX IF NOT EXISTS cairn_token_calls_open ON cairn_token_calls (worker_id)
    WHERE finished_at IS NULL;
"""

# Usage per run and the monthly budget's lock row (graphs/core/usage.py).
# - cairn_usage: one row per run, written as it starts with its reservation against the user's
#   monthly budget and settled with what it used when it ends (a row still 'running' after
#   usage.RESERVATION_TTL_S no longer counts: its worker died). Read by `make capacity`.
# - cairn_usage_months: one row per user and month, locked while a run is admitted.
USAGE_SQL = """
CREATE TABLE IF NOT EXISTS cairn_usage (
    run_id uuid PRIMARY KEY,
    user_id text NOT NULL,
    thread_id text NOT NULL,
    agent text NOT NULL,
    status text NOT NULL DEFAULT 'running',
    reserved_tokens bigint NOT NULL DEFAULT 0 CHECK (reserved_tokens >= 0),
    reserved_cost double precision NOT NULL DEFAULT 0 CHECK (reserved_cost >= 0),
    model_calls integer NOT NULL DEFAULT 0,
    input_tokens bigint NOT NULL DEFAULT 0,
    output_tokens bigint NOT NULL DEFAULT 0,
    tool_calls integer NOT NULL DEFAULT 0,
    subagents integer NOT NULL DEFAULT 0,
    nodes jsonb NOT NULL DEFAULT '{}',
    cost double precision NOT NULL DEFAULT 0,
    wall_s double precision,
    created_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX IF NOT EXISTS cairn_usage_user_created ON cairn_usage (user_id, created_at);
CREATE INDEX IF NOT EXISTS cairn_usage_agent_created ON cairn_usage (agent, created_at);
CREATE TABLE IF NOT EXISTS cairn_usage_months (
    user_id text NOT NULL,
    month date NOT NULL,
    PRIMARY KEY (user_id, month)
);
"""

# Limits shared by every worker.
# - cairn_rate_buckets: a token bucket per outside service and per model provider key
#   (graphs/core/ratelimit.py).
# - cairn_slots: work running at once, a leased row per holder and key (graphs/core/slots.py).
SHARED_LIMITS_SQL = """
CREATE TABLE IF NOT EXISTS cairn_rate_buckets (
    name text PRIMARY KEY,
    tokens double precision NOT NULL,
    stamp timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS cairn_slots (
    key text NOT NULL,
    holder uuid NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (key, holder)
);
"""

# An edit's run (graphs/core/runs.py EditedMessage): the fork a live worker carries out when the
# worker that accepted the edit dies before the fork is written.
RUN_EDITS_SQL = """
ALTER TABLE cairn_runs ADD COLUMN IF NOT EXISTS edit jsonb;
"""

# Each run's tokens per model role ({"chat": [input, output]}), so `make capacity` can price
# recorded runs at other prices than the ones in force when they ran.
USAGE_ROLES_SQL = """
ALTER TABLE cairn_usage ADD COLUMN IF NOT EXISTS roles jsonb NOT NULL DEFAULT '{}';
"""

# Team budgets and caps (graphs/core/usage.py, graphs/core/runs.py). A run of a team's
# conversation records its workspace on its usage row, so the team's month is one indexed sum
# and keeps counting what was spent in conversations deleted since (as a user's month does).
# No foreign key: a usage row is a record, like its user_id. cairn_workspace_usage_months is the
# team's row per month, locked while a team run is admitted (after the user's row).
TEAM_LIMITS_SQL = """
ALTER TABLE cairn_usage ADD COLUMN IF NOT EXISTS workspace_id text;
UPDATE cairn_usage u SET workspace_id = t.workspace_id FROM cairn_threads t
    WHERE t.thread_id = u.thread_id AND t.workspace_id IS NOT NULL AND u.workspace_id IS NULL;
CREATE INDEX IF NOT EXISTS cairn_usage_workspace_created ON cairn_usage (workspace_id, created_at)
    WHERE workspace_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS cairn_workspace_usage_months (
    workspace_id text NOT NULL REFERENCES cairn_workspaces(id) ON DELETE CASCADE,
    month date NOT NULL,
    PRIMARY KEY (workspace_id, month)
);
"""

# Append-only, in id order.
MIGRATIONS: tuple[Migration, ...] = (
    Migration("0001_core", CORE_SQL),
    Migration("0002_chainlit", owned("ui.chainlit.schema", "CHAINLIT_SQL")),
    Migration("0003_local_auth", owned("auth.schema", "LOCAL_AUTH_SQL")),
    Migration("0004_procrastinate", procrastinate_schema),
    Migration("0005_memory_dead_letters", DEAD_LETTER_SQL),
    Migration("0006_privacy", PRIVACY_SQL),
    Migration("0007_research_fetch_log", owned("graphs.research.schema", "FETCH_LOG_SQL")),
    Migration("0008_runs", RUNS_SQL),
    Migration("0009_time_travel", TIME_TRAVEL_SQL),
    Migration("0100_analytics_demo", owned("graphs.planner.schema", "ANALYTICS_DEMO_SQL")),
    Migration("0101_embedding_reembed", REEMBED_SQL),
    Migration("0102_access_tokens", owned("auth.schema", "ACCESS_TOKENS_SQL")),
    Migration("0103_fence_check", FENCE_CHECK_SQL),
    Migration("0104_checkpoint_prune", CHECKPOINT_PRUNE_SQL),
    Migration("0105_worker_leases", WORKER_LEASES_SQL),
    Migration("0106_sign_out", owned("auth.schema", "SIGN_OUT_SQL")),
    Migration("0107_usage", USAGE_SQL),
    Migration("0108_shared_limits", SHARED_LIMITS_SQL),
    Migration("0109_run_edits", RUN_EDITS_SQL),
    Migration("0110_element_files", owned("ui.chainlit.schema", "ELEMENT_FILES_SQL")),
    Migration("0111_usage_roles", USAGE_ROLES_SQL),
    Migration("0112_workspaces", owned("auth.schema", "WORKSPACES_SQL")),
    Migration("0113_reviews", owned("auth.schema", "REVIEWS_SQL")),
    Migration("0114_workspace_wipe", owned("auth.schema", "WORKSPACE_WIPE_SQL")),
    Migration("0115_thread_shares", owned("auth.schema", "SHARES_SQL")),
    Migration("0116_team_limits", TEAM_LIMITS_SQL),
)


async def migrate(pool: Pool, migrations: tuple[Migration, ...] = MIGRATIONS) -> list[str]:
    """Apply the pending migrations in order under an advisory lock; returns the ids applied now.

    Everything that changes the schema runs under that one lock, pgvector's extension
    included, so any number of workers may start at once on an empty database.

    A database made before the list was one (its migrations were applied in another order)
    has the same ids recorded, so nothing runs twice."""
    applied_now: list[str] = []
    async with pool.connection() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK_ID,))
        # Under the lock too: two first starts both running IF NOT EXISTS raced, and the
        # loser failed on the catalog's unique index (pg_extension_name_index).
        await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS cairn_migrations ("
            " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        cur = await conn.execute("SELECT name FROM cairn_migrations")
        done = {row["name"] for row in await cur.fetchall()}
        for migration in migrations:
            if migration.id in done:
                continue
            # A script: may hold several statements.
            await conn.execute(migration.script(), prepare=False)
            await conn.execute("INSERT INTO cairn_migrations (name) VALUES (%s)", (migration.id,))
            applied_now.append(migration.id)
    return applied_now
