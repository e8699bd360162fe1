//! The names plexd answers (docs/dns.md): with every apply of the peers, the core builds the
//! name table from the signed state's `dns`, the peers it applies and the policy view, and
//! hands it to the resolver as [`Effect::Dns`] when it differs from the last one (a state
//! without names, from a server older than them, sends nothing).

use std::sync::Arc;

use plexsphere_wire::node::PeerSpec;

use super::{Core, Effect};
use crate::dns::zone::{Zone, ZoneInput};

impl Core {
    /// Called with every peer set sent to the mesh.
    pub(super) fn feed_names(&mut self, peers: &[PeerSpec]) {
        if !self.config.dns.enabled {
            return;
        }
        let view = self.policy.as_ref().map(|p| &p.view);
        let mut own = vec![self.id.mesh_ip];
        for a in view.map(|v| v.addrs.as_slice()).unwrap_or_default() {
            if !own.contains(a) {
                own.push(*a);
            }
        }
        let zone = Zone::build(ZoneInput {
            dns: self.dns.as_ref(),
            own_addrs: &own,
            mesh: self.id.mesh_cidr,
            peers,
            view,
        });
        if self.dns_sent.as_deref() == zone.as_ref() {
            return;
        }
        let zone = zone.map(Arc::new);
        self.dns_sent = zone.clone();
        self.emit(Effect::Dns(zone));
    }
}
