//! What an enrolled node (and an operator revoking one) changes, one transaction per call.
//!
//! Every change that concerns other nodes appends one small event (a delta) to the Domain's
//! log in the same transaction as the change; the bus is told only after the commit, so a
//! woken stream always finds the row. A transaction that loses a race is retried whole.

use std::net::{IpAddr, SocketAddr};

use plexsphere_wire::node::{EndpointAck, EndpointReport, EventKind, Heartbeat, RelaySpec};
use plexsphere_wire::signed::{SignContext, SignedEnvelope};
use uuid::Uuid;

use crate::bus::EventBus;
use crate::candidates;
use crate::error::Error;
use crate::keys::Keyring;
use crate::node::decisions;
use crate::node::live_cache::LiveCache;
use crate::policy::cache::{PolicyCache, policy_version};
use crate::store::domains::Domain;
use crate::store::nodes::{HeartbeatRecord, NodeReach, NodeRow};
use crate::store::{self, Store, StoreError, domains, events, nodes, projects};

const GONE: &str =
    "this node no longer exists (deleted); register it again with a fresh bootstrap token";

/// The node API's operations over one store, key ring and bus, with the server's reach
/// settings (the relays and STUN servers every state lists).
pub struct NodeOps<'a> {
    pub store: &'a Store,
    pub keys: &'a Keyring,
    pub bus: &'a dyn EventBus,
    pub relays: &'a [RelaySpec],
    pub stun: &'a [SocketAddr],
    /// Each Domain's compiled access policy.
    pub policies: &'a PolicyCache,
    /// Each Domain's live node rows at the newest head a state build read.
    pub live: &'a LiveCache,
}

impl NodeOps<'_> {
    /// Records a heartbeat; answers the Domain's current state version and a fresh relay
    /// token (so a node whose state does not change still never runs out of one).
    pub async fn heartbeat(
        &self,
        node: &NodeRow,
        hb: &Heartbeat,
        now: i64,
    ) -> Result<(u64, SignedEnvelope), Error> {
        if !plexsphere_wire::version::valid(&hb.plexd_version) {
            return Err(Error::Invalid(format!(
                "plexd_version must be {}",
                plexsphere_wire::version::RULE
            )));
        }
        let record = HeartbeatRecord {
            plexd_version: &hb.plexd_version,
            uptime_secs: hb.uptime_secs,
            applied_state_version: hb.state_version,
            peers_configured: hb.peers.configured,
            peers_connected: hb.peers.connected,
            at: now,
        };
        let found = store::retry("heartbeat", StoreError::is_busy, || {
            self.heartbeat_attempt(node.id, &record)
        })
        .await?;
        if !found {
            return Err(Error::Unauthorized(GONE));
        }
        let mut conn = self.store.acquire().await?;
        let version = events::head(&mut conn, node.domain_id).await?.seq;
        let domain = domain_of(&mut conn, node).await?;
        Ok((version, self.relay_token(&domain, node, now).await?))
    }

    /// `node`'s relay token, signed by its Domain.
    async fn relay_token(
        &self,
        domain: &Domain,
        node: &NodeRow,
        now: i64,
    ) -> Result<SignedEnvelope, Error> {
        self.keys
            .signer(domain)
            .await?
            .sign(SignContext::RelayToken, &decisions::relay_token(node, now))
            .map_err(|e| Error::Internal(format!("cannot encode a relay token: {e}")))
    }

    /// Checks the node's report (`candidates.rs`'s table), stores its candidates, home relay
    /// and NAT report, and tells its peers when the advertised endpoints or the home relay
    /// changed (a report that changes nothing writes nothing).
    pub(crate) async fn report_endpoints(
        &self,
        node: &NodeRow,
        report: &EndpointReport,
        observed: IpAddr,
        now: i64,
    ) -> Result<EndpointAck, Error> {
        let mesh = {
            let mut conn = self.store.acquire().await?;
            domain_of(&mut conn, node).await?.mesh_cidr
        };
        let checked = candidates::accept(report, observed, mesh, self.relays).map_err(|e| {
            tracing::info!(node_id = %node.id, error = %e, "endpoint report refused");
            Error::EndpointRefused(e)
        })?;
        let advertised = checked.advertised();
        let reach = NodeReach {
            candidates: checked,
            home_relay: report.home_relay.clone(),
            nat: Some(report.nat.clone()),
        };
        let seq = store::retry("endpoint report", Error::is_lost_race, || {
            self.endpoints_attempt(node.id, report.listen_port, &advertised, &reach, now)
        })
        .await?;
        if let Some((domain, s)) = seq {
            tracing::info!(node_id = %node.id, endpoints = ?advertised, home_relay = ?reach.home_relay, seq = s, "node endpoints changed");
            self.bus.notify(domain, s);
        }
        Ok(EndpointAck {
            observed: SocketAddr::new(observed, report.listen_port),
            endpoints: advertised,
        })
    }

    /// The node's desired state, signed by its Domain; the version is read before the peers,
    /// so the document is never older than its version (a newer one only repeats a delta).
    /// Its peers are the live nodes the Domain's policy connects to it, and it carries the
    /// policy version and the node's compiled view (the compile is cached per Domain).
    pub(crate) async fn signed_state(
        &self,
        node_id: Uuid,
        now: i64,
    ) -> Result<(u64, SignedEnvelope), Error> {
        let mut conn = self.store.acquire().await?;
        let me = nodes::get(&mut conn, node_id)
            .await?
            .ok_or(Error::Unauthorized(GONE))?;
        let version = events::head(&mut conn, me.domain_id).await?.seq;
        let domain = domain_of(&mut conn, &me).await?;
        let live = self.live.live(&mut conn, me.domain_id, version).await?;
        let projects = projects::in_domain(&mut conn, me.domain_id).await?;
        let policy_version = policy_version(&mut conn, me.domain_id).await?;
        let extras = decisions::Extras {
            dns_suffix: crate::store::names::suffix(&mut conn, me.domain_id).await?,
            served: crate::routes::ops::served(&mut conn, me.id).await?,
        };
        let routes = crate::routes::ops::route_inventory(&mut conn, me.domain_id).await?;
        drop(conn);
        let policy = self
            .policies
            .get(
                self.store,
                me.domain_id,
                policy_version,
                &live,
                &projects,
                &routes,
                version,
            )
            .await?;
        let token = self.relay_token(&domain, &me, now).await?;
        let reach = decisions::Reach {
            relays: self.relays,
            stun: self.stun,
            relay_token: &token,
        };
        let (signer, next_key) = self.keys.signing(&domain).await?;
        let doc = decisions::node_state(
            &me, &domain, &live, version, now, reach, next_key, &policy, &extras,
        );
        let env = signer
            .sign(SignContext::NodeState, &doc)
            .map_err(|e| Error::Internal(format!("cannot encode a node state: {e}")))?;
        Ok((version, env))
    }

    /// `DELETE /v1/nodes/{id}`: deletes the node; its peers get `peer_removed`, the node
    /// `node_revoked` (which ends its open streams). Answers false when it was already gone.
    pub(crate) async fn leave(&self, node_id: Uuid, now: i64) -> Result<bool, Error> {
        let done = store::retry("leave", Error::is_lost_race, || {
            self.delete_attempt(node_id, now, |_, _| true)
        })
        .await?;
        let Some((node, seq)) = done else {
            return Ok(false);
        };
        tracing::info!(node_id = %node.id, mesh_ip = %node.mesh_ip, "node left the mesh (deleted)");
        self.bus.notify(node.domain_id, seq);
        Ok(true)
    }

    /// Removes an ephemeral node that stayed offline past its allowance (the maintenance task's
    /// sweep): deleted like a node that left, so its peers get `peer_removed`, its open
    /// streams `node_revoked`, and its mesh IP is free again. Answers false when it was gone already or came back online
    /// meanwhile (the row is re-read in the transaction).
    pub(crate) async fn remove_ephemeral(&self, node_id: Uuid, now: i64) -> Result<bool, Error> {
        let done = store::retry("remove ephemeral node", Error::is_lost_race, || {
            self.delete_attempt(node_id, now, decisions::ephemeral_expired)
        })
        .await?;
        let Some((node, seq)) = done else {
            return Ok(false);
        };
        tracing::info!(
            node_id = %node.id, mesh_ip = %node.mesh_ip, hostname = %node.hostname,
            last_seen_at = ?node.last_seen_at,
            ephemeral_offline_secs = ?node.origin.ephemeral_offline_secs,
            "ephemeral node removed (offline longer than its token allows); its peers drop it and its mesh IP is free"
        );
        self.bus.notify(node.domain_id, seq);
        Ok(true)
    }

    /// Revokes a node (idempotent): its peers get `peer_removed`, the node `node_revoked`,
    /// its credential stops working. Answers the node as it is now, `None` when unknown.
    pub async fn revoke(&self, node_id: Uuid, now: i64) -> Result<Option<NodeRow>, Error> {
        let done = store::retry("revoke node", Error::is_lost_race, || {
            self.revoke_attempt(node_id, now)
        })
        .await?;
        let Some((node, seq)) = done else {
            return Ok(None);
        };
        if let Some(seq) = seq {
            tracing::info!(node_id = %node.id, mesh_ip = %node.mesh_ip, "node revoked");
            self.bus.notify(node.domain_id, seq);
        }
        Ok(Some(node))
    }

    async fn heartbeat_attempt(
        &self,
        node_id: Uuid,
        record: &HeartbeatRecord<'_>,
    ) -> Result<bool, StoreError> {
        let mut conn = self.store.acquire().await?;
        nodes::record_heartbeat(&mut conn, node_id, record).await
    }

    /// One attempt: `Some((domain, seq))` when an `endpoint_changed` was appended.
    async fn endpoints_attempt(
        &self,
        node_id: Uuid,
        listen_port: u16,
        advertised: &[SocketAddr],
        reach: &NodeReach,
        now: i64,
    ) -> Result<Option<(Uuid, u64)>, Error> {
        let mut tx = self.store.begin().await?;
        let node = nodes::get(&mut tx, node_id)
            .await?
            .ok_or(Error::Unauthorized(GONE))?;
        // Peers hear of what their state carries: the endpoints and the home relay.
        let peers_see_the_same =
            node.endpoints == advertised && node.reach.home_relay == reach.home_relay;
        if peers_see_the_same && node.listen_port == Some(listen_port) && node.reach == *reach {
            return Ok(None);
        }
        nodes::set_endpoints(&mut tx, node_id, listen_port, advertised, reach).await?;
        let mut seq = None;
        if !peers_see_the_same {
            let kind = EventKind::EndpointChanged {
                peer_node_id: node_id,
                endpoints: advertised.to_vec(),
                home_relay: reach.home_relay.clone(),
            };
            seq = Some(events::append(&mut tx, node.domain_id, None, node_id, &kind, now).await?);
        }
        tx.commit().await.map_err(StoreError::from)?;
        Ok(seq.map(|s| (node.domain_id, s)))
    }

    /// Deletes the node in one transaction if `due` still holds for its row, and tells its
    /// peers (a revoked node's were told already). Answers the row and the seq to announce.
    async fn delete_attempt(
        &self,
        node_id: Uuid,
        now: i64,
        due: fn(&NodeRow, i64) -> bool,
    ) -> Result<Option<(NodeRow, u64)>, Error> {
        let mut tx = self.store.begin().await?;
        let Some(node) = nodes::get(&mut tx, node_id).await? else {
            return Ok(None);
        };
        if !due(&node, now) || !nodes::delete(&mut tx, node_id).await? {
            return Ok(None);
        }
        let seq = if node.revoked_at.is_none() {
            removal_events(&mut tx, &node, now).await?
        } else {
            events::head(&mut tx, node.domain_id).await?.seq
        };
        tx.commit().await.map_err(StoreError::from)?;
        Ok(Some((node, seq)))
    }

    async fn revoke_attempt(
        &self,
        node_id: Uuid,
        now: i64,
    ) -> Result<Option<(NodeRow, Option<u64>)>, Error> {
        let mut tx = self.store.begin().await?;
        let changed = nodes::revoke(&mut tx, node_id, now).await?;
        let Some(node) = nodes::get(&mut tx, node_id).await? else {
            return Ok(None);
        };
        let seq = if changed {
            Some(removal_events(&mut tx, &node, now).await?)
        } else {
            None
        };
        tx.commit().await.map_err(StoreError::from)?;
        Ok(Some((node, seq)))
    }
}

/// The Domain `node` belongs to.
async fn domain_of(conn: &mut sqlx::AnyConnection, node: &NodeRow) -> Result<Domain, Error> {
    domains::get(conn, node.domain_id).await?.ok_or_else(|| {
        Error::Internal(format!(
            "node {} names a missing domain {}",
            node.id, node.domain_id
        ))
    })
}

/// `peer_removed` to every other node, then `node_revoked` to the node; answers the last seq.
async fn removal_events(
    tx: &mut sqlx::AnyConnection,
    node: &NodeRow,
    now: i64,
) -> Result<u64, StoreError> {
    let removed = EventKind::PeerRemoved {
        peer_node_id: node.id,
        public_key: node.wireguard_public_key.clone(),
    };
    events::append(tx, node.domain_id, None, node.id, &removed, now).await?;
    crate::store::paths::forget_node(tx, node.id).await?;
    events::append(
        tx,
        node.domain_id,
        Some(node.id),
        node.id,
        &EventKind::NodeRevoked,
        now,
    )
    .await
}
