//! The userspace data plane's hot paths, each beside its crypto-only floor.
//!
//! `cargo bench -p plexsphere-benches --bench dataplane` (add `-- --quick` for a fast pass).

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::noise::{Tunn, TunnResult};
use boringtun::x25519::{PublicKey, StaticSecret};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use plexd_dataplane::memory::{MemoryNetwork, tun_pair};
use plexd_dataplane::pool::{CryptoPool, Job, Ordered};
use plexd_dataplane::{AllowedIps, Crypto, PacketBatch, Protocol, SecretKey, Tun, Udp};
use plexsphere_benches::{A_ADDR, B_ADDR, Pair, RawAead, packet};

const SIZES: [usize; 3] = [64, 512, 1420];

fn encapsulate(c: &mut Criterion) {
    let pair = Pair::connected();
    let mut g = c.benchmark_group("encapsulate");
    for size in SIZES {
        let p = packet(size);
        g.throughput(Throughput::Bytes(size as u64));
        let mut out = PacketBatch::for_datagrams(1);
        g.bench_function(format!("plexd/{size}"), |b| {
            b.iter(|| {
                pair.encrypt_a(black_box(&p), &mut out);
                black_box(out.len())
            })
        });
        let mut aead = RawAead::new();
        let mut buf = Vec::with_capacity(size + 16);
        g.bench_function(format!("ring-seal/{size}"), |b| {
            b.iter(|| {
                buf.clear();
                buf.extend_from_slice(&p);
                aead.seal(&mut buf);
                black_box(buf.len())
            })
        });
    }
    g.finish();
}

fn decapsulate(c: &mut Criterion) {
    let pair = Pair::connected();
    let mut g = c.benchmark_group("decapsulate");
    for size in SIZES {
        let p = packet(size);
        g.throughput(Throughput::Bytes(size as u64));
        let mut net = PacketBatch::for_datagrams(4);
        let mut tun = PacketBatch::for_packets(4);
        let mut enc = PacketBatch::for_datagrams(1);
        // Each datagram is fresh (the replay window refuses a repeat); encrypting is set-up.
        g.bench_function(format!("plexd/{size}"), |b| {
            b.iter_batched_ref(
                || {
                    pair.encrypt_a(&p, &mut enc);
                    enc.get(0).to_vec()
                },
                |d| {
                    net.clear();
                    tun.clear();
                    pair.b.handle_udp(
                        Instant::now(),
                        [(&d[..], A_ADDR, None)],
                        &mut net,
                        Crypto::Inline(&mut tun),
                    );
                    assert_eq!(tun.len(), 1, "decrypted and routed");
                },
                BatchSize::SmallInput,
            )
        });
        let mut aead = RawAead::new();
        let mut sealed = p.clone();
        aead.seal(&mut sealed);
        let counter = aead.counter();
        // The same cold-buffer set-up as above, so only the work differs.
        g.bench_function(format!("ring-open/{size}"), |b| {
            b.iter_batched_ref(
                || sealed.clone(),
                |buf| black_box(aead.open(counter, buf)),
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

/// 64 x 1420 B: host TUN -> device a -> virtual UDP -> device b -> host TUN, one thread.
fn pipeline(c: &mut Criterion) {
    const N: usize = 64;
    const SIZE: usize = 1420;
    let pair = Pair::connected();
    let (host_a, tun_a) = tun_pair();
    let (tun_b, host_b) = tun_pair();
    let net = MemoryNetwork::new();
    let udp_a = net.bind(A_ADDR).expect("bind a");
    let udp_b = net.bind(B_ADDR).expect("bind b");
    let p = packet(SIZE);
    let mut inject = PacketBatch::for_packets(N);
    for _ in 0..N {
        inject.push(&p, plexd_dataplane::batch::NO_ADDR);
    }
    let (mut read_a, mut out_a) = (PacketBatch::for_packets(N), PacketBatch::for_datagrams(N));
    let (mut read_b, mut net_b) = (PacketBatch::for_datagrams(N), PacketBatch::for_datagrams(4));
    let (mut to_tun_b, mut got) = (PacketBatch::for_packets(N), PacketBatch::for_packets(N));

    let mut g = c.benchmark_group("batch-64x1420");
    g.throughput(Throughput::Bytes((N * SIZE) as u64));
    g.bench_function("plexd-in-memory-pipeline", |b| {
        b.iter(|| {
            host_a.send(&inject).expect("inject");
            tun_a.recv(&mut read_a, Duration::ZERO).expect("tun a");
            out_a.clear();
            pair.a.handle_tun(
                Instant::now(),
                read_a.iter().map(|(p, _)| p),
                Crypto::Inline(&mut out_a),
            );
            udp_a.send(&out_a).expect("udp a");
            udp_b.recv(&mut read_b, Duration::ZERO).expect("udp b");
            net_b.clear();
            to_tun_b.clear();
            pair.b.handle_udp(
                Instant::now(),
                read_b.datagrams_to(),
                &mut net_b,
                Crypto::Inline(&mut to_tun_b),
            );
            tun_b.send(&to_tun_b).expect("tun b");
            let n = host_b.recv(&mut got, Duration::ZERO).expect("host b");
            assert_eq!(n, N, "every packet crossed");
        })
    });
    // The same pipeline with the access policy's filter on both devices (1,000 rules):
    // a's outbound decision (and flow table) before sealing, b's inbound after opening.
    let policed = Pair::connected().with_policy(1000);
    g.bench_function("plexd-in-memory-pipeline-policy-1000-rules", |b| {
        b.iter(|| {
            host_a.send(&inject).expect("inject");
            tun_a.recv(&mut read_a, Duration::ZERO).expect("tun a");
            out_a.clear();
            policed.a.handle_tun(
                Instant::now(),
                read_a.iter().map(|(p, _)| p),
                Crypto::Inline(&mut out_a),
            );
            udp_a.send(&out_a).expect("udp a");
            udp_b.recv(&mut read_b, Duration::ZERO).expect("udp b");
            net_b.clear();
            to_tun_b.clear();
            policed.b.handle_udp(
                Instant::now(),
                read_b.datagrams_to(),
                &mut net_b,
                Crypto::Inline(&mut to_tun_b),
            );
            tun_b.send(&to_tun_b).expect("tun b");
            let n = host_b.recv(&mut got, Duration::ZERO).expect("host b");
            assert_eq!(n, N, "every packet crossed the filters");
        })
    });
    // The same four hops with nothing between them: what the in-memory devices alone cost
    // (each hop copies a packet into a locked queue and out again, as a kernel buffer would).
    // The pipeline less this is the data plane's own share, to set beside the floor.
    let mut wire = PacketBatch::for_datagrams(N);
    let mut plain = PacketBatch::for_packets(N);
    let d = vec![0u8; SIZE + 32];
    for _ in 0..N {
        wire.push(&d, B_ADDR);
        plain.push(&p, plexd_dataplane::batch::NO_ADDR);
    }
    g.bench_function("in-memory-devices-only", |b| {
        b.iter(|| {
            host_a.send(&inject).expect("inject");
            tun_a.recv(&mut read_a, Duration::ZERO).expect("tun a");
            udp_a.send(black_box(&wire)).expect("udp a");
            udp_b.recv(&mut read_b, Duration::ZERO).expect("udp b");
            tun_b.send(black_box(&plain)).expect("tun b");
            let n = host_b.recv(&mut got, Duration::ZERO).expect("host b");
            assert_eq!(n, N, "every packet crossed");
        })
    });
    let mut aead = RawAead::new();
    let mut bufs: Vec<Vec<u8>> = (0..N).map(|_| Vec::with_capacity(SIZE + 16)).collect();
    g.bench_function("ring-seal+open-only", |b| {
        b.iter(|| {
            for buf in &mut bufs {
                buf.clear();
                buf.extend_from_slice(&p);
                aead.seal(buf);
                let c = aead.counter();
                black_box(aead.open(c, buf));
            }
        })
    });
    g.finish();
}

/// The ordered crypto pool's split, on plexd's own protocol: 64 x 1420 B sealed inline by the
/// reading thread, against only the reading thread's share of the pool path (session, counter,
/// header and plaintext laid out; no AEAD), and the whole through a pool of one and two
/// workers (four jobs of 16 packets, released in order). The reading thread's share over the
/// inline time bounds what more workers can give: one reading thread keeps up with about
/// inline / share workers.
fn crypto_pool(c: &mut Criterion) {
    const N: usize = 64;
    const SIZE: usize = 1420;
    const PER_JOB: usize = 16;
    let pair = Pair::connected_with(Protocol::Plexd);
    let p = packet(SIZE);
    let packets: Vec<&[u8]> = (0..N).map(|_| &p[..]).collect();
    let mut g = c.benchmark_group("crypto-pool-64x1420");
    g.throughput(Throughput::Bytes((N * SIZE) as u64));
    let mut out = PacketBatch::for_datagrams(N);
    g.bench_function("inline-seal", |b| {
        b.iter(|| {
            out.clear();
            pair.a.handle_tun(
                Instant::now(),
                packets.iter().copied(),
                Crypto::Inline(&mut out),
            );
            assert_eq!(out.len(), N);
        })
    });
    let mut job = Job::new(PacketBatch::for_datagrams(N));
    g.bench_function("reading-thread-share", |b| {
        b.iter(|| {
            job.batch.clear();
            job.ops.clear();
            pair.a.handle_tun(
                Instant::now(),
                packets.iter().copied(),
                Crypto::Pool(&mut job),
            );
            assert_eq!(job.ops.len(), N, "every packet deferred");
        })
    });
    for workers in [1, 2] {
        let pool = Arc::new(CryptoPool::new(workers, || {}).expect("threads"));
        let mut ordered = Ordered::new(pool, 2 * workers);
        g.bench_function(format!("pool-{workers}-workers"), |b| {
            b.iter(|| {
                let mut sealed = 0;
                for chunk in packets.chunks(PER_JOB) {
                    let mut job = ordered.spare(|| PacketBatch::for_datagrams(PER_JOB));
                    pair.a.handle_tun(
                        Instant::now(),
                        chunk.iter().copied(),
                        Crypto::Pool(&mut job),
                    );
                    ordered.submit(job);
                    while let Some(done) = ordered.next_done(ordered.is_full()) {
                        sealed += done.batch.len();
                        ordered.recycle(done);
                    }
                }
                while let Some(done) = ordered.next_done(true) {
                    sealed += done.batch.len();
                    ordered.recycle(done);
                }
                assert_eq!(sealed, N);
            })
        });
    }
    g.finish();
}

fn allowed_ips(c: &mut Criterion) {
    // 10k peers: a /32 each in 10.64.0.0/16 and beyond, every tenth also routing a /24.
    let mut table = AllowedIps::new();
    for i in 0..10_000u32 {
        let host = Ipv4Addr::from(0x0a40_0000 + i);
        table.insert(format!("{host}/32").parse().expect("net"), i);
        if i % 10 == 0 {
            let subnet = Ipv4Addr::from(0x0b00_0000 + (i << 8));
            table.insert(format!("{subnet}/24").parse().expect("net"), i);
        }
    }
    let probes: Vec<IpAddr> = (0..1024u32)
        .map(|i| {
            let a = if i % 2 == 0 {
                0x0a40_0000 + (i * 9) % 10_000
            } else {
                0x0b00_0000 + (((i * 10) % 10_000) << 8) + 7
            };
            IpAddr::V4(Ipv4Addr::from(a))
        })
        .collect();
    let mut g = c.benchmark_group("allowed-ips");
    g.throughput(Throughput::Elements(probes.len() as u64));
    g.bench_function("lookup-10k-prefixes/1024-probes", |b| {
        b.iter(|| {
            let mut hits = 0u32;
            for p in &probes {
                hits += u32::from(table.get(*p).is_some());
            }
            assert_eq!(hits, 1024);
            hits
        })
    });
    g.finish();
}

fn handshake(c: &mut Criterion) {
    let (ka, kb) = (
        SecretKey::generate().expect("key"),
        SecretKey::generate().expect("key"),
    );
    let sa = StaticSecret::from(*ka.bytes());
    let sb = StaticSecret::from(*kb.bytes());
    let (pa, pb) = (PublicKey::from(&sa), PublicKey::from(&sb));
    // A limiter that never asks for cookies, so every iteration is a full handshake.
    let rl = |pk: &PublicKey| Some(Arc::new(RateLimiter::new(pk, u64::MAX)));
    let mut a = Tunn::new(sa, pb, None, None, 1, rl(&pa));
    let mut b = Tunn::new(sb, pa, None, None, 2, rl(&pb));
    let (mut m1, mut m2, mut m3) = (vec![0u8; 256], vec![0u8; 256], vec![0u8; 256]);
    let src = Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)));
    c.bench_function("handshake/initiation+response+confirm", |bench| {
        bench.iter(|| {
            let TunnResult::WriteToNetwork(init) = a.format_handshake_initiation(&mut m1, true)
            else {
                panic!("no initiation")
            };
            let TunnResult::WriteToNetwork(resp) = b.decapsulate(src, init, &mut m2) else {
                panic!("no response")
            };
            let TunnResult::WriteToNetwork(ka) = a.decapsulate(src, resp, &mut m3) else {
                panic!("no keepalive")
            };
            black_box(ka.len())
        })
    });
}

/// One peer's endpoint and allowed IPs replaced on a device with 10k peers.
fn apply_one_change(c: &mut Criterion) {
    use plexd_dataplane::{Device, DeviceUpdate, PeerUpdate, PublicKey};
    let device = Device::new(plexsphere_wire::clock::Now::system());
    let peers: Vec<PeerUpdate> = (0..10_000u32)
        .map(|i| {
            let mut key = [0u8; 32];
            key[..4].copy_from_slice(&i.to_le_bytes());
            let mut p = PeerUpdate::new(PublicKey(key));
            let host = Ipv4Addr::from(0x0a40_0000 + i);
            p.allowed_ips
                .push(format!("{host}/32").parse().expect("net"));
            p
        })
        .collect();
    device
        .apply(DeviceUpdate {
            private_key: Some(Some(SecretKey::generate().expect("key"))),
            peers,
            ..Default::default()
        })
        .expect("10k peers");
    let mut port = 0u16;
    c.bench_function("device/apply-one-peer-change-at-10k-peers", |b| {
        b.iter(|| {
            port = port.wrapping_add(1);
            let mut p = PeerUpdate::new(PublicKey([0u8; 32]));
            p.endpoint = Some(std::net::SocketAddr::from(([192, 0, 2, 9], port)));
            p.replace_allowed_ips = true;
            p.allowed_ips.push("10.64.0.0/32".parse().expect("net"));
            device
                .apply(DeviceUpdate {
                    peers: vec![p],
                    ..Default::default()
                })
                .expect("apply")
        })
    });
}

criterion_group!(
    benches,
    apply_one_change,
    encapsulate,
    decapsulate,
    pipeline,
    crypto_pool,
    allowed_ips,
    handshake
);
criterion_main!(benches);
