//! The name table: which names this node answers and with which addresses, built from the
//! signed state alone (pure).
//!
//! | who | answered as | addresses |
//! |---|---|---|
//! | this node | `NodeState.dns.name` under the suffix | its own mesh addresses |
//! | a peer the node may open something on (the policy view's `outbound` grant; every peer of the state without a policy) | `PeerSpec.dns_name` | the peer's mesh addresses inside the mesh range |
//! | any other peer (the policy denies it), a peer without a name | nothing: NXDOMAIN | |
//!
//! A label that fails [`check_label`] (a control plane should never send one) is left out;
//! two holders of one name (never sent either): this node first, then the smaller node id.
//! Every left-out name is reported in [`Zone::skipped`] for one log line.

use std::collections::HashMap;
use std::net::IpAddr;

use hickory_proto::rr::Name;
use ipnet::IpNet;
use plexsphere_policy::view::NodeView;
use plexsphere_wire::node::PeerSpec;
use plexsphere_wire::routes::{DnsState, check_label, check_suffix};
use uuid::Uuid;

use super::{MAX_NAMES, reverse};

/// What the table is built from.
#[derive(Debug, Clone, Copy)]
pub struct ZoneInput<'a> {
    /// The state's `dns` (None: a server older than names; the node answers no names).
    pub dns: Option<&'a DnsState>,
    /// This node's mesh addresses.
    pub own_addrs: &'a [IpAddr],
    /// The Domain's mesh range.
    pub mesh: IpNet,
    /// The peers of the state the mesh has (those of the policy's view).
    pub peers: &'a [PeerSpec],
    /// The state's policy view (None: no policy, every peer is named).
    pub view: Option<&'a NodeView>,
}

/// The names this node answers; compare two to see whether anything changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Zone {
    /// The suffix's lowercase labels, leftmost first.
    suffix: Vec<Vec<u8>>,
    suffix_name: Name,
    /// The mesh range (PTR answers and NXDOMAIN inside it).
    mesh: IpNet,
    /// The reverse zone that holds the mesh range, and its name.
    reverse_zone: IpNet,
    reverse_name: Name,
    /// Label -> addresses.
    hosts: HashMap<Box<[u8]>, Vec<IpAddr>>,
    /// Address -> label.
    ptr: HashMap<IpAddr, Box<[u8]>>,
    /// Names left out, with why (for the log; not part of what is answered).
    skipped: Vec<String>,
}

impl Zone {
    /// The table for `input`; `None` when the state names nothing (no `dns`, or a suffix that
    /// fails [`check_suffix`]: then every query is REFUSED, as before names existed).
    pub fn build(input: ZoneInput<'_>) -> Option<Zone> {
        let dns = input.dns?;
        if let Err(e) = check_suffix(&dns.suffix) {
            tracing::warn!("the signed state's DNS suffix is unusable: {e}; answering no names");
            return None;
        }
        let mut suffix_name = Name::from_ascii(&dns.suffix).ok()?;
        suffix_name.set_fqdn(true);
        let mut zone = Zone {
            suffix: dns
                .suffix
                .split('.')
                .map(|l| l.as_bytes().to_vec())
                .collect(),
            suffix_name,
            mesh: input.mesh.trunc(),
            reverse_zone: reverse::zone_of(input.mesh),
            reverse_name: reverse::zone_name(input.mesh),
            hosts: HashMap::new(),
            ptr: HashMap::new(),
            skipped: Vec::new(),
        };
        zone.add(&dns.name, "this node", input.own_addrs.iter().copied());

        let named: Option<HashMap<Uuid, (bool, &[IpAddr])>> = input.view.map(|v| {
            v.peers
                .iter()
                .map(|p| (p.id, (p.outbound.is_some(), p.addrs.as_slice())))
                .collect()
        });
        let mut peers: Vec<&PeerSpec> = input.peers.iter().collect();
        peers.sort_by_key(|p| p.node_id);
        for p in peers {
            let Some(name) = &p.dns_name else { continue };
            let extra: &[IpAddr] = match &named {
                None => &[],
                Some(named) => match named.get(&p.node_id) {
                    Some((true, addrs)) => addrs,
                    // Denied (no outbound grant) or outside the view: NXDOMAIN.
                    _ => continue,
                },
            };
            let addrs = std::iter::once(p.mesh_ip).chain(extra.iter().copied());
            zone.add(name, &format!("peer {}", p.node_id), addrs);
        }
        Some(zone)
    }

    fn add(&mut self, name: &str, who: &str, addrs: impl Iterator<Item = IpAddr>) {
        if let Err(e) = check_label(name) {
            self.skipped.push(format!("{who}: {e}"));
            return;
        }
        if self.hosts.len() >= MAX_NAMES {
            self.skipped.push(format!(
                "{who}: {name:?} is past the {MAX_NAMES} names plexd answers"
            ));
            return;
        }
        let key: Box<[u8]> = name.as_bytes().into();
        if self.hosts.contains_key(&key) {
            self.skipped
                .push(format!("{who}: {name:?} is already another node's name"));
            return;
        }
        let mut list: Vec<IpAddr> = Vec::new();
        for a in addrs {
            if self.mesh.contains(&a) && !list.contains(&a) {
                list.push(a);
                self.ptr.entry(a).or_insert_with(|| key.clone());
            }
        }
        self.hosts.insert(key, list);
    }

    /// The names left out of the table, with why.
    pub fn skipped(&self) -> &[String] {
        &self.skipped
    }

    /// How many names the table holds.
    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// The suffix's labels (lowercase, leftmost first).
    pub(crate) fn suffix_labels(&self) -> &[Vec<u8>] {
        &self.suffix
    }

    /// The suffix as a DNS name (the SOA's owner).
    pub(crate) fn suffix_name(&self) -> &Name {
        &self.suffix_name
    }

    /// The suffix as text, without the trailing dot.
    pub fn suffix(&self) -> String {
        let s = self.suffix_name.to_ascii();
        s.trim_end_matches('.').to_owned()
    }

    pub fn mesh(&self) -> IpNet {
        self.mesh
    }

    pub(crate) fn reverse_zone(&self) -> IpNet {
        self.reverse_zone
    }

    pub(crate) fn reverse_name(&self) -> &Name {
        &self.reverse_name
    }

    /// The addresses of `label` (lowercase), or `None` when nothing has that name.
    pub fn lookup(&self, label: &[u8]) -> Option<&[IpAddr]> {
        self.hosts.get(label).map(Vec::as_slice)
    }

    /// The name of `addr`, as `<label>.<suffix>.`.
    pub(crate) fn ptr(&self, addr: IpAddr) -> Option<Name> {
        let label = self.ptr.get(&addr)?;
        Name::from_labels(std::iter::once(&**label).chain(self.suffix.iter().map(Vec::as_slice)))
            .ok()
    }
}
