//! What opening a data plane needs and how it can fail: the node's key, mesh IP and prefix
//! ([`NodeSetup`]) and [`OpenError`]. Shared by the backends and `open`, so none of them
//! imports another.

use std::fmt;
use std::net::IpAddr;

type LocalAddrsFn = dyn Fn() -> Vec<std::net::IpAddr> + Send + Sync;

/// What the interface needs from the node's identity and key.
#[derive(Clone)]
pub struct NodeSetup {
    private_key: [u8; 32],
    /// The node's TLS trust for relays over TCP; see [`NodeSetup::with_relay_tls`].
    relay_tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// See [`NodeSetup::with_local_addrs`].
    local_addrs: Option<std::sync::Arc<LocalAddrsFn>>,
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
            local_addrs: None,
            mesh_ip,
            prefix,
        }
    }

    /// The Domain's mesh range (`mesh_cidr`): the mesh IP with the prefix, or the mesh IP
    /// alone when the prefix does not fit its family.
    pub fn mesh_net(&self) -> ipnet::IpNet {
        ipnet::IpNet::new(self.mesh_ip, self.prefix)
            .map(|n| n.trunc())
            .unwrap_or_else(|_| ipnet::IpNet::from(self.mesh_ip))
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
    /// carries), read anew at each call: the reach runtime's local candidates. The daemon
    /// gives the same function its endpoint report uses (`daemon::host_addrs`); without one
    /// the runtime offers no local candidates (peers still get them from the control plane).
    pub fn with_local_addrs(
        mut self,
        read: impl Fn() -> Vec<std::net::IpAddr> + Send + Sync + 'static,
    ) -> Self {
        self.local_addrs = Some(std::sync::Arc::new(read));
        self
    }

    pub(crate) fn local_addrs(&self) -> crate::reach::runtime::LocalAddrs {
        match self.local_addrs.clone() {
            Some(read) => Box::new(move || read()),
            None => Box::new(Vec::new),
        }
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
