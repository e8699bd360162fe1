-- plexsphere schema, version 14: the operator's UDP GSO/GRO switch per node ('on' or 'off';
-- NULL: the node's default), carried in the node's signed state. Portable SQL: it runs
-- unchanged on SQLite and Postgres.
ALTER TABLE nodes ADD COLUMN udp_offload TEXT;
