"""The Planner's demo dataset and the read-only role its tools connect as (graphs/planner/sql.py).
Applied in the one ordered list of graphs/core/migrations.py."""

from __future__ import annotations

DEMO_SCHEMA = "analytics_demo"
"""The Planner's demo dataset (graphs/planner/sql.py queries it)."""
ANALYST_ROLE = "cairn_analyst"
"""The SELECT-only role the Planner's tools connect as. Connecting AS it (not SET ROLE) means a
query cannot RESET ROLE back to the app's rights."""

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
