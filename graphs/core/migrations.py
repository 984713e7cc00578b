"""The app's own schema (Chainlit conversations, thread owners, metadata), applied once at start-up."""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphs.tools.fetchlog import FETCH_LOG_DDL

if TYPE_CHECKING:
    from graphs.core.persistence import Pool

# Any number; it only has to be the same for every worker starting against one database.
_MIGRATION_LOCK_ID = 7_246_021

# Append-only: a released migration is never edited, a change is a new entry.
MIGRATIONS: list[tuple[str, str]] = [
    (
        "0001_core",
        """
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
        """,
    ),
    (
        "0002_chainlit",
        """
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
        """,
    ),
    (
        "0006_privacy",
        """
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
        """,
    ),
    # The research fetch log: what fetch_url fetched, per thread (graphs/tools/fetchlog.py).
    ("0007_research_fetch_log", FETCH_LOG_DDL),
]


async def migrate(pool: Pool, extra: list[tuple[str, str]] | None = None) -> list[str]:
    """Apply pending migrations under an advisory lock; returns the names applied now."""
    applied_now: list[str] = []
    async with pool.connection() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK_ID,))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS cairn_migrations ("
            " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        cur = await conn.execute("SELECT name FROM cairn_migrations")
        done = {row["name"] for row in await cur.fetchall()}
        for name, sql in [*MIGRATIONS, *(extra or [])]:
            if name in done:
                continue
            await conn.execute(sql, prepare=False)  # a script: may hold several statements
            await conn.execute("INSERT INTO cairn_migrations (name) VALUES (%s)", (name,))
            applied_now.append(name)
    return applied_now
