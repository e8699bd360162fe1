//! A relay of the simulated world: the real relay's sans-IO core
//! (`plexsphere_relay::core::Core`, the decisions `plexsphere relay` makes) with the small
//! shell its UDP thread and TCP tasks are, minus the sockets: STUN answered on its UDP address
//! (charged to the source's prefix as the relay does), frames decoded and handed to the core,
//! its answers named by where they go. TCP connections are the world's links; the core knows
//! them by the writer queue it was given ([`ConnId`] here, as the world names them).

use std::net::SocketAddr;
use std::sync::Arc;

use plexsphere_relay::Limits;
use plexsphere_relay::core::{ConnId, Core, Peer, To, Transmit};
use plexsphere_relay::stats::Counters;
use plexsphere_wire::clock::Now;
use plexsphere_wire::node::RelaySpec;
use plexsphere_wire::reach::relay::Frame;
use plexsphere_wire::reach::{Kind, classify, public_key};
use plexsphere_wire::signed::DomainVerifier;
use tokio::sync::mpsc;

/// What a relay sends: a datagram from its UDP address, or a frame on a TCP connection.
#[derive(Debug)]
pub enum RelaySent {
    Udp { to: SocketAddr, datagram: Vec<u8> },
    Tcp { conn: ConnId, frame: Frame },
}

/// One TCP connection the relay's core knows: its writer queue (the core names a
/// connection's answers by it) and the receiving end, held so the queue stays open.
struct Conn {
    id: ConnId,
    tx: mpsc::Sender<Vec<u8>>,
    _rx: mpsc::Receiver<Vec<u8>>,
}

pub struct SimRelay {
    pub spec: RelaySpec,
    pub udp: SocketAddr,
    pub alive: bool,
    core: Core,
    counters: Arc<Counters>,
    conns: Vec<Conn>,
}

impl SimRelay {
    /// Relay `name` with key `secret` at `udp` (TLS on port 443 of the same address), trusting
    /// tokens the Domain key `domain` signed.
    pub fn new(name: &str, secret: [u8; 32], udp: SocketAddr, domain: &str, now: Now) -> Self {
        let verifier = DomainVerifier::from_b64(domain).expect("the test Domain's key");
        let tls = SocketAddr::new(udp.ip(), 443);
        let counters = Arc::new(Counters::default());
        Self {
            counters: counters.clone(),
            spec: RelaySpec {
                name: name.to_owned(),
                public_key: public_key(&secret).to_base64(),
                udp: Some(udp),
                tls: Some(tls),
                tls_server_name: Some(format!("{name}.relay.example")),
            },
            udp,
            alive: true,
            core: Core::new(
                secret,
                [0x5c; 32],
                vec![verifier],
                Limits::default(),
                counters,
                now.at,
            ),
            conns: Vec::new(),
        }
    }

    pub fn stats(&self) -> plexsphere_relay::Stats {
        self.counters.snapshot()
    }

    /// When the core's next sweep is due.
    pub fn poll_timeout(&self) -> Option<std::time::Instant> {
        self.core.poll_timeout()
    }

    pub fn handle_timeout(&mut self, now: Now, sent: &mut Vec<RelaySent>) {
        self.core.handle_timeout(now.at);
        self.drain(sent);
    }

    /// A datagram to the relay's UDP address from `from`.
    pub fn handle_udp(
        &mut self,
        datagram: &[u8],
        from: SocketAddr,
        now: Now,
        sent: &mut Vec<RelaySent>,
    ) {
        match classify(datagram) {
            Kind::Stun => {
                if let Some(answer) = plexsphere_relay::stun::answer(datagram, from)
                    && self.core.may_answer(Peer::Udp(from), now.at)
                {
                    sent.push(RelaySent::Udp {
                        to: from,
                        datagram: answer,
                    });
                }
            }
            Kind::Relay => {
                if let Ok(frame) = Frame::from_datagram(datagram) {
                    self.core.handle_frame(frame, Peer::Udp(from), now);
                    self.drain(sent);
                }
            }
            Kind::WireGuard | Kind::Disco | Kind::Unknown => {}
        }
    }

    /// A TCP connection from `addr` finished its TLS handshake: its number, or `None` when the
    /// core refuses it (too many).
    pub fn handle_tcp_open(&mut self, addr: SocketAddr, now: Now) -> Option<ConnId> {
        let (tx, rx) = mpsc::channel(1);
        let id = self.core.handle_tcp_open(tx.clone(), addr, now.at)?;
        self.conns.push(Conn { id, tx, _rx: rx });
        Some(id)
    }

    /// Whether connection `id` is open.
    pub fn has_conn(&self, id: ConnId) -> bool {
        self.conns.iter().any(|c| c.id == id)
    }

    pub fn handle_tcp_frame(
        &mut self,
        frame: Frame,
        id: ConnId,
        now: Now,
        sent: &mut Vec<RelaySent>,
    ) {
        self.core.handle_frame(frame, Peer::Tcp(id), now);
        self.drain(sent);
    }

    pub fn handle_tcp_close(&mut self, id: ConnId) {
        self.conns.retain(|c| c.id != id);
        self.core.handle_tcp_close(id);
    }

    /// The relay dies: it answers nothing more; the connections it had, by number (their
    /// nodes see them end).
    pub fn kill(&mut self) -> Vec<ConnId> {
        self.alive = false;
        let ids: Vec<ConnId> = self.conns.iter().map(|c| c.id).collect();
        for id in &ids {
            self.handle_tcp_close(*id);
        }
        ids
    }

    fn drain(&mut self, sent: &mut Vec<RelaySent>) {
        while let Some(t) = self.core.poll_transmit() {
            let (to, frame) = match t {
                Transmit::Frame(out) => (out.to, out.frame),
                // Only `handle_send` forwards undecoded; every frame here is decoded.
                Transmit::Forward { .. } => continue,
            };
            match to {
                To::Udp(to) => sent.push(RelaySent::Udp {
                    to,
                    datagram: frame.to_datagram(),
                }),
                To::Tcp(tx) => {
                    if let Some(c) = self.conns.iter().find(|c| c.tx.same_channel(&tx)) {
                        sent.push(RelaySent::Tcp { conn: c.id, frame });
                    }
                }
            }
        }
    }
}
