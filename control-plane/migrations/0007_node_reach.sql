-- plexsphere schema, version 7: what a node reports of its reach (its endpoint candidates by
-- kind, its home relay and what its NAT does), beside the advertised `endpoints` of version 2.
-- Portable SQL: it runs unchanged on SQLite and Postgres. All NULL until the node reports.

-- JSON arrays of "ip:port": the reported interface addresses with the listen port, and the
-- reflexive addresses the node's STUN servers saw, each in the node's order without duplicates.
ALTER TABLE nodes ADD COLUMN local_endpoints TEXT;
ALTER TABLE nodes ADD COLUMN reflexive_endpoints TEXT;
-- "ip:port": where the server saw the report come from (with the listen port); NULL when that
-- address is one peers must not be sent to (loopback, the mesh range...).
ALTER TABLE nodes ADD COLUMN observed_endpoint TEXT;
-- The relay (a name from the server's settings) the node keeps a connection to.
ALTER TABLE nodes ADD COLUMN home_relay TEXT;
-- `unknown`, `none`, `endpoint_independent` or `endpoint_dependent`; and 1 when no STUN
-- server answered over UDP.
ALTER TABLE nodes ADD COLUMN nat_mapping TEXT;
ALTER TABLE nodes ADD COLUMN udp_blocked BIGINT;
