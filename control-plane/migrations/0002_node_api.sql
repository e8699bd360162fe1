-- plexsphere schema, version 2: what enrolled nodes report, and the per-Domain event log.
-- Portable SQL: it runs unchanged on SQLite and Postgres (no auto-increment: a Domain's event
-- seq comes from its counter row, bumped in the same transaction as the change it records).

ALTER TABLE nodes ADD COLUMN listen_port BIGINT;
-- The endpoints the server advertises for the node, best first: a JSON array of "ip:port".
ALTER TABLE nodes ADD COLUMN endpoints TEXT;
ALTER TABLE nodes ADD COLUMN last_heartbeat_at BIGINT;
ALTER TABLE nodes ADD COLUMN uptime_secs BIGINT;
ALTER TABLE nodes ADD COLUMN applied_state_version BIGINT;
ALTER TABLE nodes ADD COLUMN peers_configured BIGINT;
ALTER TABLE nodes ADD COLUMN peers_connected BIGINT;

-- One row per Domain: the last event seq handed out, and the highest seq pruned from `events`
-- (a stream may resume from any seq in pruned_through..=seq).
CREATE TABLE domain_events (
    domain_id TEXT PRIMARY KEY REFERENCES domains(id),
    seq BIGINT NOT NULL,
    pruned_through BIGINT NOT NULL
);

-- The replay window. target_node_id NULL: every node of the Domain except the subject.
CREATE TABLE events (
    domain_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    target_node_id TEXT,
    subject_node_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (domain_id, seq)
);

CREATE INDEX events_created ON events (created_at);
