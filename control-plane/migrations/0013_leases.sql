-- plexsphere schema, version 13: leases. A lease names the one replica that runs a singleton
-- task (the broker's reconcile loop and maintenance: the lease `broker`), until a wall-clock
-- expiry the holder keeps renewing (`leader.rs`). `term` grows by one each time another
-- replica takes the lease over. Portable SQL: it runs unchanged on SQLite and Postgres.
CREATE TABLE leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    term BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL,
    renewed_at_ms BIGINT NOT NULL
);
