"""The schemas `auth/` owns: the bundled login's accounts, access tokens, ended sessions,
workspaces and their audit log, reviews and shares. Applied in the one ordered list of
graphs/core/migrations.py, which names each script here by module and name."""

from __future__ import annotations

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
