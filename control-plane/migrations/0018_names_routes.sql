-- plexsphere schema, version 18: DNS names, subnet routes and exit nodes (issue 27). Portable
-- SQL: it runs unchanged on SQLite and Postgres.

-- A node's DNS label in its Domain (`<dns_name>.<dns_suffix>`), unique among the Domain's
-- live nodes: the partial unique index below, and the control plane picks a free one
-- (`label_from_hostname` + `-2`, `-3`, ...). NULL only for nodes registered before this
-- version: the control plane names them from their host names when it starts
-- (`store::names::backfill`). A revoked node keeps its name in its row but no longer holds it.
ALTER TABLE nodes ADD COLUMN dns_name TEXT;
CREATE UNIQUE INDEX nodes_live_dns_name ON nodes (domain_id, dns_name)
    WHERE revoked_at IS NULL AND dns_name IS NOT NULL;

-- The exit the node sends its other traffic through, as its last route report named it (a
-- node's DNS name or id; NULL: none).
ALTER TABLE nodes ADD COLUMN use_exit TEXT;

-- The Domain's DNS suffix.
ALTER TABLE domains ADD COLUMN dns_suffix TEXT NOT NULL DEFAULT 'mesh.internal';

-- What each node advertises: one row per (node, cidr). An exit is two rows of kind 'exit'
-- (0.0.0.0/0 and ::/0). A row outlives its withdrawal (advertised = 0) while it is approved
-- or denied, so a route a node offers again keeps its decision; a withdrawn pending row is
-- deleted. `primary_since` is set while the row carries traffic: the primary router of its
-- (Domain, cidr), chosen by the control plane (`routes_select::select`) so every peer sees
-- the same one, or an exit in service; it is when the row became that. Booleans are
-- BIGINT 0/1, times unix seconds.
CREATE TABLE node_routes (
    node_id TEXT NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
    domain_id TEXT NOT NULL REFERENCES domains(id),
    cidr TEXT NOT NULL,
    kind TEXT NOT NULL,
    probe TEXT,
    advertised BIGINT NOT NULL,
    healthy BIGINT NOT NULL,
    healthy_since BIGINT,
    last_report BIGINT NOT NULL,
    approval TEXT NOT NULL,
    approved_at BIGINT,
    approved_by TEXT,
    primary_since BIGINT,
    PRIMARY KEY (node_id, cidr)
);
CREATE INDEX node_routes_domain ON node_routes (domain_id, cidr);
