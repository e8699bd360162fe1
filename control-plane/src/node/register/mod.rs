//! `POST /v1/register`: trade a bootstrap token (one use of it) for a node identity.
//!
//! The token, and the node it already made for the request's WireGuard key if any, are read
//! and judged first (outside any transaction). The transaction that follows starts with a
//! write, a conditional UPDATE that takes one use, so the database settles a race: of the
//! callers racing on a token, only as many as it has uses left change the row; a loser
//! re-reads and lands on the replay rule or finds the token used up. Every registration proves
//! the WireGuard private key of its key over a nonce bound to the token
//! ([`crate::node::key_proof`]). A replay (same token, same WireGuard key, a fresh proof, within
//! [`REPLAY_WINDOW_SECS`] of the node's registration, node never authenticated) gets the same
//! node and a fresh credential, and takes no use; once the node authenticated, never. A live
//! node's key and its first 8 bytes are unique in a Domain: a clash is refused with 409
//! (`key_in_use`, `key_prefix_in_use`, naming the other node), and a unique index on
//! `(domain_id, key_prefix)` among live nodes settles two replicas racing. A transaction lost to a concurrent writer is retried whole. The mesh IP is
//! picked under its range's cursor lock ([`mesh_ips::allocate`]), so concurrent registrations take
//! turns instead of colliding. A new node is announced to the others of its Domain
//! (`peer_added`) in the same transaction.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ipnet::IpNet;
use plexsphere_wire::proof::{Challenge, RegisterChallengeRequest};
use plexsphere_wire::secret::{BootstrapToken, NodeCredential, TokenKind};
use plexsphere_wire::{Intervals, RegisterRequest, RegisterResponse};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::bus::EventBus;
use crate::error::Error;
use crate::keys::Keyring;
use crate::node::decisions;
use crate::store::nodes::NodeRow;
use crate::store::tokens::TokenRow;
use crate::store::{self, Store, StoreError, domains, events, mesh_ips, nodes, projects, tokens};
use plexsphere_wire::node::EventKind;

/// What registration needs besides the request.
pub struct Registrar<'a> {
    pub store: &'a Store,
    pub keys: &'a Keyring,
    pub bus: &'a dyn EventBus,
    pub intervals: Intervals,
}

/// A successful registration: `created` is false for a replay (HTTP 200 instead of 201).
#[derive(Debug)]
pub struct Registered {
    pub response: RegisterResponse,
    pub created: bool,
}

/// Checks every field but the token. The WireGuard key is standard base64 of 32 bytes.
pub(crate) fn validate(req: &RegisterRequest) -> Result<(), Error> {
    let key_ok = req.wireguard_public_key.len() == 44
        && STANDARD
            .decode(&req.wireguard_public_key)
            .is_ok_and(|k| k.len() == 32);
    if !key_ok {
        return Err(Error::Invalid(
            "wireguard_public_key must be the standard base64 of 32 bytes, as `wg pubkey` prints it".into(),
        ));
    }
    let host_ok = (1..=253).contains(&req.hostname.len())
        && req
            .hostname
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if !host_ok {
        return Err(Error::Invalid(
            "hostname must be 1-253 characters of letters, digits, '-', '.' and '_'".into(),
        ));
    }
    if !matches!(req.arch.as_str(), "amd64" | "arm64") {
        return Err(Error::Invalid(format!(
            "arch {:?} is not supported; use amd64 or arm64",
            req.arch
        )));
    }
    if let Some(handle) = &req.resource_handle {
        let ok = (1..=63).contains(&handle.len())
            && handle.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.' | b'_')
            });
        if !ok {
            return Err(Error::Invalid(
                "resource_handle must be 1-63 characters of a-z, 0-9, '-', '.' and '_'".into(),
            ));
        }
    }
    if !plexsphere_wire::version::valid(&req.plexd_version) {
        return Err(Error::Invalid(format!(
            "plexd_version must be {}",
            plexsphere_wire::version::RULE
        )));
    }
    Ok(())
}

/// What a stored token allows, judged at `now` (pure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenVerdict {
    /// Unused and valid: consume it for a new node.
    Fresh,
    /// This token made this node for the request's key within the replay window: a replay
    /// (it takes no use; it succeeds while the node never authenticated).
    Replay(Uuid),
}

/// How long after a node registered it may register with the same token and key again (the
/// replay rule): long enough for a plexd that crashed between the server's commit and saving its
/// identity to come back, short enough that a consumed token and the node's public key (which
/// every peer sees) do not mint a fresh credential for ever.
pub(crate) const REPLAY_WINDOW_SECS: i64 = 600;

/// Judges a token at `now` (pure). `made` is the node this token made for the request's
/// WireGuard key, if any: its id and registration time.
pub(crate) fn judge(
    row: &TokenRow,
    token: &BootstrapToken,
    project_id: Option<Uuid>,
    now: i64,
    made: Option<(Uuid, i64)>,
) -> Result<TokenVerdict, Error> {
    if !store::secret_matches(&token.secret, &row.secret_sha256) {
        return Err(Error::TokenUnknown);
    }
    if row.kind != TokenKind::Node.as_str() || token.kind != TokenKind::Node {
        return Err(Error::TokenKindMismatch);
    }
    if project_id.is_some_and(|p| p != row.project_id) {
        return Err(Error::ProjectMismatch);
    }
    if row.revoked_at.is_some() {
        return Err(Error::TokenRevoked);
    }
    if let Some((node, registered_at)) = made {
        // The same key again: a replay inside the window; past it, the token and the node's
        // public key (every peer sees it) no longer mint a credential, and a second node with
        // that key would clash with the first.
        return if now < registered_at.saturating_add(REPLAY_WINDOW_SECS) {
            Ok(TokenVerdict::Replay(node))
        } else {
            Err(Error::TokenConsumed)
        };
    }
    if row.used_up() {
        return Err(Error::TokenConsumed);
    }
    if row.expires_at <= now {
        return Err(Error::TokenExpired);
    }
    Ok(TokenVerdict::Fresh)
}

impl Registrar<'_> {
    pub async fn register(
        &self,
        req: &RegisterRequest,
        now: OffsetDateTime,
    ) -> Result<Registered, Error> {
        validate(req)?;
        let token = BootstrapToken::parse(&req.bootstrap_token).map_err(|_| Error::TokenUnknown)?;
        let now = store::unix(now);
        // A lost consume race sends us back to re-read the token; twice is always enough
        // (a use is lost only to a token used up, revoked or expired, for good).
        for _ in 0..3 {
            let (row, made) = {
                let mut conn = self.store.acquire().await?;
                let row = tokens::get(&mut conn, &token.id)
                    .await?
                    .ok_or(Error::TokenUnknown)?;
                let made =
                    nodes::made_by_token_with_key(&mut conn, &row.id, &req.wireguard_public_key)
                        .await?
                        .map(|n| (n.id, n.registered_at));
                (row, made)
            };
            let verdict = judge(&row, &token, req.project_id, now, made)?;
            let keys = self.domain_keys(row.project_id).await?;
            crate::node::key_proof::check(
                &crate::node::key_proof::proof_signers(&keys, now),
                req,
                &row.id,
                now,
            )?;
            let outcome = match verdict {
                TokenVerdict::Fresh => {
                    store::retry("register", Error::is_lost_race_or_ip_clash, || {
                        self.create(&row, req, now)
                    })
                    .await?
                }
                TokenVerdict::Replay(node_id) => {
                    store::retry("register replay", Error::is_lost_race, || {
                        self.replay(node_id, req)
                    })
                    .await?
                }
            };
            if let Some(done) = outcome {
                return Ok(done);
            }
        }
        Err(Error::TokenConsumed)
    }

    /// Reads (or makes) the keys of the project's Domain before any transaction (making them
    /// writes on another connection, which on SQLite would wait for the transaction's lock);
    /// the proofs' secrets derive from them.
    pub(crate) async fn domain_keys(&self, project_id: Uuid) -> Result<crate::keys::KeySet, Error> {
        let domain = {
            let mut conn = self.store.acquire().await?;
            let project = projects::get(&mut conn, project_id).await?.ok_or_else(|| {
                Error::Internal(format!("a token names a missing project {project_id}"))
            })?;
            domains::get(&mut conn, project.domain_id)
                .await?
                .ok_or_else(|| {
                    Error::Internal(format!("project {project_id} names a missing domain"))
                })?
        };
        Ok(self.keys.keys(&domain).await?)
    }

    /// One attempt at a new node. `None`: other callers took the token's last use first.
    async fn create(
        &self,
        row: &TokenRow,
        req: &RegisterRequest,
        now: i64,
    ) -> Result<Option<Registered>, Error> {
        let node_id = Uuid::now_v7();
        let mut tx = self.store.begin().await?;
        if !tokens::consume(&mut tx, &row.id, node_id, now).await? {
            return Ok(None);
        }
        let project = projects::get(&mut tx, row.project_id)
            .await?
            .ok_or_else(|| Error::Internal(format!("token {} names a missing project", row.id)))?;
        let domain = domains::get(&mut tx, project.domain_id)
            .await?
            .ok_or_else(|| {
                Error::Internal(format!("project {} names a missing domain", project.id))
            })?;
        let (range, reserved): (IpNet, Vec<IpNet>) = match project.sub_range_cidr {
            Some(sub) => (sub, Vec::new()),
            None => {
                let others = projects::in_domain(&mut tx, domain.id).await?;
                let reserved = others
                    .iter()
                    .filter(|p| p.id != project.id)
                    .filter_map(|p| p.sub_range_cidr)
                    .collect();
                (domain.mesh_cidr, reserved)
            }
        };
        crate::node::key_proof::key_unique(&mut tx, domain.id, &req.wireguard_public_key, None)
            .await?;
        let mesh_ip = mesh_ips::allocate(&mut tx, domain.id, range, &reserved)
            .await?
            .ok_or(Error::MeshRangeExhausted(range))?;
        let credential =
            NodeCredential::generate(node_id).map_err(|e| Error::Internal(e.to_string()))?;
        let node = NodeRow {
            id: node_id,
            domain_id: domain.id,
            project_id: project.id,
            hostname: req.hostname.clone(),
            arch: req.arch.clone(),
            plexd_version: req.plexd_version.clone(),
            mesh_ip,
            wireguard_public_key: req.wireguard_public_key.clone(),
            resource_handle: req.resource_handle.clone(),
            credential_sha256: store::secret_digest(&credential.secret),
            registered_at: now,
            last_seen_at: None,
            revoked_at: None,
            listen_port: None,
            endpoints: Vec::new(),
            reach: crate::store::nodes::NodeReach::default(),
            rotation: crate::store::nodes::NodeRotation::default(),
            host_fingerprint: None,
            report: crate::store::nodes::NodeReport::default(),
            origin: crate::store::nodes::NodeOrigin {
                bootstrap_token_id: Some(row.id.clone()),
                ephemeral_offline_secs: row.usage.ephemeral_offline_secs,
            },
            udp_offload: None,
            // The token's tags, fixed when it was issued (issue 25).
            tags: row.tags.clone(),
            // The host name's (or resource handle's) label, made unique in the Domain (issue 27); a concurrent
            // registration that took it meanwhile makes the unique index refuse this one,
            // and the attempt is retried (`is_lost_race_or_ip_clash`).
            // A broker machine is named by its resource handle, as operators know it.
            dns_name: crate::store::names::pick_for_hostname(
                &mut tx,
                domain.id,
                req.resource_handle.as_deref().unwrap_or(&req.hostname),
            )
            .await?,
        };
        nodes::insert(&mut tx, &node).await?;
        let added = EventKind::PeerAdded {
            peer: decisions::peer_spec(&node),
        };
        let seq = events::append(&mut tx, domain.id, None, node_id, &added, now).await?;
        let (signer, next_key) = self.keys.signing(&domain).await?;
        tx.commit().await.map_err(StoreError::from)?;
        self.bus.notify(domain.id, seq);
        tracing::info!(
            node_id = %node_id, mesh_ip = %mesh_ip, project_id = %project.id, token_id = %row.id,
            token_use = row.uses + 1, token_max_uses = row.usage.max_uses,
            ephemeral_offline_secs = ?row.usage.ephemeral_offline_secs,
            "node registered"
        );
        Ok(Some(Registered {
            response: RegisterResponse {
                node_id,
                domain_id: domain.id,
                project_id: project.id,
                mesh_ip,
                mesh_cidr: domain.mesh_cidr,
                node_credential: credential.expose(),
                domain_signing_public_key: signer.public_key_b64(),
                intervals: self.intervals,
                next_signing_key: next_key,
            },
            created: true,
        }))
    }

    /// One attempt at a replay: the same key, a node that never authenticated.
    async fn replay(
        &self,
        node_id: Uuid,
        req: &RegisterRequest,
    ) -> Result<Option<Registered>, Error> {
        let credential =
            NodeCredential::generate(node_id).map_err(|e| Error::Internal(e.to_string()))?;
        let mut tx = self.store.begin().await?;
        let replaced = nodes::replace_unused_credential(
            &mut tx,
            node_id,
            &req.wireguard_public_key,
            &store::secret_digest(&credential.secret),
        )
        .await?;
        if !replaced {
            return Err(Error::TokenConsumed);
        }
        let node = nodes::get(&mut tx, node_id)
            .await?
            .ok_or_else(|| Error::Internal(format!("node {node_id} vanished during a replay")))?;
        let domain = domains::get(&mut tx, node.domain_id)
            .await?
            .ok_or_else(|| Error::Internal(format!("node {node_id} names a missing domain")))?;
        let (signer, next_key) = self.keys.signing(&domain).await?;
        tx.commit().await.map_err(StoreError::from)?;
        tracing::info!(node_id = %node_id, mesh_ip = %node.mesh_ip, project_id = %node.project_id, "node registration replayed");
        Ok(Some(Registered {
            response: RegisterResponse {
                node_id,
                domain_id: domain.id,
                project_id: node.project_id,
                mesh_ip: node.mesh_ip,
                mesh_cidr: domain.mesh_cidr,
                node_credential: credential.expose(),
                domain_signing_public_key: signer.public_key_b64(),
                intervals: self.intervals,
                next_signing_key: next_key,
            },
            created: false,
        }))
    }
}

impl Registrar<'_> {
    /// `POST /v1/register/challenge`: a nonce for a registration with this token
    /// ([`crate::node::key_proof`]).
    pub async fn challenge(
        &self,
        req: &RegisterChallengeRequest,
        now: i64,
    ) -> Result<Challenge, Error> {
        let token = BootstrapToken::parse(&req.bootstrap_token).map_err(|_| Error::TokenUnknown)?;
        let row = {
            let mut conn = self.store.acquire().await?;
            tokens::get(&mut conn, &token.id)
                .await?
                .ok_or(Error::TokenUnknown)?
        };
        if !store::secret_matches(&token.secret, &row.secret_sha256) {
            return Err(Error::TokenUnknown);
        }
        if row.kind != TokenKind::Node.as_str() || token.kind != TokenKind::Node {
            return Err(Error::TokenKindMismatch);
        }
        if row.revoked_at.is_some() {
            return Err(Error::TokenRevoked);
        }
        let keys = self.domain_keys(row.project_id).await?;
        crate::node::key_proof::challenge(&keys.current(now).signer, &row.id, now)
    }
}

impl Error {
    /// A lost race, or two writers that picked the same mesh IP (the unique index refused one).
    pub(crate) fn is_lost_race_or_ip_clash(&self) -> bool {
        self.is_lost_race() || matches!(self, Error::Store(e) if e.is_unique_violation())
    }
}

#[cfg(test)]
mod tests;
