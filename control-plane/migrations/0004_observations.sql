-- plexsphere schema, version 4: what nodes observe (ingest), kept for the operator.
-- Portable SQL: it runs unchanged on SQLite and Postgres.

-- One row per observation; `seq` numbers a node's observations in the order received (from
-- nodes.observations_seq, bumped in the same transaction), so "newest" is the highest seq and
-- the per-node bound of 500 is a range delete. The kind's fields are columns: handshake
-- (peer_node_id, endpoint "ip:port" or NULL), traffic (peer_node_id, rx_bytes, tx_bytes),
-- error (message, the node's text as sent). Deleting a node deletes its rows first.
CREATE TABLE observations (
    node_id TEXT NOT NULL REFERENCES nodes(id),
    seq BIGINT NOT NULL,
    received_at BIGINT NOT NULL,
    at BIGINT NOT NULL,
    kind TEXT NOT NULL,
    peer_node_id TEXT,
    endpoint TEXT,
    rx_bytes BIGINT,
    tx_bytes BIGINT,
    message TEXT,
    PRIMARY KEY (node_id, seq)
);

CREATE INDEX observations_node_kind ON observations (node_id, kind, seq);

-- The last observation seq handed out for the node, and the observations the node reported
-- it dropped before sending (the sum of every batch's `dropped`).
ALTER TABLE nodes ADD COLUMN observations_seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN observations_dropped BIGINT NOT NULL DEFAULT 0;
