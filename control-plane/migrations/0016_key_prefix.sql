-- plexsphere schema, version 16: a live node's WireGuard key, and its first 8 bytes (the
-- prefix relay frames name nodes by), are unique in a Domain. Portable SQL: it runs unchanged
-- on SQLite and Postgres.

-- The key's first 8 bytes as standard base64 without padding (11 characters): the key's first
-- 10 base64 characters and its 11th with the two low bits cleared (the 11th character of each
-- group of four in the alphabet). plexsphere writes it with every key (registration, key
-- rotation); `plexsphere_wire::proof::key_prefix` computes the same.
ALTER TABLE nodes ADD COLUMN key_prefix TEXT;

UPDATE nodes SET key_prefix = substr(wireguard_public_key, 1, 10) || CASE
    WHEN substr(wireguard_public_key, 11, 1) IN ('A', 'B', 'C', 'D') THEN 'A'
    WHEN substr(wireguard_public_key, 11, 1) IN ('E', 'F', 'G', 'H') THEN 'E'
    WHEN substr(wireguard_public_key, 11, 1) IN ('I', 'J', 'K', 'L') THEN 'I'
    WHEN substr(wireguard_public_key, 11, 1) IN ('M', 'N', 'O', 'P') THEN 'M'
    WHEN substr(wireguard_public_key, 11, 1) IN ('Q', 'R', 'S', 'T') THEN 'Q'
    WHEN substr(wireguard_public_key, 11, 1) IN ('U', 'V', 'W', 'X') THEN 'U'
    WHEN substr(wireguard_public_key, 11, 1) IN ('Y', 'Z', 'a', 'b') THEN 'Y'
    WHEN substr(wireguard_public_key, 11, 1) IN ('c', 'd', 'e', 'f') THEN 'c'
    WHEN substr(wireguard_public_key, 11, 1) IN ('g', 'h', 'i', 'j') THEN 'g'
    WHEN substr(wireguard_public_key, 11, 1) IN ('k', 'l', 'm', 'n') THEN 'k'
    WHEN substr(wireguard_public_key, 11, 1) IN ('o', 'p', 'q', 'r') THEN 'o'
    WHEN substr(wireguard_public_key, 11, 1) IN ('s', 't', 'u', 'v') THEN 's'
    WHEN substr(wireguard_public_key, 11, 1) IN ('w', 'x', 'y', 'z') THEN 'w'
    WHEN substr(wireguard_public_key, 11, 1) IN ('0', '1', '2', '3') THEN '0'
    WHEN substr(wireguard_public_key, 11, 1) IN ('4', '5', '6', '7') THEN '4'
    ELSE '8'
END;

-- Rows from before this version may already clash (two live nodes with one key or one
-- prefix): the oldest of each group keeps its prefix, the others get none (they stay as they
-- are, outside the index; plexsphere refuses any new clash with them by their key). Revoked
-- nodes are outside the index anyway.
UPDATE nodes SET key_prefix = NULL
WHERE revoked_at IS NULL AND EXISTS (
    SELECT 1 FROM nodes o
    WHERE o.domain_id = nodes.domain_id AND o.revoked_at IS NULL
      AND o.key_prefix = nodes.key_prefix
      AND (o.registered_at < nodes.registered_at
           OR (o.registered_at = nodes.registered_at AND o.id < nodes.id))
);

CREATE UNIQUE INDEX nodes_live_key_prefix ON nodes (domain_id, key_prefix)
    WHERE revoked_at IS NULL;
