//! Test nodes built from the wire codecs only: real X25519 keys, a real Domain signer, real
//! sockets (UDP, and TCP with TLS against a self-signed certificate).

#![allow(dead_code, clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use plexsphere_relay::{Limits, RelayConfig, RelayHandle, TlsListen};
use plexsphere_wire::key::PublicKey;
use plexsphere_wire::reach::relay::{Frame, RelayToken};
use plexsphere_wire::signed::{DomainSigner, SignContext};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpStream, UdpSocket};
use tokio_rustls::client::TlsStream;

/// How long a test waits for an answer that must come.
pub const WAIT: Duration = Duration::from_secs(5);

pub const RELAY_SK: [u8; 32] = [0x42; 32];

pub fn domain() -> DomainSigner {
    DomainSigner::from_seed(&[7; 32]).unwrap()
}

pub fn now_unix() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// A relay token for `node`, signed by `signer`.
pub fn token(signer: &DomainSigner, node: &PublicKey, expires_at: i64) -> Vec<u8> {
    let t = RelayToken {
        domain_id: uuid::Uuid::nil(),
        // One node id a key: relays keep one registration a node id.
        node_id: uuid::Uuid::from_bytes(node.0[..16].try_into().unwrap()),
        public_key: node.to_base64(),
        expires_at,
        key_generation: 1,
    };
    serde_json::to_vec(&signer.sign(SignContext::RelayToken, &t).unwrap()).unwrap()
}

pub struct Tls {
    pub server: Arc<rustls::ServerConfig>,
    pub client: Arc<rustls::ClientConfig>,
}

pub fn tls() -> Tls {
    let ck = rcgen::generate_simple_self_signed(vec!["relay.test".to_owned()]).unwrap();
    let der = CertificateDer::from(ck.cert.der().to_vec());
    let key = PrivateKeyDer::try_from(ck.signing_key.serialize_der()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![der.clone()], key)
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Tls {
        server: Arc::new(server),
        client: Arc::new(client),
    }
}

/// A relay on loopback (UDP and TLS, free ports) trusting [`domain`].
pub async fn relay(limits: Limits, tls: &Tls) -> RelayHandle {
    plexsphere_relay::start(RelayConfig {
        name: "test-relay".into(),
        secret_key: RELAY_SK,
        udp: Some("127.0.0.1:0".parse().unwrap()),
        tls: Some(TlsListen {
            addr: "127.0.0.1:0".parse().unwrap(),
            config: tls.server.clone(),
        }),
        domain_keys: vec![domain().public_key_b64()],
        limits,
    })
    .await
    .unwrap()
}

pub enum Link {
    Udp(UdpSocket, SocketAddr),
    Tcp(Box<TlsStream<TcpStream>>),
}

impl Link {
    pub async fn udp(relay: &RelayHandle) -> Link {
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        Link::Udp(sock, relay.udp_addr.unwrap())
    }

    pub async fn tcp(relay: &RelayHandle, tls: &Tls) -> Link {
        let tcp = TcpStream::connect(relay.tls_addr.unwrap()).await.unwrap();
        Link::tls_over(tcp, tls).await
    }

    /// A UDP link from a loopback address of its own (127.x.y.z stands for another source).
    pub async fn udp_from(relay: &RelayHandle, ip: [u8; 4]) -> Link {
        let sock = UdpSocket::bind(SocketAddr::from((ip, 0))).await.unwrap();
        Link::Udp(sock, relay.udp_addr.unwrap())
    }

    /// A TLS link from a loopback address of its own.
    pub async fn tcp_from(relay: &RelayHandle, tls: &Tls, ip: [u8; 4]) -> Link {
        Link::tls_over(tcp_from(relay, ip).await.unwrap(), tls).await
    }

    pub async fn tls_over(tcp: TcpStream, tls: &Tls) -> Link {
        let connector = tokio_rustls::TlsConnector::from(tls.client.clone());
        let name = ServerName::try_from("relay.test").unwrap();
        Link::Tcp(Box::new(connector.connect(name, tcp).await.unwrap()))
    }

    pub async fn send(&mut self, frame: &Frame) {
        match self {
            Link::Udp(s, relay) => {
                s.send_to(&frame.to_datagram(), *relay).await.unwrap();
            }
            Link::Tcp(s) => {
                s.write_all(&frame.to_stream()).await.unwrap();
                s.flush().await.unwrap();
            }
        }
    }

    /// The next frame, or `None` after `wait`.
    pub async fn recv_within(&mut self, wait: Duration) -> Option<Frame> {
        tokio::time::timeout(wait, async {
            match self {
                Link::Udp(s, _) => {
                    let mut buf = vec![0u8; 65536];
                    let (n, _) = s.recv_from(&mut buf).await.unwrap();
                    Frame::from_datagram(&buf[..n]).unwrap()
                }
                Link::Tcp(s) => {
                    let mut len = [0u8; 2];
                    s.read_exact(&mut len).await.unwrap();
                    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
                    s.read_exact(&mut buf).await.unwrap();
                    Frame::decode(&buf).unwrap()
                }
            }
        })
        .await
        .ok()
    }

    pub async fn recv(&mut self) -> Frame {
        self.recv_within(WAIT)
            .await
            .expect("no frame from the relay in time")
    }

    pub fn local_addr(&self) -> SocketAddr {
        match self {
            Link::Udp(s, _) => s.local_addr().unwrap(),
            Link::Tcp(s) => s.get_ref().0.local_addr().unwrap(),
        }
    }
}

/// A plain TCP connection to the relay's TLS port from loopback address `ip`.
pub async fn tcp_from(relay: &RelayHandle, ip: [u8; 4]) -> std::io::Result<TcpStream> {
    let sock = tokio::net::TcpSocket::new_v4()?;
    sock.bind(SocketAddr::from((ip, 0)))?;
    sock.connect(relay.tls_addr.unwrap()).await
}

/// Waits (bounded by [`WAIT`]) until the relay closes `stream`: a read that ends (EOF or a
/// reset). Panics when it is still open then, or when the relay sends something.
pub async fn closed_by_relay<S: tokio::io::AsyncRead + Unpin>(stream: &mut S, what: &str) {
    let mut buf = [0u8; 256];
    match tokio::time::timeout(WAIT, stream.read(&mut buf)).await {
        Err(_) => panic!("{what}: still open after {WAIT:?}"),
        Ok(Ok(0)) | Ok(Err(_)) => {}
        Ok(Ok(n)) => panic!("{what}: the relay sent {n} bytes"),
    }
}

/// A node: a WireGuard-style key pair and a link to the relay.
pub struct Node {
    pub sk: [u8; 32],
    pub pk: PublicKey,
    pub link: Link,
}

impl Node {
    pub fn new(seed: u8, link: Link) -> Node {
        let sk = [seed; 32];
        Node {
            sk,
            pk: plexsphere_wire::reach::public_key(&sk),
            link,
        }
    }

    pub async fn challenge(&mut self) -> [u8; 32] {
        self.link.send(&Frame::Hello { node: self.pk }).await;
        match self.link.recv().await {
            Frame::Challenge { cookie } => cookie,
            f => panic!("want a challenge, got {f:?}"),
        }
    }

    pub fn proof(&self, cookie: &[u8; 32]) -> [u8; 32] {
        let relay_pk = plexsphere_wire::reach::public_key(&RELAY_SK);
        let shared = plexsphere_wire::reach::shared_secret(&self.sk, &relay_pk);
        plexsphere_wire::reach::relay::proof(&shared, cookie, &self.pk)
    }

    /// hello, challenge, register with `token`; the relay's answer.
    pub async fn register_with(&mut self, token: Vec<u8>) -> Frame {
        let cookie = self.challenge().await;
        let proof = self.proof(&cookie);
        self.link
            .send(&Frame::Register {
                node: self.pk,
                cookie,
                proof,
                token,
            })
            .await;
        self.link.recv().await
    }

    /// Registers with a good token and the sealed proof (as plexd does); answers the key the
    /// relay seals this node's answers with. Panics unless a sealed `registered` comes back.
    pub async fn register_sealed(&mut self) -> plexsphere_wire::reach::relay::FrameKey {
        use plexsphere_wire::reach::relay::{FrameKey, sealed_proof};
        let relay_pk = plexsphere_wire::reach::public_key(&RELAY_SK);
        let shared = plexsphere_wire::reach::shared_secret(&self.sk, &relay_pk);
        let cookie = self.challenge().await;
        let token = token(&domain(), &self.pk, now_unix() + 600);
        self.link
            .send(&Frame::Register {
                node: self.pk,
                cookie,
                proof: sealed_proof(&shared, &cookie, &self.pk),
                token,
            })
            .await;
        let key = FrameKey::new(&shared);
        match self.link.recv().await {
            Frame::Sealed { counter, body, tag } => {
                let inner = key.open(counter, &body, &tag).unwrap();
                assert!(matches!(inner, Frame::Registered { .. }), "{inner:?}");
            }
            f => panic!("want a sealed registered, got {f:?}"),
        }
        key
    }

    /// Registers with a good token; panics unless registered.
    pub async fn register(&mut self) {
        let t = token(&domain(), &self.pk, now_unix() + 600);
        match self.register_with(t).await {
            Frame::Registered { lease_secs } => {
                assert_eq!(lease_secs, plexsphere_wire::reach::relay::LEASE_SECS)
            }
            f => panic!("want registered, got {f:?}"),
        }
    }

    pub async fn send_to(&mut self, dst: &PublicKey, payload: &[u8]) {
        self.link
            .send(&Frame::Send {
                dst: plexsphere_wire::reach::relay::prefix(dst),
                payload: payload.to_vec(),
            })
            .await;
    }
}

/// Waits (bounded) until `cond` holds on the relay's counters.
pub async fn until(
    relay: &RelayHandle,
    what: &str,
    cond: impl Fn(&plexsphere_relay::Stats) -> bool,
) {
    until_within(relay, what, WAIT, cond).await
}

/// [`until`] with its own bound, for floods whose accepts lag behind on a loaded machine.
pub async fn until_within(
    relay: &RelayHandle,
    what: &str,
    within: Duration,
    cond: impl Fn(&plexsphere_relay::Stats) -> bool,
) {
    let deadline = tokio::time::Instant::now() + within;
    while !cond(&relay.stats()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {:?}",
            relay.stats()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
