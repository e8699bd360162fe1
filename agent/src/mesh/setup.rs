//! What opening a data plane needs and how it can fail: the node's key, mesh IP and prefix
//! ([`NodeSetup`]) and [`OpenError`]. Shared by the backends and `open`, so none of them
//! imports another.

use std::fmt;
use std::net::IpAddr;

/// What the interface needs from the node's identity and key.
#[derive(Clone)]
pub struct NodeSetup {
    private_key: [u8; 32],
    /// The node's TLS trust for relays over TCP; see [`NodeSetup::with_relay_tls`].
    relay_tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    pub mesh_ip: IpAddr,
    /// The mesh range's prefix length (from `mesh_cidr`).
    pub prefix: u8,
}

impl fmt::Debug for NodeSetup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "NodeSetup({}/{}, private key <redacted>)",
            self.mesh_ip, self.prefix
        )
    }
}

impl NodeSetup {
    pub fn new(private_key: [u8; 32], mesh_ip: IpAddr, prefix: u8) -> Self {
        Self {
            private_key,
            relay_tls: None,
            mesh_ip,
            prefix,
        }
    }

    /// Relays over TCP check their certificates with this trust (the API's: build it with
    /// `crate::tls::client_config` from `tls.ca_file` / `tls.ca_sha256`). Its ALPN is dropped.
    /// Without it, relays are used over UDP only.
    pub fn with_relay_tls(mut self, config: rustls::ClientConfig) -> Self {
        self.relay_tls = Some(std::sync::Arc::new(plexsphere_tls_client::with_alpn(
            config,
            &[],
        )));
        self
    }

    pub(crate) fn relay_tls(&self) -> Option<std::sync::Arc<rustls::ClientConfig>> {
        self.relay_tls.clone()
    }

    pub(crate) fn private_key(&self) -> [u8; 32] {
        self.private_key
    }

    /// The host's addresses a peer could reach this node on (what the endpoint report
    /// carries), read anew at each call; for the reach runtime's local candidates.
    pub fn local_addrs(&self) -> crate::reach::runtime::LocalAddrs {
        let mesh_ip = self.mesh_ip;
        let cidr = ipnet::IpNet::new(mesh_ip, self.prefix)
            .map(|n| n.trunc())
            .unwrap_or_else(|_| ipnet::IpNet::from(mesh_ip));
        Box::new(move || {
            let host = crate::daemon::host_addrs::host_addresses().unwrap_or_else(|e| {
                tracing::debug!("cannot read the host's addresses: {e}");
                Vec::new()
            });
            crate::daemon::host_addrs::reportable(host, mesh_ip, &cidr)
        })
    }
}

/// Why no data plane could be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// The config asks for something this host cannot do (exit 78: restarting will not help).
    #[error("{0}")]
    Config(String),
    /// `wireguard.backend: kernel` on a host without the module.
    #[error("{0}")]
    ModuleMissing(String),
    /// The host refused (permissions, a port in use, no /dev/net/tun): worth a restart.
    #[error("{0}")]
    Runtime(String),
}

impl OpenError {
    /// True when a restart with the same config cannot help.
    pub fn is_config(&self) -> bool {
        matches!(self, OpenError::Config(_) | OpenError::ModuleMissing(_))
    }
}
