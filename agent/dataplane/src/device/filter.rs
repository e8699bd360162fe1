//! The device's side of the access policy: installing a filter (each peer's slot in it, its
//! flows forgotten when the new filter would not open them) and the decision on each packet,
//! counted and logged at a bounded rate when it drops.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::allowed_ips::AllowedIps;
use crate::key::PublicKey;
use crate::peer::{Peer, PeerState};
use crate::policy::PeerPolicy;
use crate::policy::PolicyFilter;
use plexsphere_policy::{Decision, decide};

use super::{Device, State};

/// Gives every peer its slot in the policy filter: the filter's peer whose mesh address
/// the peer's allowed IPs route (once per filter or peer change, never per packet).
pub(crate) fn resolve_policy_slots(state: &State) {
    let Some(policy) = &state.policy else {
        for peer in state.peers.values() {
            peer.lock().policy.slot = None;
        }
        return;
    };
    let slots = policy_slots(policy, &state.routes);
    for (key, peer) in &state.peers {
        peer.lock().policy.slot = slots.get(key).copied();
    }
}

/// Per WireGuard peer, its slot in `policy`: the filter's peer whose mesh address its
/// allowed IPs route (a route prefix never holds a mesh address, so a router's extra
/// prefixes change nothing here).
fn policy_slots(
    policy: &PolicyFilter,
    routes: &AllowedIps<Arc<Peer>>,
) -> HashMap<PublicKey, plexsphere_policy::PeerRef> {
    let mut slots: HashMap<PublicKey, plexsphere_policy::PeerRef> = HashMap::new();
    for (slot, addrs) in &policy.peers {
        for a in addrs {
            if let Some(peer) = routes.get(*a) {
                slots.entry(peer.public_key()).or_insert(*slot);
            }
        }
    }
    slots
}

impl Device {
    /// Installs the access policy's filter (None: no filter), atomically for every lane:
    /// packets decided after this call use it. The flows the new filter would not let this
    /// node open are forgotten in the same step, so a revoked flow's replies stop with it.
    pub fn set_policy(&self, policy: Option<PolicyFilter>) {
        let mut state = self.write();
        // Each peer's flows are pruned with its slot in the new filter: a route flow's
        // remote address (a host behind the peer) names no peer of the filter.
        let slots = policy.as_ref().map(|p| policy_slots(p, &state.routes));
        for (key, peer) in &state.peers {
            let flows = &mut peer.lock().policy.flows;
            match (&policy, &slots) {
                (Some(p), Some(slots)) => {
                    decide::prune_peer_flows(&p.filter, slots.get(key).copied(), flows);
                }
                _ => *flows = PeerPolicy::flow_table(),
            }
        }
        state.policy = policy;
        resolve_policy_slots(&state);
    }

    /// The installed filter's version and why it is closed, if it is (None: no filter).
    pub fn policy(&self) -> Option<(Option<u64>, Option<String>)> {
        self.read()
            .policy
            .as_ref()
            .map(|p| (p.version(), p.closed_reason().map(str::to_owned)))
    }

    /// The flows in the peers' flow tables.
    pub fn policy_flows(&self) -> usize {
        self.read()
            .peers
            .values()
            .map(|p| p.lock().policy.flows.len())
            .sum()
    }

    /// The policy's decision on a packet to or from `peer`; a drop is counted and logged
    /// at a bounded rate. Always true without a filter.
    pub(super) fn policy_passes(
        &self,
        state: &State,
        peer: &Peer,
        p: &mut PeerState,
        inbound: bool,
        packet: &[u8],
        now: Instant,
    ) -> bool {
        let Some(policy) = &state.policy else {
            return true;
        };
        // The peer's own flow table, under the peer's lock the caller holds: both lanes
        // take it for this peer anyway, so a reply finds its flow on any lane, at no extra
        // lock.
        let (slot, flows) = (p.policy.slot, &mut p.policy.flows);
        let decision = if inbound {
            decide::inbound_bytes(&policy.filter, slot, packet, flows, now)
        } else {
            decide::outbound_bytes(&policy.filter, slot, packet, flows, now)
        };
        match decision {
            Decision::Accept(_) => true,
            Decision::Drop(why) => {
                self.counters.policy.count(inbound, &why);
                let slot = p.policy.slot;
                let name = || match slot {
                    Some(slot) => policy.filter.peer_name(slot).to_owned(),
                    None => peer.public_key().to_string(),
                };
                p.policy.log(name, inbound, &why, now);
                false
            }
        }
    }
}
