-- plexsphere schema, version 19: people sign in through an OpenID issuer (issue 28). Portable
-- SQL: it runs unchanged on SQLite and Postgres. Times are unix seconds; digests hex SHA-256.

-- A sign-in in progress, from /v1/auth/sign-in to its callback: single use (the callback
-- deletes the row), bound to the browser that started it (the digest of its short-lived
-- HttpOnly sign-in cookie), expiring after auth::session::PENDING_SIGN_IN_TTL.
CREATE TABLE auth_pending (
    state_sha256 TEXT PRIMARY KEY,
    browser_sha256 TEXT NOT NULL,
    nonce TEXT NOT NULL,
    pkce_verifier TEXT NOT NULL,
    return_to TEXT NOT NULL,
    client_key TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX auth_pending_client ON auth_pending (client_key);

-- A person's session: only the SHA-256 of its secret (`pxss_<id>_<secret>`); `kind` is
-- 'cookie' (the console; `csrf_sha256` the digest of its CSRF value) or 'bearer' (plexctl).
-- The person's claims as the ID token had them at sign-in; roles are computed from these and
-- the current role bindings at every request.
CREATE TABLE auth_sessions (
    id TEXT PRIMARY KEY,
    secret_sha256 TEXT NOT NULL,
    kind TEXT NOT NULL,
    csrf_sha256 TEXT,
    issuer TEXT NOT NULL,
    subject TEXT NOT NULL,
    email TEXT,
    name TEXT,
    groups_json TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    last_seen_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    revoked_at BIGINT,
    revoked_reason TEXT
);

-- ID tokens plexctl exchanged for a session (their digests), kept until they expire: each is
-- accepted once.
CREATE TABLE auth_used_id_tokens (
    token_sha256 TEXT PRIMARY KEY,
    expires_at BIGINT NOT NULL
);

-- Roles: `role` admin | auditor | member on `scope_kind` platform | domain | project
-- (`scope_id` '' for platform), bound to the issuer's subject, an e-mail address or a group
-- (`principal_kind` subject | email | group).
CREATE TABLE role_bindings (
    id TEXT PRIMARY KEY,
    role TEXT NOT NULL,
    scope_kind TEXT NOT NULL,
    scope_id TEXT NOT NULL,
    principal_kind TEXT NOT NULL,
    principal TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    created_by TEXT NOT NULL
);
CREATE UNIQUE INDEX role_bindings_unique
    ON role_bindings (role, scope_kind, scope_id, principal_kind, principal);
