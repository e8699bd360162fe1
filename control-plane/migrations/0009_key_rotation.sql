-- plexsphere schema, version 9: rotation of a node's WireGuard key and of its credential.
-- Portable SQL: it runs unchanged on SQLite and Postgres. All NULL until a rotation happens.

-- Unix seconds of the last change of the WireGuard key and of the credential.
ALTER TABLE nodes ADD COLUMN key_rotated_at BIGINT;
ALTER TABLE nodes ADD COLUMN credential_rotated_at BIGINT;
-- The credential handed out by the last rotation and not used yet (SHA-256 hex): it becomes
-- the credential on its first use.
ALTER TABLE nodes ADD COLUMN pending_credential_sha256 TEXT;
-- The credential a rotation replaced, still accepted until `previous_credential_until` (so
-- calls the node sent before it switched do not fail).
ALTER TABLE nodes ADD COLUMN previous_credential_sha256 TEXT;
ALTER TABLE nodes ADD COLUMN previous_credential_until BIGINT;
-- An operator asked the node to rotate (`plexctl node rotate-key`); cleared by the rotation.
ALTER TABLE nodes ADD COLUMN rotate_key_requested_at BIGINT;
ALTER TABLE nodes ADD COLUMN rotate_credential_requested_at BIGINT;
-- A WireGuard key names one node: lookups by key (the rotation's collision check) use it.
CREATE INDEX nodes_wireguard_public_key ON nodes (wireguard_public_key);
