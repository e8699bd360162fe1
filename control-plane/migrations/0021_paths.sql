-- plexsphere schema, version 21: each node's view of its peers' paths (issue 28). Portable
-- SQL: it runs unchanged on SQLite and Postgres.

-- One row per (node, peer) from the node's last path report; a report replaces all of the
-- node's rows. `kind` is 'direct', 'relay' or 'none'; `relay`/`transport` are set for
-- 'relay', `endpoint` for 'direct'. `rtt_ms` is a float (milliseconds), times are unix
-- seconds. `seq` is the Domain's path seq (`path_heads`) of the report that wrote the row:
-- the console's event stream reads the rows past the seq it has sent. A node's rows go when
-- the node is deleted (cascade) or revoked (`store::paths::forget_node`), both as the
-- reporter and as the peer.
CREATE TABLE node_paths (
    node_id TEXT NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
    peer_node_id TEXT NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
    domain_id TEXT NOT NULL REFERENCES domains(id),
    kind TEXT NOT NULL,
    relay TEXT,
    transport TEXT,
    endpoint TEXT,
    rtt_ms DOUBLE PRECISION,
    last_handshake_at BIGINT,
    updated_at BIGINT NOT NULL,
    seq BIGINT NOT NULL,
    PRIMARY KEY (node_id, peer_node_id)
);
CREATE INDEX node_paths_domain_seq ON node_paths (domain_id, seq);
CREATE INDEX node_paths_peer ON node_paths (peer_node_id);

-- Each Domain's path seq: the newest report's (`seq`), and the newest one that removed rows
-- (`removed_seq`: a stream past it cannot tell the removal from rows, so it tells the console
-- to fetch the map again).
CREATE TABLE path_heads (
    domain_id TEXT PRIMARY KEY REFERENCES domains(id),
    seq BIGINT NOT NULL,
    removed_seq BIGINT NOT NULL
);
