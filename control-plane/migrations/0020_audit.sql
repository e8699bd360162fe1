-- plexsphere schema, version 20: the audit log (issue 28, docs/audit.md). Portable SQL: it runs
-- unchanged on SQLite and Postgres.

-- One row per chain: the platform chain ('platform') and one per Domain (its id). `seq` is the
-- last appended row's number (0: none yet) and `head_hash` its hash (64 zeros: none yet);
-- `mac` is HMAC-SHA256 under the chain's key over both, so a database-only writer cannot move
-- the head. An append bumps `seq` first (`UPDATE ... SET seq = seq + 1 RETURNING`), which
-- serializes the appends of one chain across replicas.
CREATE TABLE audit_chains (
    chain_id TEXT PRIMARY KEY,
    seq BIGINT NOT NULL,
    head_hash TEXT NOT NULL,
    mac TEXT NOT NULL
);

-- The rows. `hash` is SHA-256 over the canonical encoding of every other column but `mac`
-- (docs/audit.md, "The encoding"); `prev_hash` is the previous row's `hash`; `mac` is
-- HMAC-SHA256 under the chain's key over `hash`. People are stored only keyed:
-- `actor_subject` and `actor_email` are HMAC-SHA256 under the chain's key (hex, '' when
-- absent). Times are unix seconds; `detail` is canonical JSON.
CREATE TABLE audit_log (
    chain_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    at BIGINT NOT NULL,
    actor_kind TEXT NOT NULL,
    actor_ref TEXT NOT NULL,
    actor_name TEXT NOT NULL,
    actor_subject TEXT NOT NULL,
    actor_email TEXT NOT NULL,
    how TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    detail TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL,
    mac TEXT NOT NULL,
    PRIMARY KEY (chain_id, seq)
);
CREATE INDEX audit_log_at ON audit_log (chain_id, at);
