//! The names plexd answers (docs/dns.md): with every apply of the peers, the core builds the
//! name table from the signed state's `dns`, the peers it applies and the policy view, and
//! hands it to the resolver as [`Effect::Dns`] when it differs from the last one (a state
//! without names, from a server older than them, sends nothing).
//!
//! Building the table costs about 20 ms at 10,000 peers, and most applies change endpoints or
//! keys, not names: the core first hashes what the table is built from ([`names_key`], well
//! under a millisecond there) and builds only when that changed.

use std::hash::{DefaultHasher, Hash as _, Hasher as _};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use plexsphere_policy::view::NodeView;
use plexsphere_wire::routes::DnsState;

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
        let key = names_key(self.dns.as_ref(), &own, self.id.mesh_cidr, peers, view);
        if self.dns_key == Some(key) {
            return;
        }
        self.dns_key = Some(key);
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

/// A hash of everything [`Zone::build`] reads: the state's `dns`, this node's addresses, the
/// mesh range, each peer's id, name and mesh IP, and each view peer's outbound grant and
/// addresses. Equal keys: the same table (a 64-bit collision would keep the old names until
/// the next change; the inputs come from the signed state).
fn names_key(
    dns: Option<&DnsState>,
    own: &[IpAddr],
    mesh: IpNet,
    peers: &[PeerSpec],
    view: Option<&NodeView>,
) -> u64 {
    let mut h = DefaultHasher::new();
    dns.map(|d| (&d.suffix, &d.name)).hash(&mut h);
    own.hash(&mut h);
    mesh.hash(&mut h);
    peers.len().hash(&mut h);
    for p in peers {
        (p.node_id, &p.dns_name, p.mesh_ip).hash(&mut h);
    }
    match view {
        None => 0u8.hash(&mut h),
        Some(v) => {
            1u8.hash(&mut h);
            v.peers.len().hash(&mut h);
            for p in &v.peers {
                (p.id, p.outbound.is_some(), &p.addrs).hash(&mut h);
            }
        }
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use plexsphere_policy::view::PeerView;
    use uuid::Uuid;

    use super::*;

    fn view(outbound: Option<u32>) -> NodeView {
        NodeView {
            node: Uuid::nil(),
            addrs: vec![],
            grants: vec![],
            peers: vec![PeerView {
                id: Uuid::from_u128(7),
                name: "web".into(),
                addrs: vec!["10.64.0.7".parse().expect("ip")],
                inbound: None,
                outbound,
                routes_out: vec![],
                routes_in: vec![],
            }],
        }
    }

    #[test]
    fn the_key_follows_every_input_the_table_reads() {
        let mesh: IpNet = "10.64.0.0/16".parse().expect("net");
        let own = ["10.64.0.2".parse().expect("ip")];
        let dns = DnsState {
            suffix: "mesh.internal".into(),
            name: "self".into(),
        };
        let base = names_key(Some(&dns), &own, mesh, &[], Some(&view(Some(0))));
        assert_eq!(
            base,
            names_key(Some(&dns), &own, mesh, &[], Some(&view(Some(0))))
        );
        // A peer that loses its grant loses its name: the key must change.
        assert_ne!(
            base,
            names_key(Some(&dns), &own, mesh, &[], Some(&view(None)))
        );
        assert_ne!(base, names_key(Some(&dns), &own, mesh, &[], None));
        let renamed = DnsState {
            name: "other".into(),
            ..dns.clone()
        };
        assert_ne!(
            base,
            names_key(Some(&renamed), &own, mesh, &[], Some(&view(Some(0))))
        );
    }
}
