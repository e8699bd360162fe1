//! How the control plane knows its relays' health (docs/relay.md "Health"): it probes them
//! itself, on demand. `GET /v1/relays` probes every relay of `--relay` when the last probe is
//! older than [`RELAY_CHECK_EVERY`] (one probe round at a time; concurrent callers wait for
//! it and share its result): a STUN Binding request to the relay's UDP address (a relay
//! answers STUN there) and a TCP connect to its TLS address, each bounded by
//! [`RELAY_PROBE_TIMEOUT`]. A relay is healthy when every transport it offers answered. Each
//! replica probes for itself; nothing is stored.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use plexsphere_wire::node::RelaySpec;
use serde::Serialize;

/// A probe result older than this is probed again when someone asks.
pub(crate) const RELAY_CHECK_EVERY: Duration = Duration::from_secs(10);
/// How long one transport of one relay gets to answer.
pub(crate) const RELAY_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// `GET /v1/relays`: one relay as the control plane hands it out, with its health.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct RelayView {
    pub name: String,
    /// `tls://host:port` when it takes TCP, else `udp://addr`.
    pub url: String,
    /// `udp` and/or `tcp`.
    pub transports: Vec<&'static str>,
    pub healthy: bool,
    pub last_check_at: Option<String>,
    /// What the probe found, one line ("udp: answered in 1 ms; tcp: connected in 2 ms").
    pub detail: String,
    pub udp: Option<SocketAddr>,
    pub tls: Option<SocketAddr>,
}

/// The cache of the last probe round.
#[derive(Default)]
pub struct RelayHealth {
    last: tokio::sync::Mutex<Option<(Instant, Vec<RelayView>)>>,
}

fn url(r: &RelaySpec) -> String {
    match (r.tls, r.udp) {
        (Some(tls), _) => match &r.tls_server_name {
            Some(name) => format!("tls://{name}:{}", tls.port()),
            None => format!("tls://{tls}"),
        },
        (None, Some(udp)) => format!("udp://{udp}"),
        (None, None) => String::new(),
    }
}

/// A STUN Binding request (RFC 5389: type 0x0001, length 0, the magic cookie, `id`).
fn binding_request(id: [u8; 12]) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[..2].copy_from_slice(&0x0001u16.to_be_bytes());
    b[4..8].copy_from_slice(&0x2112_A442u32.to_be_bytes());
    b[8..].copy_from_slice(&id);
    b
}

/// Whether `d` is a Binding success response (0x0101) to `id`.
fn is_answer(d: &[u8], id: &[u8; 12]) -> bool {
    d.len() >= 20 && d[..2] == 0x0101u16.to_be_bytes() && d[8..20] == id[..]
}

async fn probe_udp(addr: SocketAddr) -> Result<Duration, String> {
    let bind: SocketAddr = if addr.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let sock = tokio::net::UdpSocket::bind(bind)
        .await
        .map_err(|e| format!("cannot open a UDP socket: {e}"))?;
    let mut id = [0u8; 12];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut id)
        .map_err(|_| "no randomness for the STUN transaction id".to_owned())?;
    let start = Instant::now();
    sock.send_to(&binding_request(id), addr)
        .await
        .map_err(|e| format!("cannot send to {addr}: {e}"))?;
    let mut buf = [0u8; 512];
    let wait = async {
        loop {
            match sock.recv_from(&mut buf).await {
                Ok((n, from)) if from == addr && is_answer(&buf[..n], &id) => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(format!("{e}")),
            }
        }
    };
    match tokio::time::timeout(RELAY_PROBE_TIMEOUT, wait).await {
        Ok(Ok(())) => Ok(start.elapsed()),
        Ok(Err(e)) => Err(format!("no STUN answer from {addr}: {e}")),
        Err(_) => Err(format!(
            "no STUN answer from {addr} within {} s",
            RELAY_PROBE_TIMEOUT.as_secs()
        )),
    }
}

async fn probe_tcp(addr: SocketAddr) -> Result<Duration, String> {
    let start = Instant::now();
    match tokio::time::timeout(RELAY_PROBE_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(_)) => Ok(start.elapsed()),
        Ok(Err(e)) => Err(format!("cannot connect to {addr}: {e}")),
        Err(_) => Err(format!(
            "no TCP answer from {addr} within {} s",
            RELAY_PROBE_TIMEOUT.as_secs()
        )),
    }
}

async fn probe(r: &RelaySpec, at: Option<String>) -> RelayView {
    let udp = async {
        match r.udp {
            Some(a) => Some(probe_udp(a).await),
            None => None,
        }
    };
    let tcp = async {
        match r.tls {
            Some(a) => Some(probe_tcp(a).await),
            None => None,
        }
    };
    let (udp, tcp) = tokio::join!(udp, tcp);
    let mut parts = vec![];
    let mut healthy = udp.is_some() || tcp.is_some();
    let mut transports = vec![];
    for (name, res, verb) in [("udp", &udp, "answered"), ("tcp", &tcp, "connected")] {
        let Some(res) = res else { continue };
        transports.push(name);
        match res {
            Ok(d) => parts.push(format!("{name}: {verb} in {} ms", d.as_millis())),
            Err(e) => {
                healthy = false;
                parts.push(format!("{name}: {e}"));
            }
        }
    }
    if transports.is_empty() {
        parts.push("the relay has neither a UDP nor a TLS address".into());
    }
    RelayView {
        name: r.name.clone(),
        url: url(r),
        transports,
        healthy,
        last_check_at: at,
        detail: parts.join("; "),
        udp: r.udp,
        tls: r.tls,
    }
}

impl RelayHealth {
    /// Every relay with its health, probing when the last round is older than
    /// [`RELAY_CHECK_EVERY`]; `at` is the RFC 3339 time a new round is stamped with.
    pub(crate) async fn views(&self, relays: &[RelaySpec], at: Option<String>) -> Vec<RelayView> {
        let mut last = self.last.lock().await;
        if let Some((when, views)) = last.as_ref()
            && when.elapsed() < RELAY_CHECK_EVERY
            && views.len() == relays.len()
        {
            return views.clone();
        }
        let views =
            futures_util::future::join_all(relays.iter().map(|r| probe(r, at.clone()))).await;
        *last = Some((Instant::now(), views.clone()));
        views
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binding_answer_is_matched_by_type_and_id() {
        let id = [7u8; 12];
        let req = binding_request(id);
        assert_eq!(&req[..8], &[0, 1, 0, 0, 0x21, 0x12, 0xA4, 0x42]);
        let mut answer = req;
        answer[..2].copy_from_slice(&[1, 1]);
        assert!(is_answer(&answer, &id));
        assert!(!is_answer(&req, &id), "a request is no answer");
        assert!(!is_answer(&answer, &[8u8; 12]), "another transaction");
        assert!(!is_answer(&answer[..19], &id));
    }

    #[tokio::test]
    async fn a_relay_that_does_not_listen_is_unhealthy_and_says_why() {
        // A bound, silent UDP socket and a closed TCP port on loopback.
        let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let tls = closed.local_addr().unwrap_or_else(|e| panic!("{e}"));
        drop(closed);
        let r = RelaySpec {
            name: "r1".into(),
            public_key: String::new(),
            udp: silent.local_addr().ok(),
            tls: Some(tls),
            tls_server_name: Some("relay.example".into()),
        };
        let v = probe(&r, None).await;
        assert!(!v.healthy);
        assert_eq!(v.transports, ["udp", "tcp"]);
        assert_eq!(v.url, format!("tls://relay.example:{}", tls.port()));
        assert!(v.detail.contains("udp: no STUN answer"), "{}", v.detail);
        assert!(v.detail.contains("tcp: cannot connect"), "{}", v.detail);
    }
}
