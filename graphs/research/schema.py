"""The research fetch log (graphs/tools/fetch.py writes it, citations are checked against it).
Applied in the one ordered list of graphs/core/migrations.py."""

from __future__ import annotations

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
