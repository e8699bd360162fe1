//! Relayed peers over a relay's TCP/TLS link inside the data plane
//! (`plexd_dataplane::relay_link`): two nodes whose endpoints for each other are their links'
//! relay endpoints carry traffic through a stand-in relay that reads each node's link queue
//! (stream `send`s, as the link's writer would put them on the TLS stream) and hands the
//! other node's link reader the `recv`s (as `plexsphere relay` answers), with nothing on the
//! UDP socket and nothing for the side channel. A `recv` naming another peer moves no
//! endpoint; a link without a slot keeps its frames; a closed link's endpoint is gone and its
//! slot reused.

mod memory_node;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use memory_node::{Node, bounded_sink, wait, with_side};
use plexd_dataplane::memory::MemoryNetwork;
use plexd_dataplane::packet::ipv4_udp;
use plexd_dataplane::relay::decode;
use plexd_dataplane::relay_link::Taken;
use plexd_dataplane::runner::RunConfig;
use plexd_dataplane::{LinkDoor, LinkInbox, LinkQueue, PacketBatch, RelayError, Tun};
use plexsphere_wire::reach::relay::{Frame, KeyPrefix, prefix};

const MA: Ipv4Addr = Ipv4Addr::new(10, 64, 0, 1);
const MB: Ipv4Addr = Ipv4Addr::new(10, 64, 0, 2);

/// One node's end of its relay link: the queue its data plane fills, the door its reader
/// hands `recv`s through.
struct End {
    node: Node,
    link: Arc<LinkQueue>,
    door: LinkDoor,
    /// What the node's socket handed the side channel.
    side: mpsc::Receiver<(Vec<u8>, SocketAddr)>,
}

/// Two link ends joined by a stand-in relay: each `send` one end's queue holds becomes a
/// `recv` (naming the sender's prefix, or a stranger's while `misname` is on) offered to the
/// other end's door; frames the door does not take are kept in `kept`.
struct Lab {
    a: End,
    b: End,
    misname: Arc<AtomicBool>,
    sends: Arc<AtomicU64>,
    kept: mpsc::Receiver<Vec<u8>>,
    stop: Arc<AtomicBool>,
    pump: Option<JoinHandle<()>>,
    _net: MemoryNetwork,
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.pump.take() {
            let _ = t.join();
        }
    }
}

fn end(net: &MemoryNetwork, ip: [u8; 4]) -> End {
    let (sink, side) = bounded_sink(64);
    let door = LinkDoor::new();
    let config = RunConfig {
        links: Some(door.clone()),
        ..with_side(Some(sink))
    };
    End {
        node: Node::start(net, ip, 51820, config),
        link: LinkQueue::new(),
        door,
        side,
    }
}

/// The `recv`s the stand-in relay makes of one queue's bytes (every frame must be a `send`).
fn recvs(bytes: &[u8], src: KeyPrefix) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while rest.len() >= 2 {
        let len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        let Ok(Frame::Send { payload, .. }) = Frame::decode(&rest[2..2 + len]) else {
            panic!("the link queue holds only sends here");
        };
        out.push(Frame::Recv { src, payload }.to_stream());
        rest = &rest[2 + len..];
    }
    out
}

fn lab() -> Lab {
    let net = MemoryNetwork::new();
    let a = end(&net, [192, 0, 2, 1]);
    let b = end(&net, [192, 0, 2, 2]);
    let eb = a
        .node
        .device
        .relay_link_endpoint(&a.link, &b.node.public())
        .expect("a link endpoint");
    let ea = b
        .node
        .device
        .relay_link_endpoint(&b.link, &a.node.public())
        .expect("a link endpoint");
    a.node.add_peer(&b.node, eb, "10.64.0.2/32");
    b.node.add_peer(&a.node, ea, "10.64.0.1/32");
    let (misname, sends, stop) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let (kept_tx, kept) = mpsc::channel();
    let pump = {
        let ends = [
            (a.link.clone(), prefix(&a.node.public())),
            (b.link.clone(), prefix(&b.node.public())),
        ];
        let doors = [
            (b.door.clone(), b.link.clone()),
            (a.door.clone(), a.link.clone()),
        ];
        let (misname, sends, stop) = (misname.clone(), sends.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let mut inbox = LinkInbox::new();
            while !stop.load(Ordering::Relaxed) {
                for ((from, src), (door, link)) in ends.iter().zip(&doors) {
                    if from.take(&mut bytes, Duration::from_millis(5)) != Taken::Bytes {
                        continue;
                    }
                    let src = if misname.load(Ordering::Relaxed) {
                        [0xEE; 8]
                    } else {
                        *src
                    };
                    let hand = door.hand(link);
                    for recv in recvs(&bytes, src) {
                        sends.fetch_add(1, Ordering::Relaxed);
                        if !hand
                            .as_ref()
                            .is_some_and(|h| h.offer(&mut inbox, &recv[2..]))
                        {
                            let _ = kept_tx.send(recv);
                        }
                    }
                    if let Some(hand) = &hand {
                        hand.flush(&mut inbox);
                    }
                }
            }
        })
    };
    Lab {
        a,
        b,
        misname,
        sends,
        kept,
        stop,
        pump: Some(pump),
        _net: net,
    }
}

fn endpoint_of(node: &Node, other: &Node) -> Option<SocketAddr> {
    node.device.peer(&other.public()).and_then(|p| p.endpoint())
}

/// Whether `payload` reaches `to`'s host within `wait_for`.
fn arrives(to: &Node, payload: &[u8], wait_for: Duration) -> bool {
    let mut batch = PacketBatch::for_packets(8);
    let deadline = std::time::Instant::now() + wait_for;
    while std::time::Instant::now() < deadline {
        if to
            .host
            .recv(&mut batch, Duration::from_millis(20))
            .expect("host recv")
            > 0
            && batch.iter().any(|(p, _)| p.get(28..) == Some(payload))
        {
            return true;
        }
    }
    false
}

fn carries(from: &Node, to: &Node, (src, dst): (Ipv4Addr, Ipv4Addr), payload: &[u8]) {
    from.host.send_one(&ipv4_udp(src, dst, payload));
    assert!(
        arrives(to, payload, Duration::from_secs(10)),
        "the packet through the link within 10 s"
    );
}

#[test]
fn link_relayed_peers_carry_traffic_with_nothing_on_the_udp_socket() {
    let l = lab();
    let eb = endpoint_of(&l.a.node, &l.b.node).expect("endpoint");
    carries(&l.a.node, &l.b.node, (MA, MB), b"through the link");
    carries(&l.b.node, &l.a.node, (MB, MA), b"and back");
    // Bursts until more than one inbox's worth (LINK_INBOX, 64) crossed: the in-memory TUN's
    // queue is bounded, and a loaded machine drops from one burst of 200 what the packet thread
    // has not taken yet (a CI run saw 6 cross).
    wait(
        || {
            for _ in 0..32 {
                l.a.node.host.send_one(&ipv4_udp(MA, MB, &[7; 1200]));
            }
            l.sends.load(Ordering::Relaxed) > 64
        },
        "bursts crossing the link in more than one inbox",
    );
    carries(&l.a.node, &l.b.node, (MA, MB), b"after a burst");
    for e in [&l.a, &l.b] {
        let c = &e.node.device.relays().counters;
        assert!(c.framed.load(Ordering::Relaxed) >= 2, "framed: {c:?}");
        assert_eq!(c.gone.load(Ordering::Relaxed), 0);
        assert_eq!(
            c.unwrapped.load(Ordering::Relaxed),
            0,
            "nothing came over UDP"
        );
        assert!(e.link.counters.queued.load(Ordering::Relaxed) >= 2);
        assert!(
            e.node.device.relays().relays().is_empty(),
            "a link is no UDP relay"
        );
        assert!(e.side.try_recv().is_err(), "nothing came to the socket");
    }
    assert!(
        l.kept.try_recv().is_err(),
        "every recv went to a data plane"
    );
    // The endpoints stay the links' (answers go back on the link).
    assert_eq!(endpoint_of(&l.a.node, &l.b.node), Some(eb));
    assert_eq!(
        endpoint_of(&l.b.node, &l.a.node)
            .and_then(decode)
            .map(|(_, p)| p),
        Some(prefix(&l.a.node.public()))
    );
}

#[test]
fn a_link_recv_naming_another_peer_is_dropped_and_moves_no_endpoint() {
    let l = lab();
    carries(&l.a.node, &l.b.node, (MA, MB), b"first");
    let ea = endpoint_of(&l.b.node, &l.a.node).expect("endpoint");
    l.misname.store(true, Ordering::Relaxed);
    l.a.node.host.send_one(&ipv4_udp(MA, MB, b"misnamed"));
    let misnamed = &l.b.node.device.counters().relay_misnamed;
    wait(
        || misnamed.load(Ordering::Relaxed) >= 1,
        "b refuses the misnamed datagram",
    );
    assert_eq!(endpoint_of(&l.b.node, &l.a.node), Some(ea));
    assert!(!arrives(&l.b.node, b"misnamed", Duration::from_millis(200)));
}

#[test]
fn a_link_without_a_slot_keeps_its_frames_and_a_closed_link_is_gone() {
    let l = lab();
    carries(&l.a.node, &l.b.node, (MA, MB), b"first");
    // Another link of b's, never given a slot: its recvs are the runtime's.
    let stranger = LinkQueue::new();
    let recv = Frame::Recv {
        src: prefix(&l.a.node.public()),
        payload: vec![4, 0, 0, 0, 1, 2, 3],
    }
    .to_stream();
    let mut inbox = LinkInbox::new();
    assert!(
        l.b.door.hand(&stranger).is_none(),
        "{recv:?} is the runtime's"
    );
    // Disco or control frames on a link with a slot are the runtime's too.
    let hand = l.b.door.hand(&l.b.link).expect("b's link has a slot");
    let ping = Frame::Ping { nonce: [1; 8] }.to_stream();
    assert!(!hand.offer(&mut inbox, &ping[2..]));
    let disco = Frame::Recv {
        src: prefix(&l.a.node.public()),
        payload: b"pxd\x02rest".to_vec(),
    }
    .to_stream();
    assert!(!hand.offer(&mut inbox, &disco[2..]));
    assert!(
        hand.offer(&mut inbox, &recv[2..]),
        "a WireGuard recv is the data plane's"
    );
    drop(hand);

    // a's link closes: what a sends b now is gone, a closed link gets no endpoint, and its
    // slot goes to the next link.
    let gone = &l.a.node.device.relays().counters.gone;
    let before = gone.load(Ordering::Relaxed);
    l.a.link.close();
    l.a.node
        .host
        .send_one(&ipv4_udp(MA, MB, b"after the close"));
    wait(
        || gone.load(Ordering::Relaxed) > before,
        "the datagram for a closed link is counted gone",
    );
    assert!(!arrives(
        &l.b.node,
        b"after the close",
        Duration::from_millis(200)
    ));
    assert_eq!(
        l.a.node
            .device
            .relay_link_endpoint(&l.a.link, &l.b.node.public()),
        Err(RelayError::Closed)
    );
    let old = endpoint_of(&l.a.node, &l.b.node).and_then(decode);
    let next = LinkQueue::new();
    let new =
        l.a.node
            .device
            .relay_link_endpoint(&next, &l.b.node.public())
            .expect("the freed slot");
    assert_eq!(decode(new).map(|(slot, _)| slot), old.map(|(slot, _)| slot));
}
