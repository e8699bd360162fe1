-- plexsphere schema, version 12: the Domain signing keys live in the database, sealed under
-- the key-encryption key (KEK) each replica reads from a file or a systemd credential; every
-- replica signs with the same key. Portable SQL: it runs unchanged on SQLite and Postgres.

-- One row per key of a Domain. Generation 1 is the Domain's first key; a rotation adds the next
-- generation with `active_from` in the future (the end of the overlap). The key that signs is
-- the highest generation whose `active_from` has passed; a later one is the announced next key.
-- `sealed_seed` is `v1:` + base64(nonce || ChaCha20-Poly1305 ciphertext || tag) of the Ed25519
-- seed, with the Domain id, the generation and the public key as associated data.
-- `transition` (NULL for generation 1): the new public key signed by the previous key, what a
-- node that missed the overlap verifies.
CREATE TABLE domain_keys (
    domain_id TEXT NOT NULL REFERENCES domains(id),
    generation BIGINT NOT NULL,
    public_key TEXT NOT NULL,
    sealed_seed TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    active_from BIGINT NOT NULL,
    transition TEXT,
    PRIMARY KEY (domain_id, generation)
);
