-- plexsphere schema, version 6: mesh IP allocation that neither collides nor scans.
-- Portable SQL: it runs unchanged on SQLite and Postgres.

-- Where the allocator stands in each range it hands addresses out from: the address it gave
-- last (NULL: none yet). A registration locks its range's row before it picks an address, so
-- racing registrations of one range take turns here instead of colliding on
-- nodes_live_mesh_ip, and the next address is looked for from here on (wrapping around to
-- reuse the addresses of revoked nodes), not by reading every node of the Domain.
CREATE TABLE mesh_ip_cursors (
    domain_id TEXT NOT NULL REFERENCES domains(id),
    range_cidr TEXT NOT NULL,
    last_ip TEXT,
    PRIMARY KEY (domain_id, range_cidr)
);
