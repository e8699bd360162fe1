//! Set-up shared by the benches: two in-memory data-plane devices with a session between them,
//! and a raw ring ChaCha20-Poly1305 key for the crypto-only baselines.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Instant;

use plexd_dataplane::packet::ipv4_udp;
use plexd_dataplane::{Crypto, Device, DeviceUpdate, PacketBatch, PeerUpdate, Protocol, SecretKey};
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};

pub const A_MESH: Ipv4Addr = Ipv4Addr::new(10, 64, 0, 1);
pub const B_MESH: Ipv4Addr = Ipv4Addr::new(10, 64, 0, 2);
pub const A_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)), 51820);
pub const B_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)), 51820);

/// Two devices that are each other's only peer, with an established session.
pub struct Pair {
    pub a: Device,
    pub b: Device,
}

fn device(sk: &SecretKey, port: u16, protocol: Protocol) -> Device {
    let d = Device::with_protocol(protocol, plexsphere_wire::clock::Now::system());
    d.apply(DeviceUpdate {
        private_key: Some(Some(sk.clone())),
        listen_port: Some(port),
        ..Default::default()
    })
    .expect("a fresh device takes a key");
    d
}

fn peer(to: &SecretKey, mesh: Ipv4Addr, endpoint: SocketAddr) -> DeviceUpdate {
    let mut p = PeerUpdate::new(to.public_key());
    p.allowed_ips
        .push(format!("{mesh}/32").parse().expect("a /32"));
    p.endpoint = Some(endpoint);
    DeviceUpdate {
        peers: vec![p],
        ..Default::default()
    }
}

impl Pair {
    /// Configures both devices (boringtun's state machine) and runs the handshake through them.
    pub fn connected() -> Self {
        Self::connected_with(Protocol::Boringtun)
    }

    /// Like `connected`, with the peers on `protocol`.
    pub fn connected_with(protocol: Protocol) -> Self {
        let (ka, kb) = (
            SecretKey::generate().expect("random"),
            SecretKey::generate().expect("random"),
        );
        let a = device(&ka, A_ADDR.port(), protocol);
        let b = device(&kb, B_ADDR.port(), protocol);
        a.apply(peer(&kb, B_MESH, B_ADDR)).expect("peer b");
        b.apply(peer(&ka, A_MESH, A_ADDR)).expect("peer a");
        let pair = Pair { a, b };
        let now = Instant::now();
        let mut out = PacketBatch::for_datagrams(8);
        pair.a.handle_tun(
            now,
            [&ipv4_udp(A_MESH, B_MESH, b"hello")[..]],
            Crypto::Inline(&mut out),
        );
        // Bounce messages until both sides are quiet: initiation, response, keepalive/data.
        let mut from_a = true;
        for _ in 0..8 {
            if out.is_empty() {
                break;
            }
            let (dev, from) = if from_a {
                (&pair.b, A_ADDR)
            } else {
                (&pair.a, B_ADDR)
            };
            let mut next = PacketBatch::for_datagrams(8);
            let mut tun = PacketBatch::for_packets(8);
            for (d, _) in out.iter() {
                dev.handle_udp(now, [(d, from, None)], &mut next, Crypto::Inline(&mut tun));
            }
            out = next;
            from_a = !from_a;
        }
        pair
    }

    /// One datagram a would send b for `packet`.
    pub fn encrypt_a(&self, packet: &[u8], out: &mut PacketBatch) {
        out.clear();
        self.a
            .handle_tun(Instant::now(), [packet], Crypto::Inline(out));
    }
}

/// An IPv4/UDP packet of exactly `size` bytes from a to b.
pub fn packet(size: usize) -> Vec<u8> {
    let payload = vec![0x5a; size.saturating_sub(28)];
    ipv4_udp(A_MESH, B_MESH, &payload)
}

/// A raw ChaCha20-Poly1305 key with a counter nonce, as WireGuard uses it.
pub struct RawAead {
    key: LessSafeKey,
    counter: u64,
}

impl Default for RawAead {
    fn default() -> Self {
        Self::new()
    }
}

impl RawAead {
    pub fn new() -> Self {
        let key = UnboundKey::new(&CHACHA20_POLY1305, &[7u8; 32]).expect("a 32-byte key");
        Self {
            key: LessSafeKey::new(key),
            counter: 0,
        }
    }

    fn nonce(counter: u64) -> Nonce {
        let mut n = [0u8; 12];
        n[4..].copy_from_slice(&counter.to_le_bytes());
        Nonce::assume_unique_for_key(n)
    }

    /// Seals `buf` in place (a fresh nonce each time) and appends the tag.
    pub fn seal(&mut self, buf: &mut Vec<u8>) {
        self.counter += 1;
        self.key
            .seal_in_place_append_tag(Self::nonce(self.counter), Aad::empty(), buf)
            .expect("sealing never fails for these sizes");
    }

    /// Opens `buf` (sealed with `counter`) in place; answers the plaintext length.
    pub fn open(&self, counter: u64, buf: &mut [u8]) -> usize {
        self.key
            .open_in_place(Self::nonce(counter), Aad::empty(), buf)
            .map(|p| p.len())
            .unwrap_or(0)
    }

    pub fn counter(&self) -> u64 {
        self.counter
    }
}

/// A Domain of 1,000 nodes (role tags `r0`..`r39`) in which `a` and `b` are two of them
/// (tags `bench-a`, `bench-b`), under a policy of `rules` rules: role -> role TCP ports, UDP
/// ranges, ICMP, and in the middle the one that lets a open tcp/udp 9 and 5201 and icmp on b.
/// Answers a's and b's compiled views (what their signed states would carry).
pub fn policy_views(
    rules: usize,
    a: Ipv4Addr,
    b: Ipv4Addr,
) -> (
    plexsphere_policy::view::NodeView,
    plexsphere_policy::view::NodeView,
) {
    use plexsphere_policy::{Compiled, Inventory, NodeInfo, ProjectInfo};
    const NODES: usize = 1000;
    const ROLES: usize = 40;
    let project = uuid::Uuid::from_u128(0x10_0000);
    let nodes = (0..NODES)
        .map(|i| {
            let mut tags = vec![format!("r{}", i % ROLES)];
            let ipv4 = match i {
                0 => {
                    tags.push("bench-a".into());
                    a
                }
                1 => {
                    tags.push("bench-b".into());
                    b
                }
                _ => Ipv4Addr::from(0x0a63_0000u32 + i as u32),
            };
            NodeInfo {
                id: uuid::Uuid::from_u128(i as u128 + 1),
                name: format!("n{i}"),
                project_id: project,
                project_slug: "p".into(),
                tags,
                ipv4: Some(ipv4),
                ipv6: None,
            }
        })
        .collect();
    let inv = Inventory {
        projects: vec![ProjectInfo {
            id: project,
            slug: "p".into(),
        }],
        nodes,
        tags: Vec::new(),
    };
    let mut doc = String::from("rules:\n");
    for i in 0..rules {
        if i == rules / 2 {
            doc.push_str(
                "  - {src: tag:bench-a, dst: tag:bench-b, proto: [tcp, udp], ports: [9, 5201]}\n",
            );
            continue;
        }
        if i == rules / 2 + 1 {
            doc.push_str("  - {src: tag:bench-a, dst: tag:bench-b, proto: icmp}\n");
            continue;
        }
        let (s, d) = ((i * 7 + 3) % ROLES, (i * 13 + 5) % ROLES);
        let port = 1000 + (i % 50_000) as u16;
        doc.push_str(&match i % 3 {
            0 => format!("  - {{src: tag:r{s}, dst: tag:r{d}, proto: tcp, ports: {port}}}\n"),
            1 => format!(
                "  - {{src: tag:r{s}, dst: tag:r{d}, proto: udp, ports: {port}-{}}}\n",
                port + 10
            ),
            _ => format!("  - {{src: tag:r{s}, dst: tag:r{d}, proto: icmp}}\n"),
        });
    }
    let policy = plexsphere_policy::parse(&doc).expect("the bench document parses");
    let c = Compiled::new(&policy, &inv);
    let view = |i: u128| {
        c.node_view(uuid::Uuid::from_u128(i))
            .expect("a node of the inventory")
    };
    (view(1), view(2))
}

impl Pair {
    /// Installs a `rules`-rule policy's filters on both devices ([`policy_views`]).
    pub fn with_policy(self, rules: usize) -> Self {
        let (va, vb) = policy_views(rules, A_MESH, B_MESH);
        for (d, v) in [(&self.a, va), (&self.b, vb)] {
            let (f, e) = plexd_dataplane::PolicyFilter::from_view(1, &v);
            assert!(e.is_none(), "the bench view builds a filter");
            d.set_policy(Some(f));
        }
        self
    }
}
