-- plexsphere schema, version 8: an operator token has a scope (`read-only`, `operator`,
-- `admin`), optionally one project it is limited to, an expiry, and the time it was last used.
-- Portable SQL: it runs unchanged on SQLite and Postgres.
--
-- A token created before this version keeps `scope` NULL: a legacy token, answered as `admin`
-- with no expiry (operators keep their access over the upgrade) and listed as legacy so that
-- they replace it with a scoped one.
ALTER TABLE operator_tokens ADD COLUMN scope TEXT;
-- A project id; NULL: every project.
ALTER TABLE operator_tokens ADD COLUMN project_id TEXT;
-- Unix seconds; NULL: never expires (admin and legacy tokens only).
ALTER TABLE operator_tokens ADD COLUMN expires_at BIGINT;
-- Unix seconds, written at most once a minute per token (LAST_USE_WRITE_EVERY_SECS).
ALTER TABLE operator_tokens ADD COLUMN last_used_at BIGINT;
