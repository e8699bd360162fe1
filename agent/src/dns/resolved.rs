//! systemd-resolved over D-Bus (`org.freedesktop.resolve1`): the mesh link's DNS server is
//! plexd's resolver, its domains are the suffix (and the mesh's reverse zone) as routing-only
//! domains, and it is never the default route, so only mesh names go to plexd and every
//! other name keeps going where it went (docs/dns.md "systemd-resolved").
//!
//! | when | what plexd does |
//! |---|---|
//! | the names' suffix is known (the first state), or it changed | `SetLinkDNS`(Ex), `SetLinkDomains`, `SetLinkDefaultRoute(false)`, DNSSEC, DNS-over-TLS, LLMNR and mDNS off on the link |
//! | resolved (re)starts (`NameOwnerChanged` of `org.freedesktop.resolve1`) | the same again |
//! | plexd stops or leaves | `RevertLink` |
//! | no system bus, or no resolved | one log line saying what to do (docs/dns.md "Hosts without systemd-resolved"); the resolver keeps serving |
//!
//! plexd never writes /etc/resolv.conf.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use futures_util::StreamExt as _;
use ipnet::IpNet;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{DNS_PORT, reverse};

/// The longest plexd waits for resolved to take or revert a link's settings.
pub(crate) const RESOLVED_CALL_TIMEOUT: Duration = Duration::from_secs(5);

const RESOLVE1: &str = "org.freedesktop.resolve1";

/// What the mesh link should have (pure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSettings {
    pub interface: String,
    /// plexd's resolver.
    pub server: SocketAddr,
    /// `(domain, routing_only)`: the suffix, and the reverse zone of the mesh range when that
    /// zone is exactly the range (a whole octet or nibble boundary; a /10 mesh's `100.in-addr.arpa`
    /// would take names that are not the mesh's).
    pub domains: Vec<(String, bool)>,
}

impl LinkSettings {
    pub fn new(interface: &str, server: SocketAddr, suffix: &str, mesh: IpNet) -> LinkSettings {
        let mut domains = vec![(suffix.to_owned(), true)];
        if reverse::zone_is_exact(mesh) {
            domains.push((reverse::name_of(mesh), true));
        }
        LinkSettings {
            interface: interface.to_owned(),
            server,
            domains,
        }
    }
}

#[zbus::proxy(
    interface = "org.freedesktop.resolve1.Manager",
    default_service = "org.freedesktop.resolve1",
    default_path = "/org/freedesktop/resolve1"
)]
trait Manager {
    #[zbus(name = "SetLinkDNS")]
    fn set_link_dns(&self, ifindex: i32, addresses: &[(i32, Vec<u8>)]) -> zbus::Result<()>;
    #[zbus(name = "SetLinkDNSEx")]
    fn set_link_dns_ex(
        &self,
        ifindex: i32,
        addresses: &[(i32, Vec<u8>, u16, &str)],
    ) -> zbus::Result<()>;
    fn set_link_domains(&self, ifindex: i32, domains: &[(&str, bool)]) -> zbus::Result<()>;
    fn set_link_default_route(&self, ifindex: i32, enable: bool) -> zbus::Result<()>;
    #[zbus(name = "SetLinkDNSSEC")]
    fn set_link_dnssec(&self, ifindex: i32, mode: &str) -> zbus::Result<()>;
    #[zbus(name = "SetLinkDNSOverTLS")]
    fn set_link_dns_over_tls(&self, ifindex: i32, mode: &str) -> zbus::Result<()>;
    #[zbus(name = "SetLinkLLMNR")]
    fn set_link_llmnr(&self, ifindex: i32, mode: &str) -> zbus::Result<()>;
    #[zbus(name = "SetLinkMulticastDNS")]
    fn set_link_multicast_dns(&self, ifindex: i32, mode: &str) -> zbus::Result<()>;
    fn revert_link(&self, ifindex: i32) -> zbus::Result<()>;
}

/// What the link task is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wanted {
    /// Nothing yet (no names in the state).
    Nothing,
    Set(LinkSettings),
    /// plexd stops: revert the link and end.
    Revert,
}

/// The link task; [`Link::set`] hands it the settings, [`Link::stop`] reverts and ends it.
pub struct Link {
    tx: watch::Sender<Wanted>,
    task: JoinHandle<()>,
}

impl Link {
    pub fn start() -> Link {
        let (tx, rx) = watch::channel(Wanted::Nothing);
        Link {
            tx,
            task: tokio::spawn(run(rx)),
        }
    }

    pub fn set(&self, settings: LinkSettings) {
        self.tx.send_if_modified(|w| {
            let new = Wanted::Set(settings);
            let changed = *w != new;
            *w = new;
            changed
        });
    }

    /// Reverts the link (when it was set) and waits for that, at most
    /// [`RESOLVED_CALL_TIMEOUT`] and a little.
    pub async fn stop(self) {
        let _ = self.tx.send(Wanted::Revert);
        let mut task = self.task;
        if tokio::time::timeout(RESOLVED_CALL_TIMEOUT * 2, &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
    }
}

fn ifindex(name: &str) -> Result<i32, String> {
    let index = nix::net::if_::if_nametoindex(name)
        .map_err(|e| format!("the interface {name} has no index: {e}"))?;
    i32::try_from(index).map_err(|_| format!("the interface {name} has index {index}"))
}

fn address(ip: IpAddr) -> (i32, Vec<u8>) {
    match ip {
        IpAddr::V4(a) => (libc_af::INET, a.octets().to_vec()),
        IpAddr::V6(a) => (libc_af::INET6, a.octets().to_vec()),
    }
}

mod libc_af {
    pub(crate) const INET: i32 = 2;
    pub(crate) const INET6: i32 = 10;
}

async fn apply(manager: &ManagerProxy<'_>, s: &LinkSettings) -> Result<i32, String> {
    let index = ifindex(&s.interface)?;
    let call = async {
        let (family, bytes) = address(s.server.ip());
        if s.server.port() == DNS_PORT {
            manager.set_link_dns(index, &[(family, bytes)]).await?;
        } else {
            manager
                .set_link_dns_ex(index, &[(family, bytes, s.server.port(), "")])
                .await?;
        }
        let domains: Vec<(&str, bool)> = s.domains.iter().map(|(d, r)| (d.as_str(), *r)).collect();
        manager.set_link_domains(index, &domains).await?;
        manager.set_link_default_route(index, false).await?;
        manager.set_link_dnssec(index, "no").await?;
        manager.set_link_dns_over_tls(index, "no").await?;
        manager.set_link_llmnr(index, "no").await?;
        manager.set_link_multicast_dns(index, "no").await?;
        Ok::<_, zbus::Error>(())
    };
    match tokio::time::timeout(RESOLVED_CALL_TIMEOUT, call).await {
        Ok(Ok(())) => Ok(index),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "no answer within {}s",
            RESOLVED_CALL_TIMEOUT.as_secs()
        )),
    }
}

const NO_RESOLVED: &str = "mesh names are served on the mesh address but this host's resolver does not ask plexd: see docs/dns.md \"Hosts without systemd-resolved\" (a stub resolver's per-domain forward of the suffix to that address)";

async fn run(mut rx: watch::Receiver<Wanted>) {
    let conn = match zbus::Connection::system().await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("DNS: no D-Bus system bus ({e}); {NO_RESOLVED}");
            let _ = rx.wait_for(|w| *w == Wanted::Revert).await;
            return;
        }
    };
    let (manager, bus) = match (
        ManagerProxy::new(&conn).await,
        zbus::fdo::DBusProxy::new(&conn).await,
    ) {
        (Ok(m), Ok(b)) => (m, b),
        (Err(e), _) | (_, Err(e)) => {
            tracing::warn!("DNS: cannot talk to D-Bus ({e}); {NO_RESOLVED}");
            let _ = rx.wait_for(|w| *w == Wanted::Revert).await;
            return;
        }
    };
    let mut owners = match bus
        .receive_name_owner_changed_with_args(&[(0, RESOLVE1)])
        .await
    {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(
                "DNS: cannot watch for systemd-resolved restarts ({e}); the link is set once"
            );
            None
        }
    };
    // The link index last set (to revert), and whether the missing-resolved line was logged.
    let mut set_on: Option<i32> = None;
    let mut told_missing = false;
    let mut dirty = true;
    loop {
        let wanted = rx.borrow_and_update().clone();
        match &wanted {
            Wanted::Revert => break,
            Wanted::Set(s) if dirty => match apply(&manager, s).await {
                Ok(index) => {
                    set_on = Some(index);
                    told_missing = false;
                    tracing::info!(interface = %s.interface, server = %s.server, domains = ?s.domains, "DNS: systemd-resolved sends the mesh names to plexd on {}", s.interface);
                }
                Err(e) if !told_missing => {
                    told_missing = true;
                    tracing::warn!(interface = %s.interface, "DNS: cannot configure systemd-resolved on {} ({e}); {NO_RESOLVED}; plexd sets the link again when resolved starts", s.interface);
                }
                Err(e) => tracing::debug!("DNS: systemd-resolved: {e}"),
            },
            _ => {}
        }
        dirty = false;
        tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() { break; }
                dirty = true;
            }
            signal = async {
                match owners.as_mut() {
                    Some(s) => s.next().await,
                    None => std::future::pending().await,
                }
            } => {
                let Some(signal) = signal else { owners = None; continue };
                let appeared = signal.args().map(|a| a.new_owner().is_some()).unwrap_or(false);
                if appeared {
                    tracing::info!("DNS: systemd-resolved (re)started; setting the mesh link again");
                    dirty = true;
                } else {
                    set_on = None;
                }
            }
        }
    }
    if let Some(index) = set_on {
        match tokio::time::timeout(RESOLVED_CALL_TIMEOUT, manager.revert_link(index)).await {
            Ok(Ok(())) => {
                tracing::info!("DNS: reverted systemd-resolved's settings of the mesh link")
            }
            Ok(Err(e)) => tracing::warn!(
                "DNS: cannot revert systemd-resolved's settings of the mesh link: {e}; `resolvectl revert <interface>` does it"
            ),
            Err(_) => tracing::warn!(
                "DNS: systemd-resolved did not answer the revert of the mesh link; `resolvectl revert <interface>` does it"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reverse_zone_is_a_routing_domain_only_on_a_whole_boundary() {
        let server: SocketAddr = "10.64.0.1:53".parse().expect("addr");
        let s = LinkSettings::new(
            "plexd0",
            server,
            "mesh.internal",
            "10.64.0.0/16".parse().expect("net"),
        );
        assert_eq!(
            s.domains,
            vec![
                ("mesh.internal".to_owned(), true),
                ("64.10.in-addr.arpa".to_owned(), true)
            ]
        );
        let s = LinkSettings::new(
            "plexd0",
            server,
            "mesh.internal",
            "100.64.0.0/10".parse().expect("net"),
        );
        assert_eq!(s.domains, vec![("mesh.internal".to_owned(), true)]);
    }
}
