"""Every migration of Cairn's database, in the one order they apply, applied at start-up.

One list, here, for the whole app: Cairn's own tables, Chainlit's conversation tables, the
bundled login's accounts, the job queue, the research fetch log and the Planner's demo
dataset. The SQL is data, so it lives here rather than beside the code that reads the tables;
each entry says which module owns the tables it makes.

An id is recorded in `cairn_migrations.name` once its script ran, and a database skips every
id it has recorded. So ids are never renamed, renumbered or reused, and a released script is
never edited: a change is a new entry at the end, with the next number. Ids are unique and
their numbers increase down the list (tests/unit/test_migrations.py); the gap before 0100 is
from when the Planner kept its own list, and stays so existing databases keep their record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from graphs.core.pool import Pool

# Any number; it only has to be the same for every worker starting against one database.
_MIGRATION_LOCK_ID = 7_246_021

DEMO_SCHEMA = "analytics_demo"
"""The Planner's demo dataset (graphs/planner/sql.py queries it)."""
ANALYST_ROLE = "cairn_analyst"
"""The SELECT-only role the Planner's tools connect as. Connecting AS it (not SET ROLE) means a
query cannot RESET ROLE back to the app's rights."""


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

CHAINLIT_SQL = """
        -- Chainlit's conversation tables, as its ChainlitDataLayer reads and writes them.
        CREATE TABLE IF NOT EXISTS "User" (
            id text PRIMARY KEY DEFAULT gen_random_uuid()::text,
            "createdAt" timestamp(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
            "updatedAt" timestamp(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
            metadata jsonb NOT NULL DEFAULT '{}',
            identifier text NOT NULL UNIQUE
        );
        CREATE TABLE IF NOT EXISTS "Thread" (
            id text PRIMARY KEY DEFAULT gen_random_uuid()::text,
            "createdAt" timestamp(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
            "updatedAt" timestamp(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
            "deletedAt" timestamp(3),
            name text,
            metadata jsonb NOT NULL DEFAULT '{}',
            tags text[],
            "userId" text REFERENCES "User"(id) ON DELETE CASCADE
        );
        CREATE INDEX IF NOT EXISTS "Thread_userId_updatedAt_idx" ON "Thread" ("userId", "updatedAt");
        CREATE TABLE IF NOT EXISTS "Step" (
            id text PRIMARY KEY DEFAULT gen_random_uuid()::text,
            "createdAt" timestamp(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
            "updatedAt" timestamp(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
            "parentId" text REFERENCES "Step"(id) ON DELETE CASCADE,
            "threadId" text REFERENCES "Thread"(id) ON DELETE CASCADE,
            input text,
            metadata jsonb NOT NULL DEFAULT '{}',
            name text,
            output text,
            type text NOT NULL,
            "showInput" text DEFAULT 'json',
            "isError" boolean DEFAULT false,
            "startTime" timestamp(3) NOT NULL,
            "endTime" timestamp(3) NOT NULL
        );
        CREATE INDEX IF NOT EXISTS "Step_threadId_startTime_idx" ON "Step" ("threadId", "startTime");
        CREATE INDEX IF NOT EXISTS "Step_parentId_idx" ON "Step" ("parentId");
        CREATE TABLE IF NOT EXISTS "Element" (
            id text PRIMARY KEY DEFAULT gen_random_uuid()::text,
            "createdAt" timestamp(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
            "updatedAt" timestamp(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
            "threadId" text REFERENCES "Thread"(id) ON DELETE CASCADE,
            "stepId" text NOT NULL REFERENCES "Step"(id) ON DELETE CASCADE,
            metadata jsonb NOT NULL DEFAULT '{}',
            mime text,
            name text NOT NULL,
            "objectKey" text,
            url text,
            "chainlitKey" text,
            display text,
            size text,
            language text,
            page integer,
            props jsonb
        );
        CREATE INDEX IF NOT EXISTS "Element_threadId_idx" ON "Element" ("threadId");
        CREATE INDEX IF NOT EXISTS "Element_stepId_idx" ON "Element" ("stepId");
        CREATE TABLE IF NOT EXISTS "Feedback" (
            id text PRIMARY KEY DEFAULT gen_random_uuid()::text,
            "createdAt" timestamp(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
            "updatedAt" timestamp(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
            "stepId" text REFERENCES "Step"(id) ON DELETE CASCADE,
            name text NOT NULL,
            value double precision NOT NULL,
            comment text
        );
        CREATE INDEX IF NOT EXISTS "Feedback_stepId_idx" ON "Feedback" ("stepId");
        """

# The bundled login (auth/local_accounts.py, auth/local_oidc.py); unused tables when an
# external OpenID provider is configured.
LOCAL_AUTH_SQL = """
CREATE TABLE IF NOT EXISTS local_accounts (
    username text PRIMARY KEY,
    subject text UNIQUE NOT NULL,
    password_hash text NOT NULL,
    display_name text,
    created_at timestamptz DEFAULT now()
);
CREATE TABLE IF NOT EXISTS local_oidc_codes (
    code_hash text PRIMARY KEY,
    subject text NOT NULL,
    client_id text NOT NULL,
    redirect_uri text NOT NULL,
    nonce text,
    expires_at timestamptz NOT NULL,
    used_at timestamptz
);
CREATE INDEX IF NOT EXISTS local_oidc_codes_expires_at_idx ON local_oidc_codes (expires_at);
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

# The research fetch log: what fetch_url fetched, per thread (graphs/tools/fetchlog.py).
FETCH_LOG_SQL = """
CREATE TABLE IF NOT EXISTS research_fetch_log (
    id bigserial PRIMARY KEY,
    thread_id text NOT NULL,
    url text NOT NULL,
    final_url text NOT NULL,
    fetched_at timestamptz NOT NULL DEFAULT now(),
    status integer NOT NULL,
    content_hash text NOT NULL,
    title text NOT NULL DEFAULT '',
    content text NOT NULL DEFAULT '',
    error text
);
CREATE INDEX IF NOT EXISTS research_fetch_log_thread_idx ON research_fetch_log (thread_id, id);
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

ACCESS_TOKENS_SQL = """
-- Personal access tokens for the agents' MCP endpoint (auth/tokens.py): only a hash of each
-- token is kept. A token acts as its user, within its scopes (agent keys) and limits.
CREATE TABLE IF NOT EXISTS cairn_access_tokens (
    id text PRIMARY KEY,
    user_id text NOT NULL,
    name text NOT NULL,
    token_hash text NOT NULL UNIQUE,
    hint text NOT NULL,
    scopes text[] NOT NULL,
    pre_approve boolean NOT NULL DEFAULT false,
    max_concurrent integer NOT NULL CHECK (max_concurrent > 0),
    max_runs_per_hour integer NOT NULL CHECK (max_runs_per_hour > 0),
    max_model_calls integer NOT NULL CHECK (max_model_calls > 0),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    last_used_at timestamptz,
    revoked_at timestamptz
);
CREATE INDEX IF NOT EXISTS cairn_access_tokens_user ON cairn_access_tokens (user_id);
-- Every call made with a token (the audit log, and what its limits count across workers).
CREATE TABLE IF NOT EXISTS cairn_token_calls (
    id bigserial PRIMARY KEY,
    token_id text NOT NULL,
    user_id text NOT NULL,
    tool text NOT NULL,
    thread_id text,
    status text NOT NULL DEFAULT 'running',
    detail text,
    model_calls integer NOT NULL DEFAULT 0,
    started_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX IF NOT EXISTS cairn_token_calls_token ON cairn_token_calls (token_id, started_at);
CREATE INDEX IF NOT EXISTS cairn_token_calls_user ON cairn_token_calls (user_id);
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

ANALYTICS_DEMO_SQL = f"""
CREATE SCHEMA IF NOT EXISTS {DEMO_SCHEMA};

CREATE TABLE IF NOT EXISTS {DEMO_SCHEMA}.customers (
    customer_id integer PRIMARY KEY,
    name text NOT NULL,
    region text NOT NULL,
    segment text NOT NULL,
    signup_date date NOT NULL
);
COMMENT ON TABLE {DEMO_SCHEMA}.customers IS 'Demo customers (fictional companies), one row each';

CREATE TABLE IF NOT EXISTS {DEMO_SCHEMA}.subscriptions (
    subscription_id integer PRIMARY KEY,
    customer_id integer NOT NULL REFERENCES {DEMO_SCHEMA}.customers,
    plan text NOT NULL,
    mrr numeric(10, 2) NOT NULL,
    started_on date NOT NULL,
    ended_on date
);
COMMENT ON TABLE {DEMO_SCHEMA}.subscriptions IS 'One subscription per customer; mrr is monthly recurring revenue in USD; ended_on is set when it churned';

CREATE TABLE IF NOT EXISTS {DEMO_SCHEMA}.churn_events (
    event_id integer PRIMARY KEY,
    customer_id integer NOT NULL REFERENCES {DEMO_SCHEMA}.customers,
    subscription_id integer NOT NULL REFERENCES {DEMO_SCHEMA}.subscriptions,
    region text NOT NULL,
    quarter text NOT NULL,
    churned_on date NOT NULL,
    reason text NOT NULL,
    lost_mrr numeric(10, 2) NOT NULL
);
COMMENT ON TABLE {DEMO_SCHEMA}.churn_events IS 'One row per cancelled subscription; quarter looks like 2026-Q3';

CREATE TABLE IF NOT EXISTS {DEMO_SCHEMA}.revenue (
    quarter text NOT NULL,
    region text NOT NULL,
    revenue numeric(12, 2) NOT NULL,
    active_customers integer NOT NULL,
    PRIMARY KEY (quarter, region)
);
COMMENT ON TABLE {DEMO_SCHEMA}.revenue IS 'Recognised subscription revenue (USD) and active customers per quarter and region';

INSERT INTO {DEMO_SCHEMA}.customers
SELECT i,
       format('Customer %s', lpad(i::text, 4, '0')),
       CASE WHEN mod(i * 7919, 100) < 40 THEN 'North America'
            WHEN mod(i * 7919, 100) < 70 THEN 'EMEA'
            WHEN mod(i * 7919, 100) < 90 THEN 'APAC'
            ELSE 'LATAM' END,
       CASE WHEN mod(i * 104729, 10) < 6 THEN 'SMB'
            WHEN mod(i * 104729, 10) < 9 THEN 'Mid-Market'
            ELSE 'Enterprise' END,
       date '2024-01-01' + mod(i * 37, 540)
FROM generate_series(1, 2400) AS i
ON CONFLICT DO NOTHING;

INSERT INTO {DEMO_SCHEMA}.subscriptions
SELECT c.customer_id, c.customer_id,
       CASE c.segment WHEN 'SMB' THEN 'Starter' WHEN 'Mid-Market' THEN 'Growth' ELSE 'Enterprise' END,
       CASE c.segment WHEN 'SMB' THEN 49 + mod(c.customer_id * 13, 100)
                      WHEN 'Mid-Market' THEN 400 + mod(c.customer_id * 17, 800)
                      ELSE 3000 + mod(c.customer_id * 19, 6000) END,
       c.signup_date,
       NULL
FROM {DEMO_SCHEMA}.customers AS c
ON CONFLICT DO NOTHING;

WITH churned AS (
    SELECT c.customer_id, c.region,
           c.signup_date + 90 + mod(c.customer_id * 53, 600) AS churned_on
    FROM {DEMO_SCHEMA}.customers AS c
    WHERE mod(c.customer_id * 48271, 1000) <
          (CASE c.region WHEN 'North America' THEN 180 WHEN 'EMEA' THEN 220
                         WHEN 'APAC' THEN 260 ELSE 340 END)
          * (CASE c.segment WHEN 'Enterprise' THEN 0.5 ELSE 1 END)
)
INSERT INTO {DEMO_SCHEMA}.churn_events
SELECT ch.customer_id, ch.customer_id, ch.customer_id, ch.region,
       to_char(ch.churned_on, 'YYYY-"Q"Q'),
       ch.churned_on,
       (ARRAY['price', 'missing features', 'support experience', 'moved to a competitor',
              'budget cuts'])[1 + mod(ch.customer_id * 31, 5)],
       s.mrr
FROM churned AS ch
JOIN {DEMO_SCHEMA}.subscriptions AS s ON s.subscription_id = ch.customer_id
WHERE ch.churned_on <= date '2026-09-30'
ON CONFLICT DO NOTHING;

UPDATE {DEMO_SCHEMA}.subscriptions AS s SET ended_on = e.churned_on
FROM {DEMO_SCHEMA}.churn_events AS e
WHERE e.subscription_id = s.subscription_id AND s.ended_on IS NULL;

INSERT INTO {DEMO_SCHEMA}.revenue
SELECT to_char(q, 'YYYY-"Q"Q'), c.region,
       sum(s.mrr * 3), count(*)
FROM generate_series(date '2024-01-01', date '2026-07-01', interval '3 months') AS q
JOIN {DEMO_SCHEMA}.subscriptions AS s
  ON s.started_on < q + interval '3 months' AND (s.ended_on IS NULL OR s.ended_on >= q)
JOIN {DEMO_SCHEMA}.customers AS c ON c.customer_id = s.customer_id
GROUP BY 1, 2
ON CONFLICT DO NOTHING;

-- The analyst role: log in, read this schema, nothing else. Needs CREATEROLE; a database
-- whose operator manages roles (see README) skips this and sets CAIRN_ANALYTICS_DATABASE_URL.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{ANALYST_ROLE}') THEN
        CREATE ROLE {ANALYST_ROLE} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT
            NOREPLICATION NOBYPASSRLS CONNECTION LIMIT 20;
    END IF;
    ALTER ROLE {ANALYST_ROLE} SET default_transaction_read_only = on;
    ALTER ROLE {ANALYST_ROLE} SET statement_timeout = '10s';
    ALTER ROLE {ANALYST_ROLE} SET idle_in_transaction_session_timeout = '30s';
    ALTER ROLE {ANALYST_ROLE} SET work_mem = '4MB';
    ALTER ROLE {ANALYST_ROLE} SET temp_file_limit = '64MB';
    ALTER ROLE {ANALYST_ROLE} SET search_path = {DEMO_SCHEMA};
    EXECUTE format('GRANT USAGE ON SCHEMA {DEMO_SCHEMA} TO {ANALYST_ROLE}');
    EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA {DEMO_SCHEMA} TO {ANALYST_ROLE}');
EXCEPTION
    WHEN insufficient_privilege OR duplicate_object THEN
        RAISE NOTICE 'analytics role not set up here: %', SQLERRM;
END
$$;
"""  # noqa: S608 (built from constants only)

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

# Sign-out and sign-in limits (auth/sessions.py, auth/throttle.py).
# - cairn_ended_sessions: one signed-out session token each, by the SHA-256 of its signed part
#   (header.payload, which only the auth secret can make), kept until the token would expire.
#   No user id: a wipe's per-user cut-off already ends every session of the account.
# - cairn_auth_attempts: sign-in and sign-up attempts per key (an account, a client address)
#   and fixed time window, counted by one upsert so every worker shares the count.
SIGN_OUT_SQL = """
CREATE TABLE IF NOT EXISTS cairn_ended_sessions (
    session_key bytea PRIMARY KEY,
    ended_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS cairn_ended_sessions_expiry ON cairn_ended_sessions (expires_at);
CREATE TABLE IF NOT EXISTS cairn_auth_attempts (
    key text NOT NULL,
    window_start timestamptz NOT NULL,
    attempts integer NOT NULL CHECK (attempts >= 0),
    PRIMARY KEY (key, window_start)
);
CREATE INDEX IF NOT EXISTS cairn_auth_attempts_window ON cairn_auth_attempts (window_start);
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

# Element storage (ui/chainlit/elements.py): the bytes of what a reply showed (a chart's JSON, a
# report's files) and of kept uploads, by Chainlit's object key, with the user who stored them.
# The foreign key takes them with their conversation, however it is deleted.
ELEMENT_FILES_SQL = """
CREATE TABLE IF NOT EXISTS cairn_element_files (
    object_key text PRIMARY KEY,
    thread_id text NOT NULL REFERENCES "Thread"(id) ON DELETE CASCADE,
    user_id text NOT NULL,
    mime text NOT NULL,
    size integer NOT NULL CHECK (size >= 0),
    data bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS cairn_element_files_thread ON cairn_element_files (thread_id);
CREATE INDEX IF NOT EXISTS cairn_element_files_user ON cairn_element_files (user_id);
"""

# Each run's tokens per model role ({"chat": [input, output]}), so `make capacity` can price
# recorded runs at other prices than the ones in force when they ran.
USAGE_ROLES_SQL = """
ALTER TABLE cairn_usage ADD COLUMN IF NOT EXISTS roles jsonb NOT NULL DEFAULT '{}';
"""

# Workspaces (auth/workspaces.py): teams with roles. Every user has a personal workspace (made
# on first use); a conversation, token, plan gallery and source-reliability memory belongs to
# one. cairn_threads.workspace_id NULL is the owner's personal workspace (threads made before
# workspaces existed need no backfill). The audit log is per workspace; its rows name users
# by id and are kept when a member leaves (their personal data goes with them, not the record
# that they were invited or changed a role).
WORKSPACES_SQL = """
CREATE TABLE IF NOT EXISTS cairn_workspaces (
    id text PRIMARY KEY,
    name text NOT NULL CHECK (length(name) BETWEEN 1 AND 80),
    personal_of text UNIQUE,
    settings jsonb NOT NULL DEFAULT '{}',
    created_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS cairn_workspace_members (
    workspace_id text NOT NULL REFERENCES cairn_workspaces(id) ON DELETE CASCADE,
    user_id text NOT NULL,
    role text NOT NULL CHECK (role IN ('owner', 'admin', 'member', 'reviewer')),
    source text NOT NULL DEFAULT 'invite' CHECK (source IN ('personal', 'created', 'invite', 'oidc')),
    display_name text,
    joined_at timestamptz NOT NULL DEFAULT now(),
    disabled_at timestamptz,
    PRIMARY KEY (workspace_id, user_id)
);
CREATE INDEX IF NOT EXISTS cairn_workspace_members_user ON cairn_workspace_members (user_id);
CREATE TABLE IF NOT EXISTS cairn_active_workspace (
    user_id text PRIMARY KEY,
    workspace_id text NOT NULL REFERENCES cairn_workspaces(id) ON DELETE CASCADE
);
CREATE TABLE IF NOT EXISTS cairn_workspace_invites (
    code_hash text PRIMARY KEY,
    workspace_id text NOT NULL REFERENCES cairn_workspaces(id) ON DELETE CASCADE,
    role text NOT NULL CHECK (role IN ('admin', 'member', 'reviewer')),
    created_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    used_by text,
    used_at timestamptz,
    revoked_at timestamptz
);
CREATE INDEX IF NOT EXISTS cairn_workspace_invites_ws ON cairn_workspace_invites (workspace_id);
CREATE TABLE IF NOT EXISTS cairn_workspace_audit (
    id bigserial PRIMARY KEY,
    workspace_id text NOT NULL REFERENCES cairn_workspaces(id) ON DELETE CASCADE,
    actor_id text,
    subject_id text,
    action text NOT NULL,
    detail jsonb NOT NULL DEFAULT '{}',
    at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS cairn_workspace_audit_ws ON cairn_workspace_audit (workspace_id, id);
CREATE INDEX IF NOT EXISTS cairn_workspace_audit_actor ON cairn_workspace_audit (actor_id);
CREATE INDEX IF NOT EXISTS cairn_workspace_audit_subject ON cairn_workspace_audit (subject_id);
ALTER TABLE cairn_threads ADD COLUMN IF NOT EXISTS workspace_id text
    REFERENCES cairn_workspaces(id) ON DELETE SET NULL;
CREATE INDEX IF NOT EXISTS cairn_threads_workspace ON cairn_threads (workspace_id)
    WHERE workspace_id IS NOT NULL;
ALTER TABLE cairn_access_tokens ADD COLUMN IF NOT EXISTS workspace_id text
    REFERENCES cairn_workspaces(id) ON DELETE CASCADE;
"""

# Shares (auth/shares.py): a conversation of a team workspace shown read-only to the workspace
# or to named members of it. The id is the link's (128 random bits); the rows go with their
# conversation (the foreign key to cairn_threads: the memory page's delete, the sidebar's,
# retention and a wipe) and with their workspace. What the shared view adds to the messages is
# off unless the owner turned it on.
SHARES_SQL = """
CREATE TABLE IF NOT EXISTS cairn_thread_shares (
    id text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9_-]{22}$'),
    thread_id text NOT NULL REFERENCES cairn_threads(thread_id) ON DELETE CASCADE,
    owner_id text NOT NULL,
    workspace_id text NOT NULL REFERENCES cairn_workspaces(id) ON DELETE CASCADE,
    audience text NOT NULL CHECK (audience IN ('workspace', 'members')),
    include_memory_notes boolean NOT NULL DEFAULT false,
    include_recall boolean NOT NULL DEFAULT false,
    include_attachments boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
CREATE INDEX IF NOT EXISTS cairn_thread_shares_owner ON cairn_thread_shares (owner_id, created_at);
CREATE INDEX IF NOT EXISTS cairn_thread_shares_thread ON cairn_thread_shares (thread_id);
CREATE TABLE IF NOT EXISTS cairn_thread_share_members (
    share_id text NOT NULL REFERENCES cairn_thread_shares(id) ON DELETE CASCADE,
    user_id text NOT NULL,
    PRIMARY KEY (share_id, user_id)
);
CREATE INDEX IF NOT EXISTS cairn_thread_share_members_user ON cairn_thread_share_members (user_id);
"""

# Four-eyes approval (auth/reviews.py): a plan of a team conversation waiting for a reviewer.
# One row per paused question (thread, interrupt); decided once (the UPDATE that takes it from
# 'pending' is the only way out), by someone other than the requester. The goal and steps are
# kept here for the reviewers' queue and go with the conversation (ON DELETE CASCADE).
REVIEWS_SQL = """
CREATE TABLE IF NOT EXISTS cairn_reviews (
    id text PRIMARY KEY,
    workspace_id text NOT NULL REFERENCES cairn_workspaces(id) ON DELETE CASCADE,
    thread_id text NOT NULL REFERENCES cairn_threads(thread_id) ON DELETE CASCADE,
    interrupt_id text NOT NULL,
    agent text NOT NULL,
    requester_id text NOT NULL,
    details jsonb NOT NULL DEFAULT '{}',
    status text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'approve', 'edit', 'reject', 'withdrawn')),
    decided_by text,
    decided_at timestamptz,
    edit_text text CHECK (length(edit_text) <= 4000),
    applied_at timestamptz,
    tried_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (thread_id, interrupt_id)
);
CREATE INDEX IF NOT EXISTS cairn_reviews_unapplied ON cairn_reviews (tried_at)
    WHERE applied_at IS NULL AND status IN ('approve', 'edit', 'reject');
CREATE INDEX IF NOT EXISTS cairn_reviews_pending ON cairn_reviews (workspace_id, created_at)
    WHERE status = 'pending';
"""

WORKSPACE_WIPE_SQL = """
ALTER TABLE cairn_workspaces ALTER COLUMN created_by DROP NOT NULL;
ALTER TABLE cairn_workspace_invites ALTER COLUMN created_by DROP NOT NULL;
"""
"""A wiped account's id leaves the teams it made and the invitations others used
(graphs/memory/privacy.leave_workspaces): NULL there means "an account since wiped"."""

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
    Migration("0002_chainlit", CHAINLIT_SQL),
    Migration("0003_local_auth", LOCAL_AUTH_SQL),
    Migration("0004_procrastinate", procrastinate_schema),
    Migration("0005_memory_dead_letters", DEAD_LETTER_SQL),
    Migration("0006_privacy", PRIVACY_SQL),
    Migration("0007_research_fetch_log", FETCH_LOG_SQL),
    Migration("0008_runs", RUNS_SQL),
    Migration("0009_time_travel", TIME_TRAVEL_SQL),
    Migration("0100_analytics_demo", ANALYTICS_DEMO_SQL),
    Migration("0101_embedding_reembed", REEMBED_SQL),
    Migration("0102_access_tokens", ACCESS_TOKENS_SQL),
    Migration("0103_fence_check", FENCE_CHECK_SQL),
    Migration("0104_checkpoint_prune", CHECKPOINT_PRUNE_SQL),
    Migration("0105_worker_leases", WORKER_LEASES_SQL),
    Migration("0106_sign_out", SIGN_OUT_SQL),
    Migration("0107_usage", USAGE_SQL),
    Migration("0108_shared_limits", SHARED_LIMITS_SQL),
    Migration("0109_run_edits", RUN_EDITS_SQL),
    Migration("0110_element_files", ELEMENT_FILES_SQL),
    Migration("0111_usage_roles", USAGE_ROLES_SQL),
    Migration("0112_workspaces", WORKSPACES_SQL),
    Migration("0113_reviews", REVIEWS_SQL),
    Migration("0114_workspace_wipe", WORKSPACE_WIPE_SQL),
    Migration("0115_thread_shares", SHARES_SQL),
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
