-- plexsphere schema, version 17: access policy as code (issue 25). Tags on nodes and on
-- bootstrap tokens, and the versioned policy document of each Domain. Portable SQL: it runs
-- unchanged on SQLite and Postgres.

-- A node's tags and a token's tags: names without `tag:` (1 to 64 of `A-Z a-z 0-9 - _ .`,
-- the policy crate's name rule), sorted, without duplicates, joined by single spaces; ''
-- is no tag. A column, not a table: every node query reads it with the row (no join, no
-- per-node query), and a node's tags go with the node when it is deleted. A token's tags are
-- fixed when it is issued; the node it makes gets them at registration.
ALTER TABLE nodes ADD COLUMN tags TEXT NOT NULL DEFAULT '';
ALTER TABLE bootstrap_tokens ADD COLUMN tags TEXT NOT NULL DEFAULT '';

-- Every version of every Domain's policy document, append-only: a change or a rollback
-- stores a new version (the previous one + 1). `author` is who stored it (an operator token
-- name and id, or `plexsphere` for the default); `summary` is the reachability diff against
-- the version before it, as it read when stored (lines "a -> b: gains tcp 5432").
CREATE TABLE policies (
    domain_id TEXT NOT NULL REFERENCES domains(id),
    version BIGINT NOT NULL,
    document TEXT NOT NULL,
    author TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    summary TEXT NOT NULL,
    PRIMARY KEY (domain_id, version)
);

-- Every Domain always has a current document: version 1 is the explicit allow-all
-- (`plexsphere_policy::document::DEFAULT_DOCUMENT`, byte for byte; a test pins it), in force
-- since the Domain was created, so existing meshes behave as before and what they allow is
-- visible. plexsphere stores the same version 1 for every Domain it creates.
INSERT INTO policies (domain_id, version, document, author, created_at, summary)
SELECT id, 1, '# The default access policy of a Domain: every node may reach every other node on every
# protocol and port. Replace this rule to restrict; `rules: []` denies everything.
# docs/policy.md describes the syntax.
rules:
  - name: allow-all
    src: ''*''
    dst: ''*''
    proto: any
', 'plexsphere', created_at, 'the default document: every node may reach every node on every protocol and port'
FROM domains;
