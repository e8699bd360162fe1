//! The resolver as the daemon runs it: the listeners, the table the core hands over, and the
//! systemd-resolved link.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use tokio::task::JoinHandle;

use serde::{Deserialize, Serialize};

use super::limit::Discard;
use super::resolved::{Link, LinkSettings};
use super::server::{self, Shared};
use super::zone::Zone;
use crate::config::dns::DnsConfig;

/// What [`Runtime::start`] needs.
#[derive(Debug, Clone)]
pub struct Start<'a> {
    pub config: &'a DnsConfig,
    /// The mesh interface (systemd-resolved's link).
    pub interface: &'a str,
    pub mesh_ip: IpAddr,
    pub mesh: IpNet,
}

/// What `plexd status` shows of the resolver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DnsStatus {
    pub listen: SocketAddr,
    /// The suffix of the names (None: the state carries no names; every query is REFUSED).
    pub suffix: Option<String>,
    pub names: usize,
    /// Queries (and TCP connections) dropped since the start, by kind.
    pub dropped_foreign: u64,
    pub dropped_rate: u64,
    pub dropped_size: u64,
    pub dropped_connections: u64,
    pub dropped_unanswerable: u64,
}

impl DnsStatus {
    /// One line: `10.64.1.2:53, 12 names under mesh.internal; dropped 3 from other hosts`.
    pub fn line(&self) -> String {
        let names = match &self.suffix {
            Some(s) => format!("{} names under {s}", self.names),
            None => "no names in the state (every query REFUSED)".to_owned(),
        };
        let drops: Vec<String> = [
            (self.dropped_foreign, "from other hosts"),
            (self.dropped_rate, "over the rate"),
            (self.dropped_size, "over the size"),
            (self.dropped_connections, "TCP connections over the limit"),
            (self.dropped_unanswerable, "not queries"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
        if drops.is_empty() {
            format!("{}, {names}", self.listen)
        } else {
            format!("{}, {names}; dropped {}", self.listen, drops.join(", "))
        }
    }
}

pub struct Runtime {
    shared: Arc<Shared>,
    tasks: [JoinHandle<()>; 2],
    link: Option<Link>,
    interface: String,
    server: SocketAddr,
    mesh: IpNet,
}

impl Runtime {
    /// Binds the listeners on `mesh_ip:port` and starts the resolved link task (unless
    /// `dns.resolved: false`). The error is one line saying what to do.
    pub fn start(s: Start<'_>) -> Result<Runtime, String> {
        let addr = SocketAddr::new(s.mesh_ip, s.config.port);
        let (udp, tcp) = server::bind(addr).map_err(|e| {
            format!("DNS: cannot listen on {addr} (UDP and TCP): {e}; free the port or set dns.enabled: false (docs/dns.md)")
        })?;
        let server = udp.local_addr().unwrap_or(addr);
        let shared = Shared::new(vec![s.mesh_ip]);
        let tasks = server::spawn(shared.clone(), udp, tcp);
        tracing::info!(address = %server, "DNS: answering mesh names on {server} (UDP and TCP) for this host");
        Ok(Runtime {
            shared,
            tasks,
            link: s.config.resolved.then(Link::start),
            interface: s.interface.to_owned(),
            server,
            mesh: s.mesh,
        })
    }

    /// The core's new table.
    pub fn update(&self, zone: Option<Arc<Zone>>) {
        if let Some(z) = &zone {
            for why in z.skipped() {
                tracing::warn!("DNS: a name is left out: {why}");
            }
            tracing::info!(names = z.len(), suffix = %z.suffix(), "DNS: answering {} names under {}", z.len(), z.suffix());
            if let Some(link) = &self.link {
                link.set(LinkSettings::new(
                    &self.interface,
                    self.server,
                    &z.suffix(),
                    self.mesh,
                ));
            }
        }
        self.shared.set_zone(zone);
    }

    pub fn status(&self) -> DnsStatus {
        let zone = self.shared.zone();
        let d = |k| self.shared.dropped(k);
        DnsStatus {
            listen: self.server,
            suffix: zone.as_ref().map(|z| z.suffix()),
            names: zone.as_ref().map_or(0, |z| z.len()),
            dropped_foreign: d(Discard::Foreign),
            dropped_rate: d(Discard::Rate),
            dropped_size: d(Discard::Size),
            dropped_connections: d(Discard::Connections),
            dropped_unanswerable: d(Discard::Unanswerable),
        }
    }

    /// Stops the listeners and reverts the resolved link.
    pub async fn stop(self) {
        for t in &self.tasks {
            t.abort();
        }
        if let Some(link) = self.link {
            link.stop().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_line_names_the_drops_it_has() {
        let mut s = DnsStatus {
            listen: "10.64.1.2:53".parse().expect("addr"),
            suffix: Some("mesh.internal".into()),
            names: 12,
            dropped_foreign: 0,
            dropped_rate: 0,
            dropped_size: 0,
            dropped_connections: 0,
            dropped_unanswerable: 0,
        };
        assert_eq!(s.line(), "10.64.1.2:53, 12 names under mesh.internal");
        s.dropped_foreign = 3;
        s.dropped_rate = 1;
        assert_eq!(
            s.line(),
            "10.64.1.2:53, 12 names under mesh.internal; dropped 3 from other hosts, 1 over the rate"
        );
        s.suffix = None;
        assert!(s.line().contains("every query REFUSED"));
    }
}
