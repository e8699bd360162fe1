-- plexsphere schema, version 3: the broker's cloud credentials and provisioned resources.
-- Portable SQL: it runs unchanged on SQLite and Postgres.

-- A cloud credential: its payload sealed with ChaCha20-Poly1305 (base64 of the sealed blob,
-- bound to the id) under the key in <data-dir>/credentials.key. Never returned.
CREATE TABLE cloud_credentials (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    provider TEXT NOT NULL,
    sealed_payload TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    revoked_at BIGINT
);

-- A provisioned resource. `provisioning` is the JSON of the phase machine (phase, reason,
-- history); `phase` repeats its phase for queries. `version` settles concurrent writers (the
-- API and the reconcile loop): every update names the version it read.
CREATE TABLE resources (
    id TEXT PRIMARY KEY,
    project_id TEXT NOT NULL REFERENCES projects(id),
    kind TEXT NOT NULL,
    blueprint_version_id TEXT NOT NULL,
    cloud_credential_id TEXT NOT NULL REFERENCES cloud_credentials(id),
    parameters TEXT NOT NULL,
    provisioning TEXT NOT NULL,
    phase TEXT NOT NULL,
    node_id TEXT,
    token_id TEXT,
    composite TEXT,
    provisioned_at BIGINT,
    version BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE INDEX resources_project ON resources (project_id);
CREATE INDEX resources_phase ON resources (phase);
