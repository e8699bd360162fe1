-- plexsphere schema, version 12: the Domain signing keys live in the database, sealed under
-- the key-encryption key (KEK) each replica reads from a file or a systemd credential; every
-- replica signs with the same key. Portable SQL: it runs unchanged on SQLite and Postgres.

-- One row per key of a Domain. Generation 1 is the Domain's first key (active_from 0). The key
-- that signs is the highest generation whose `active_from` (unix seconds) has passed, so a later
-- rotation can add the next generation with `active_from` at the end of an overlap.
-- `sealed_seed` is `v1:` + base64(nonce || ChaCha20-Poly1305 ciphertext || tag) of the Ed25519
-- seed, with the Domain id, the generation and the public key as associated data.
CREATE TABLE domain_keys (
    domain_id TEXT NOT NULL REFERENCES domains(id),
    generation BIGINT NOT NULL,
    public_key TEXT NOT NULL,
    sealed_seed TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    active_from BIGINT NOT NULL,
    PRIMARY KEY (domain_id, generation)
);
