-- plexsphere schema, version 11: reusable bootstrap tokens with a use limit, ephemeral nodes
-- (removed by the control plane once offline for a configured time), and the token each node
-- registered with. Portable SQL: it runs unchanged on SQLite and Postgres.

-- How many nodes the token may make (1 = single use, what every older token is) and how many
-- it made. `consumed_at` is set when the last use is taken; `consumed_by_node` names the node
-- of that last use.
ALTER TABLE bootstrap_tokens ADD COLUMN max_uses BIGINT NOT NULL DEFAULT 1;
ALTER TABLE bootstrap_tokens ADD COLUMN uses BIGINT NOT NULL DEFAULT 0;
UPDATE bootstrap_tokens SET uses = 1 WHERE consumed_at IS NOT NULL;
-- Seconds: the nodes the token makes are ephemeral, removed once offline this long. NULL: not
-- ephemeral.
ALTER TABLE bootstrap_tokens ADD COLUMN ephemeral_offline_secs BIGINT;

-- The token the node registered with (NULL for nodes older than version 11 whose token is
-- gone), and the node's own copy of the token's ephemeral setting.
ALTER TABLE nodes ADD COLUMN bootstrap_token_id TEXT;
ALTER TABLE nodes ADD COLUMN ephemeral_offline_secs BIGINT;
UPDATE nodes SET bootstrap_token_id =
    (SELECT t.id FROM bootstrap_tokens t WHERE t.consumed_by_node = nodes.id);
-- The replay rule looks a node up by its token and WireGuard key.
CREATE INDEX nodes_bootstrap_token ON nodes (bootstrap_token_id);
