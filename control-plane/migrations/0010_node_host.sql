-- plexsphere schema, version 10: the host a node's credential is bound to, and the requests
-- refused because they came from another host (its state directory was copied).
-- Portable SQL: it runs unchanged on SQLite and Postgres. All NULL until the node sends a
-- host fingerprint (plexd's `Plexd-Host` header).

-- 64 hex: the first fingerprint the node sent, and when.
ALTER TABLE nodes ADD COLUMN host_fingerprint TEXT;
ALTER TABLE nodes ADD COLUMN host_bound_at BIGINT;
-- The refused requests (recorded at most once every few seconds per node): the first and last
-- recorded, how many were recorded, the last one's client address and fingerprint (NULL when
-- it carried none).
ALTER TABLE nodes ADD COLUMN clone_first_seen_at BIGINT;
ALTER TABLE nodes ADD COLUMN clone_last_seen_at BIGINT;
ALTER TABLE nodes ADD COLUMN clone_requests BIGINT NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN clone_addr TEXT;
ALTER TABLE nodes ADD COLUMN clone_fingerprint TEXT;
