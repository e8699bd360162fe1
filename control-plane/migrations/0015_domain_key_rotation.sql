-- plexsphere schema, version 15: Domain signing-key rotation. Portable SQL: it runs unchanged
-- on SQLite and Postgres.

-- Each generation after the first carries its transition statement: the JSON of
-- `plexsphere_wire::signing_keys::KeyTransition` (the new key's generation, public key and
-- start, signed by the previous generation's key). NULL for generation 1, which follows no key.
-- A node offline for a whole overlap follows these from the key it pinned.
ALTER TABLE domain_keys ADD COLUMN transition TEXT;

-- When the Domain's nodes were told that this generation now signs (a `resync` event appended
-- once its `active_from` passed): NULL until then, and for generation 1. Set by a conditional
-- update, so of several replicas exactly one appends that event.
ALTER TABLE domain_keys ADD COLUMN activated_at BIGINT;
