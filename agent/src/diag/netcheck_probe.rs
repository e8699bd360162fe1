//! The probes of `plexd netcheck`: a TCP connection and a TLS handshake to the API, STUN
//! Binding requests from one local UDP port to every STUN server, and the MTUs the kernel
//! knows. Blocking and bounded; `netcheck.rs` judges what they found. Needs no daemon.

use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs as _, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::netcheck::{self, MtuFacts, NetcheckReport, StunAnswer, TlsFailure};
use crate::config::ApiUrl;
use crate::reach::stun::{Poll, StunProbe};
use crate::tls::{self, TrustSources};

/// How long the TCP connection and, separately, the TLS handshake may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one wait for a STUN answer blocks before the probe is polled again.
const STUN_TICK: Duration = Duration::from_millis(50);
/// The longest STUN answer read.
const MAX_DATAGRAM: usize = 1500;

/// What netcheck is asked to check.
#[derive(Debug, Clone)]
pub struct NetcheckInput {
    pub api_url: ApiUrl,
    pub trust: TrustSources,
    pub stun: Vec<SocketAddr>,
    pub stun_source: String,
    pub mesh_mtu: u16,
}

/// Runs every probe and judges them.
pub fn run(input: &NetcheckInput) -> NetcheckReport {
    let url = input.api_url.url();
    let host = url.host_str().unwrap_or_default().to_owned();
    let port = url.port_or_known_default().unwrap_or(443);
    let target = format!("{host}:{port}");
    let tcp = connect(&host, port);
    let mut checks = vec![netcheck::tcp_check(
        &target,
        &tcp.as_ref()
            .map(|(_, a, ms)| (*a, *ms))
            .map_err(Clone::clone),
    )];
    if input.api_url.is_https() {
        let tls = tcp
            .ok()
            .map(|(stream, _, _)| handshake(stream, &host, &input.trust));
        checks.push(netcheck::tls_check(tls.as_ref()));
    } else {
        checks.push(netcheck::plain_http_check());
    }

    let (answers, local_port) = stun_round(&input.stun);
    let local = crate::daemon::host_addrs::host_addresses().unwrap_or_default();
    let (udp, nat, reflexive, nat_mapping, udp_blocked) =
        netcheck::udp_and_nat(&answers, &local, local_port);
    checks.push(udp);
    checks.push(nat);

    let towards = input.stun.first().copied().or_else(|| {
        (host.as_str(), port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
    });
    let mtu = mtu_facts(towards, input.mesh_mtu);
    checks.push(netcheck::mtu_check(&mtu));
    NetcheckReport {
        api_url: input.api_url.to_string(),
        stun_source: input.stun_source.clone(),
        stun: answers,
        reflexive_address: reflexive,
        nat_mapping,
        udp_blocked,
        mtu,
        checks,
    }
}

/// Resolves and connects; the stream, the address it reached and the milliseconds it took.
fn connect(host: &str, port: u16) -> Result<(TcpStream, SocketAddr, u128), String> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .collect();
    let mut last = format!("{host} resolves to no address");
    for addr in addrs {
        let started = Instant::now();
        match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
            Ok(s) => return Ok((s, addr, started.elapsed().as_millis())),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                last = format!("{addr}: no answer within {}s", CONNECT_TIMEOUT.as_secs());
            }
            Err(e) => last = format!("{addr}: {e}"),
        }
    }
    Err(last)
}

/// A TLS handshake over `stream` with plexd's trust; the protocol version and milliseconds.
fn handshake(
    mut stream: TcpStream,
    host: &str,
    trust: &TrustSources,
) -> Result<(String, u128), TlsFailure> {
    let config = tls::client_config(trust).map_err(|e| TlsFailure::Setup(e.to_string()))?;
    let name = rustls_pki_types::ServerName::try_from(host.to_owned())
        .map_err(|e| TlsFailure::Setup(format!("{host} is not a TLS server name: {e}")))?;
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name)
        .map_err(|e| TlsFailure::Setup(e.to_string()))?;
    let timeouts = stream
        .set_read_timeout(Some(CONNECT_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(CONNECT_TIMEOUT)));
    timeouts.map_err(|e| TlsFailure::Handshake(e.to_string()))?;
    let started = Instant::now();
    while conn.is_handshaking() {
        if let Err(e) = conn.complete_io(&mut stream) {
            return Err(match crate::api_client::find_rustls_error(&e) {
                Some(
                    r @ (rustls::Error::InvalidCertificate(_)
                    | rustls::Error::NoCertificatesPresented),
                ) => TlsFailure::NotTrusted(r.to_string()),
                Some(r) => TlsFailure::Handshake(r.to_string()),
                None if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
                {
                    TlsFailure::Handshake(format!(
                        "no answer within {}s",
                        CONNECT_TIMEOUT.as_secs()
                    ))
                }
                None => TlsFailure::Handshake(e.to_string()),
            });
        }
    }
    let version = conn
        .protocol_version()
        .map_or_else(|| "TLS".to_owned(), |v| format!("{v:?}").replace('_', "."));
    Ok((version, started.elapsed().as_millis()))
}

/// One STUN probe of every IPv4 server from one local UDP port: what each server saw, and
/// that port. (IPv6 servers are left out: the node's reach runtime speaks IPv4 STUN.)
fn stun_round(servers: &[SocketAddr]) -> (Vec<StunAnswer>, u16) {
    let v4: Vec<SocketAddr> = servers
        .iter()
        .copied()
        .filter(SocketAddr::is_ipv4)
        .collect();
    let Ok(sock) = UdpSocket::bind(("0.0.0.0", 0)) else {
        return (no_answers(&v4), 0);
    };
    let port = sock.local_addr().map(|a| a.port()).unwrap_or(0);
    if sock.set_read_timeout(Some(STUN_TICK)).is_err() {
        return (no_answers(&v4), port);
    }
    let mut jitter = crate::jitter::Jitter::from_os();
    let mut probe = StunProbe::new(&v4, Instant::now(), || {
        let mut id = [0u8; 12];
        id[..8].copy_from_slice(&jitter.next_u64().to_be_bytes());
        id[8..].copy_from_slice(&jitter.next_u64().to_be_bytes()[..4]);
        id
    });
    let mut buf = [0u8; MAX_DATAGRAM];
    let seen = loop {
        match probe.poll_probe(Instant::now()) {
            Poll::Done(seen) => break seen,
            Poll::Send(out) => {
                for (to, datagram) in out {
                    if let Err(e) = sock.send_to(&datagram, to) {
                        tracing::debug!(server = %to, error = %e, "STUN request not sent");
                    }
                }
            }
        }
        if let Ok((n, from)) = sock.recv_from(&mut buf) {
            probe.handle_datagram(&buf[..n], from);
        }
    };
    let answers = v4
        .iter()
        .map(|s| StunAnswer {
            server: *s,
            mapped: seen.iter().find(|(from, _)| from == s).map(|(_, m)| *m),
        })
        .collect();
    (answers, port)
}

fn no_answers(servers: &[SocketAddr]) -> Vec<StunAnswer> {
    servers
        .iter()
        .map(|s| StunAnswer {
            server: *s,
            mapped: None,
        })
        .collect()
}

/// The egress interface towards `to`, its MTU and the kernel's path MTU to `to`.
fn mtu_facts(to: Option<SocketAddr>, mesh_mtu: u16) -> MtuFacts {
    let mut facts = MtuFacts {
        egress_interface: None,
        interface_mtu: None,
        path_mtu: None,
        mesh_mtu,
        outer_v6: to.is_some_and(|t| t.is_ipv6()),
    };
    let Some(to) = to else { return facts };
    let bind: SocketAddr = if to.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" }
        .parse()
        .unwrap_or(to);
    let Ok(sock) = UdpSocket::bind(bind) else {
        return facts;
    };
    if sock.connect(to).is_err() {
        return facts;
    }
    if to.is_ipv4() {
        facts.path_mtu = nix::sys::socket::getsockopt(&sock, nix::sys::socket::sockopt::IpMtu)
            .ok()
            .and_then(|m| u32::try_from(m).ok());
    }
    let Ok(local) = sock.local_addr() else {
        return facts;
    };
    facts.egress_interface = interface_of(local.ip());
    facts.interface_mtu = facts.egress_interface.as_deref().and_then(|i| {
        std::fs::read_to_string(format!("/sys/class/net/{i}/mtu"))
            .ok()
            .and_then(|t| t.trim().parse().ok())
    });
    facts
}

/// The interface that holds `ip`.
fn interface_of(ip: IpAddr) -> Option<String> {
    let addrs = nix::ifaddrs::getifaddrs().ok()?;
    for ifa in addrs {
        let Some(addr) = ifa.address else { continue };
        let own = if let Some(v4) = addr.as_sockaddr_in() {
            IpAddr::V4(v4.ip())
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            IpAddr::V6(v6.ip())
        } else {
            continue;
        };
        if own == ip {
            return Some(ifa.interface_name);
        }
    }
    None
}
