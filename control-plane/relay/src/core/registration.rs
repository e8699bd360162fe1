//! Registrations: a `register` checked (cookie, proof, token, key generation, room) and bound
//! to its peer, and registrations ended (the lease sweep, and forgetting a replaced one).

use std::time::{Duration, Instant};

use plexsphere_wire::key::PublicKey;
use plexsphere_wire::reach::relay::{
    Frame, FrameKey, LEASE_SECS, RefuseCode, RelayToken, TOKEN_CLOCK_SKEW_SECS, TOKEN_TTL_SECS,
    prefix,
};
use plexsphere_wire::signed::{SignContext, SignedEnvelope};

use super::{Core, Generation, Limit, NodeId, Now, Out, Peer, Registration};
use crate::bucket::TokenBucket;

impl Core {
    /// Drops every registration whose lease (or token) ended, and prunes idle answer buckets.
    pub(super) fn sweep(&mut self, now: Instant) {
        self.strangers.tick(now);
        let (by_peer, by_prefix, by_id) = (&mut self.by_peer, &mut self.by_prefix, &mut self.by_id);
        self.nodes.retain(|key, r| {
            let live = r.expires > now;
            if !live {
                if by_peer.get(&r.peer) == Some(key) {
                    by_peer.remove(&r.peer);
                }
                if by_prefix.get(&prefix(key)) == Some(key) {
                    by_prefix.remove(&prefix(key));
                }
                if by_id.get(&r.id) == Some(key) {
                    by_id.remove(&r.id);
                }
            }
            live
        });
        self.generations.retain(|_, g| g.until > now);
    }

    /// Drops `node`'s registration, its prefix, its node id and its peer's binding.
    pub(super) fn forget(&mut self, node: &PublicKey) {
        if let Some(r) = self.nodes.remove(node) {
            if self.by_peer.get(&r.peer) == Some(node) {
                self.by_peer.remove(&r.peer);
            }
            if self.by_id.get(&r.id) == Some(node) {
                self.by_id.remove(&r.id);
            }
        }
        if self.by_prefix.get(&prefix(node)) == Some(node) {
            self.by_prefix.remove(&prefix(node));
        }
    }

    pub(super) fn register(
        &mut self,
        peer: Peer,
        node: PublicKey,
        cookie: &[u8; 32],
        proof: &[u8; 32],
        token: &[u8],
        now: Now,
    ) -> Option<Out> {
        let addr = self.address(peer)?;
        if !self.cookies.check(addr, &node, cookie, now.unix_secs()) {
            return self.refuse(peer, RefuseCode::BadProof, "the cookie is not from this relay for this address and key, or older than a minute: send hello again", now.at);
        }
        let shared = plexsphere_wire::reach::shared_secret(&self.secret, &node);
        use plexsphere_wire::reach::relay::{proof_matches, sealed_proof_matches};
        let seal = if sealed_proof_matches(&shared, cookie, &node, proof) {
            Some(FrameKey::new(&shared))
        } else if proof_matches(&shared, cookie, &node, proof) {
            None
        } else {
            return self.refuse(peer, RefuseCode::BadProof, "the proof does not match this key and this relay's public key: check the relay key in the node's state", now.at);
        };
        // From here the node proved its key: its refusals are sealed when it asked for that.
        let token = match self.check_token(&node, token, now.unix_secs()) {
            Ok(t) => t,
            Err((code, reason)) => return self.refuse_proved(peer, seal, code, reason, now),
        };
        let id = (token.domain_id, token.node_id);
        if self
            .generations
            .get(&id)
            .is_some_and(|g| g.until > now.at && g.generation > token.key_generation)
        {
            return self.refuse_proved(peer, seal, RefuseCode::BadToken, "the token is for an older key of this node (it rotated its key): register with the token of the current key", now);
        }
        let new_id = !self.nodes.contains_key(&node) && !self.by_id.contains_key(&id);
        if new_id && self.nodes.len() >= self.limits.max_nodes {
            self.sweep(now.at);
            if self.nodes.len() >= self.limits.max_nodes {
                self.hit(Limit::MaxNodes, now.at);
                return self.refuse_proved(peer, seal, RefuseCode::Busy, "this relay has as many nodes registered as it takes (--max-nodes): use another relay", now);
            }
        }
        // The token's end, on the monotonic clock (check_token saw it in the future).
        let left = u64::try_from(token.expires_at)
            .unwrap_or(0)
            .saturating_sub(now.unix_secs());
        let token_end = now.at + Duration::from_secs(left);
        let g = self.generations.entry(id).or_insert(Generation {
            generation: token.key_generation,
            until: token_end,
        });
        if token.key_generation >= g.generation {
            g.until = if token.key_generation > g.generation {
                token_end
            } else {
                g.until.max(token_end)
            };
            g.generation = token.key_generation;
        }
        self.bind(peer, node, id, seal, token_end, now.at);
        self.counters.registrations.inc();
        tracing::debug!(%node, ?peer, "registered");
        let registered = Frame::Registered {
            lease_secs: LEASE_SECS,
        };
        Some(Out {
            to: self.to(peer)?,
            frame: self.seal_for(peer, registered, now.unix_secs()),
        })
    }

    /// A refusal to a node that proved its key: sealed under `seal` when it asked for that.
    fn refuse_proved(
        &mut self,
        peer: Peer,
        seal: Option<FrameKey>,
        code: RefuseCode,
        reason: &str,
        now: Now,
    ) -> Option<Out> {
        let mut out = self.refuse(peer, code, reason, now.at)?;
        if let Some(key) = seal {
            self.counter = (self.counter + 1).max(now.unix_secs().saturating_mul(1_000_000));
            out.frame = key.seal(self.counter, &out.frame);
        }
        Some(out)
    }

    fn check_token(
        &self,
        node: &PublicKey,
        token: &[u8],
        now_unix: u64,
    ) -> Result<RelayToken, (RefuseCode, &'static str)> {
        let env: SignedEnvelope = serde_json::from_slice(token).map_err(|_| {
            (
                RefuseCode::BadToken,
                "the token is not a signed envelope (JSON): send the relay_token of the node's state",
            )
        })?;
        let token: RelayToken = self
            .domains
            .iter()
            .find_map(|d| d.open(SignContext::RelayToken, &env).ok())
            .ok_or((
                RefuseCode::BadToken,
                "the token is not signed by a Domain this relay trusts (--domain-key)",
            ))?;
        if token.public_key != node.to_base64() {
            return Err((
                RefuseCode::BadToken,
                "the token was issued for another WireGuard key",
            ));
        }
        let now = i64::try_from(now_unix).unwrap_or(i64::MAX);
        if token.expires_at <= now {
            return Err((
                RefuseCode::Expired,
                "the token has expired: pull a fresh state from the control plane",
            ));
        }
        if token.expires_at > now.saturating_add(TOKEN_TTL_SECS + TOKEN_CLOCK_SKEW_SECS) {
            return Err((
                RefuseCode::BadToken,
                "the token lives longer than relays accept (10 minutes): upgrade the control plane, or check the relay's clock",
            ));
        }
        Ok(token)
    }

    /// Binds `node` to `peer` (replacing its older binding, whatever key `peer` had, and the
    /// other key of its node id) until the lease or the token ends.
    fn bind(
        &mut self,
        peer: Peer,
        node: PublicKey,
        id: NodeId,
        seal: Option<FrameKey>,
        token_end: Instant,
        now: Instant,
    ) {
        if let Some(old) = self.nodes.get(&node)
            && old.peer != peer
            && self.by_peer.get(&old.peer) == Some(&node)
        {
            self.by_peer.remove(&old.peer);
        }
        if let Some(other) = self.by_peer.insert(peer, node)
            && other != node
        {
            self.forget(&other);
            self.by_peer.insert(peer, node);
        }
        if let Some(other) = self.by_id.insert(id, node)
            && other != node
        {
            // The node's other key (an older generation, or the same one): replaced.
            self.forget(&other);
            self.by_id.insert(id, node);
        }
        if let Some(r) = self.nodes.get(&node)
            && r.id != id
            && self.by_id.get(&r.id) == Some(&node)
        {
            self.by_id.remove(&r.id);
        }
        self.by_prefix.insert(prefix(&node), node);
        let lease = (now + Duration::from_secs(u64::from(LEASE_SECS))).min(token_end);
        let l = &self.limits;
        match self.nodes.get_mut(&node) {
            Some(r) => {
                r.peer = peer;
                r.expires = lease;
                r.id = id;
                r.seal = seal;
            }
            None => {
                self.nodes.insert(
                    node,
                    Registration {
                        peer,
                        expires: lease,
                        id,
                        seal,
                        frames: TokenBucket::new(l.node_frames_per_sec, l.node_frames_per_sec, now),
                        bytes: TokenBucket::new(l.node_bytes_per_sec, l.node_bytes_per_sec, now),
                        answers: TokenBucket::new(
                            l.node_answers_per_sec,
                            l.node_answers_per_sec,
                            now,
                        ),
                    },
                );
            }
        }
    }
}
