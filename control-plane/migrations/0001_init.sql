-- plexsphere schema, version 1. Portable SQL: it runs unchanged on SQLite and Postgres.
-- UUIDs are TEXT, timestamps BIGINT unix seconds, digests lowercase hex TEXT.

CREATE TABLE domains (
    id TEXT PRIMARY KEY,
    slug TEXT NOT NULL UNIQUE,
    mesh_cidr TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE TABLE projects (
    id TEXT PRIMARY KEY,
    domain_id TEXT NOT NULL REFERENCES domains(id),
    slug TEXT NOT NULL,
    display_name TEXT,
    sub_range_cidr TEXT,
    created_at BIGINT NOT NULL,
    UNIQUE (domain_id, slug)
);

CREATE TABLE bootstrap_tokens (
    id TEXT PRIMARY KEY,
    project_id TEXT NOT NULL REFERENCES projects(id),
    kind TEXT NOT NULL,
    env_prefix TEXT NOT NULL,
    secret_sha256 TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    consumed_at BIGINT,
    consumed_by_node TEXT,
    revoked_at BIGINT,
    resource_id TEXT
);

CREATE INDEX bootstrap_tokens_project ON bootstrap_tokens (project_id);

CREATE TABLE nodes (
    id TEXT PRIMARY KEY,
    domain_id TEXT NOT NULL REFERENCES domains(id),
    project_id TEXT NOT NULL REFERENCES projects(id),
    hostname TEXT NOT NULL,
    arch TEXT NOT NULL,
    plexd_version TEXT NOT NULL,
    mesh_ip TEXT NOT NULL,
    wireguard_public_key TEXT NOT NULL,
    resource_handle TEXT,
    credential_sha256 TEXT NOT NULL,
    registered_at BIGINT NOT NULL,
    last_seen_at BIGINT,
    revoked_at BIGINT
);

-- A live node's mesh IP is unique in its Domain; a revoked node gives its address back.
CREATE UNIQUE INDEX nodes_live_mesh_ip ON nodes (domain_id, mesh_ip) WHERE revoked_at IS NULL;
CREATE INDEX nodes_project ON nodes (project_id);

CREATE TABLE operator_tokens (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    secret_sha256 TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    revoked_at BIGINT
);
