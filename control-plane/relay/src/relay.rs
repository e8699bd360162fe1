//! Starting and stopping a relay: [`start`] validates the config, binds everything, and hands
//! back a [`RelayHandle`] with the bound addresses, the public key and the counters.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use plexsphere_wire::key::PublicKey;
use plexsphere_wire::node::RelaySpec;
use plexsphere_wire::signed::DomainVerifier;
use ring::rand::{SecureRandom as _, SystemRandom};
use tokio::sync::watch;

use crate::core::Core;
use crate::limits::Limits;
use crate::shared::Shared;
use crate::stats::{Counters, Stats};

/// Where and with which certificate the relay takes TCP with TLS.
#[derive(Clone)]
pub struct TlsListen {
    pub addr: SocketAddr,
    /// A rustls server config (certificate chain and key already loaded).
    pub config: Arc<rustls::ServerConfig>,
}

/// Everything a relay needs: its name, its X25519 secret key, where to listen, and the public
/// keys of the Domains whose relay tokens it accepts (several during a key rotation).
#[derive(Clone)]
pub struct RelayConfig {
    pub name: String,
    pub secret_key: [u8; 32],
    pub udp: Option<SocketAddr>,
    pub tls: Option<TlsListen>,
    /// Ed25519 public keys, standard base64 (what `plexsphere domain-key` prints).
    pub domain_keys: Vec<String>,
    pub limits: Limits,
}

impl std::fmt::Debug for RelayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayConfig")
            .field("name", &self.name)
            .field("udp", &self.udp)
            .field("tls", &self.tls.as_ref().map(|t| t.addr))
            .field("domain_keys", &self.domain_keys)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the relay has nothing to listen on: give it a UDP address, a TLS address, or both")]
    NoListener,
    #[error(
        "the relay trusts no Domain: give it at least one Domain public key (plexsphere domain-key prints it)"
    )]
    NoDomainKey,
    #[error("the Domain key {0:?} is not 32 bytes of standard base64")]
    BadDomainKey(String),
    #[error("{0}")]
    Limits(String),
    #[error("cannot listen on {what} {addr}: {source}; is another process using it?")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start a UDP thread of the relay: {0}")]
    Thread(std::io::Error),
    #[error("the system random generator failed")]
    Random,
}

/// A running relay. Dropping it stops it too (without waiting).
pub struct RelayHandle {
    pub name: String,
    pub public_key: PublicKey,
    pub udp_addr: Option<SocketAddr>,
    pub tls_addr: Option<SocketAddr>,
    shared: Arc<Shared>,
    stop_udp: Arc<AtomicBool>,
    stop_tcp: watch::Sender<bool>,
    udp_threads: Vec<std::thread::JoinHandle<()>>,
    tcp_task: Option<tokio::task::JoinHandle<()>>,
}

impl RelayHandle {
    /// The relay's public key, standard base64 (what a [`RelaySpec`] carries).
    pub fn public_key_b64(&self) -> String {
        self.public_key.to_base64()
    }

    /// The counters now.
    pub fn stats(&self) -> Stats {
        self.shared.counters.snapshot()
    }

    /// The UDP threads (one socket each, all on [`Self::udp_addr`]); 0 without UDP.
    pub fn udp_threads(&self) -> usize {
        self.udp_threads.len()
    }

    /// Nodes registered now (leases not yet swept included).
    pub fn registered(&self) -> usize {
        self.shared.core().registered()
    }

    /// How the control plane announces this relay to nodes.
    pub fn spec(&self, tls_server_name: Option<String>) -> RelaySpec {
        RelaySpec {
            name: self.name.clone(),
            public_key: self.public_key_b64(),
            udp: self.udp_addr,
            tls: self.tls_addr,
            tls_server_name,
        }
    }

    /// Stops listening and waits for the UDP threads and the TCP accept loop to end.
    pub async fn shutdown(mut self) {
        self.signal();
        if let Some(task) = self.tcp_task.take() {
            let _ = task.await;
        }
        let threads = std::mem::take(&mut self.udp_threads);
        let _ = tokio::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
        })
        .await;
    }

    fn signal(&self) {
        self.stop_udp.store(true, Ordering::Relaxed);
        let _ = self.stop_tcp.send(true);
    }
}

impl Drop for RelayHandle {
    fn drop(&mut self) {
        self.signal();
    }
}

/// Binds the relay's sockets and starts it (inside a tokio runtime).
pub async fn start(config: RelayConfig) -> Result<RelayHandle, StartError> {
    if config.udp.is_none() && config.tls.is_none() {
        return Err(StartError::NoListener);
    }
    if config.domain_keys.is_empty() {
        return Err(StartError::NoDomainKey);
    }
    let domains = config
        .domain_keys
        .iter()
        .map(|k| DomainVerifier::from_b64(k).map_err(|_| StartError::BadDomainKey(k.clone())))
        .collect::<Result<Vec<_>, _>>()?;
    config.limits.check().map_err(StartError::Limits)?;
    let mut cookie_secret = [0u8; 32];
    SystemRandom::new()
        .fill(&mut cookie_secret)
        .map_err(|_| StartError::Random)?;

    // One socket a UDP thread, all on the one address (udp.rs).
    let udp = match config.udp {
        Some(addr) => crate::udp::bind(addr, crate::udp::threads(config.limits.udp_threads))
            .map_err(|source| StartError::Bind {
                what: "UDP",
                addr,
                source,
            })?,
        None => Vec::new(),
    };
    let tcp = match &config.tls {
        Some(t) => Some(
            tokio::net::TcpListener::bind(t.addr)
                .await
                .map_err(|source| StartError::Bind {
                    what: "TCP",
                    addr: t.addr,
                    source,
                })?,
        ),
        None => None,
    };
    let udp_addr = udp.first().and_then(|s| s.local_addr().ok());
    let tls_addr = tcp.as_ref().and_then(|l| l.local_addr().ok());

    let counters = Arc::new(Counters::default());
    let core = Core::new(
        config.secret_key,
        cookie_secret,
        domains,
        config.limits.clone(),
        counters.clone(),
        std::time::Instant::now(),
    );
    let shared = Arc::new(Shared {
        core: Mutex::new(core),
        counters,
        udp: udp.first().cloned(),
    });
    let stop_udp = Arc::new(AtomicBool::new(false));
    let (stop_tcp, stop_rx) = watch::channel(false);
    let mut udp_threads = Vec::with_capacity(udp.len());
    for (index, socket) in udp.into_iter().enumerate() {
        match crate::udp::spawn(index, socket, shared.clone(), stop_udp.clone()) {
            Ok(thread) => udp_threads.push(thread),
            Err(e) => {
                // The ones already running stop with the flag.
                stop_udp.store(true, Ordering::Relaxed);
                return Err(StartError::Thread(e));
            }
        }
    }
    let tcp_task = match (tcp, &config.tls) {
        (Some(listener), Some(t)) => {
            let accept = crate::tcp::Accept {
                acceptor: tokio_rustls::TlsAcceptor::from(t.config.clone()),
                register_within: config.limits.tcp_register_within,
            };
            Some(tokio::spawn(crate::tcp::accept_loop(
                listener,
                accept,
                shared.clone(),
                stop_rx,
            )))
        }
        _ => None,
    };
    let public_key = plexsphere_wire::reach::public_key(&config.secret_key);
    tracing::info!(
        relay = %config.name,
        %public_key,
        udp = ?udp_addr,
        udp_threads = udp_threads.len(),
        tls = ?tls_addr,
        domains = config.domain_keys.len(),
        "relay started"
    );
    Ok(RelayHandle {
        name: config.name,
        public_key,
        udp_addr,
        tls_addr,
        shared,
        stop_udp,
        stop_tcp,
        udp_threads,
        tcp_task,
    })
}
