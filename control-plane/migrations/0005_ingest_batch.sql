-- plexsphere schema, version 5: an ingest batch is stored once.
-- Portable SQL: it runs unchanged on SQLite and Postgres.

-- The batch_id of the node's last stored ingest batch. A node has one batch in flight at a
-- time and sends it again, unchanged, when a call fails; so the only batch that can arrive
-- twice is the last one stored (its answer was lost), and one column per node recognises it.
ALTER TABLE nodes ADD COLUMN last_ingest_batch TEXT;
