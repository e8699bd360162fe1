//! The resolver as the daemon runs it: the listeners, the table the core hands over, and the
//! systemd-resolved link.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use tokio::task::JoinHandle;

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
