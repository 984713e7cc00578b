"""The schemas of Chainlit's data layer (ui/chainlit/data_layer.py) and its element storage
(ui/chainlit/elements.py). Plain SQL: importing this module imports no Chainlit. Applied in
the one ordered list of graphs/core/migrations.py."""

from __future__ import annotations

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
