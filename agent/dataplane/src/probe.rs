//! The segmentation probe: does the path to a peer carry UDP GSO super-datagrams?
//!
//! Some kernels, NICs and paths lose or corrupt the runs of equal datagrams the socket sends
//! with UDP GSO, while single datagrams (handshakes, keepalives, pings) still pass: the tunnel
//! looks up, bulk traffic stalls. The probe tells the two apart from the data plane itself:
//! it builds [`PROBE_PACKETS`] ICMP echo requests of nearly the MTU from our mesh address to a
//! peer's, encrypts them through the peer's current session, and sends them twice: once as
//! one batch (the socket makes it one GSO send) and once one datagram per send,
//! [`PROBE_SINGLE_SPACING`] apart. The peer's kernel answers echo requests on its mesh address
//! whatever WireGuard it runs. The receive path recognises the probe's replies after decryption
//! (our identifier, a marker, one sequence number per request) and counts them instead of
//! writing them to the TUN; every other packet goes on as before.
//!
//! The verdict ([`Verdict`]): `ok` when segmented replies arrive, `segmented_lost` when the
//! single ones arrive and at most [`PROBE_MAX_SEGMENTED_WHEN_LOST`] segmented ones do, and
//! `inconclusive` when fewer than [`PROBE_MIN_SINGLE_REPLIES`] single ones arrive (ICMP
//! filtered on the peer, the peer down): nothing can be said about segmentation then.
//!
//! Cost on the packet path: while no probe runs, one relaxed atomic load per decrypted packet;
//! while one runs, the protocol byte is looked at first, and only ICMP echo replies go further.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::machine::Step;

use crate::batch::{PacketBatch, WG_OVERHEAD};
use crate::device::Device;
use crate::key::PublicKey;
pub use crate::probe_match::PROBE_PACKETS;
use crate::probe_match::{ECHO_REQUEST_V4, ECHO_REQUEST_V6, ICMP, ICMPV6, Track};
use crate::probe_match::{PROBE_MARKER, PROBE_MAX_CONCURRENT};
use crate::side::RawSender;
use crate::udp_offload::UdpOffloadSwitch;

/// Time between two single sends: the single requests must not leave as a burst.
pub(crate) const PROBE_SINGLE_SPACING: Duration = Duration::from_millis(20);
/// How long the probe waits for replies after its last send.
pub(crate) const PROBE_REPLY_WAIT: Duration = Duration::from_secs(2);
/// Fewer single replies than this: the verdict is `inconclusive` (ICMP filtered, peer down).
pub(crate) const PROBE_MIN_SINGLE_REPLIES: usize = PROBE_PACKETS / 2;
/// With the single replies in, at most this many segmented ones: `segmented_lost`.
pub(crate) const PROBE_MAX_SEGMENTED_WHEN_LOST: usize = PROBE_PACKETS / 4;
/// The smallest and largest inner packet the probe builds (IP header included).
pub(crate) const PROBE_MIN_SIZE: usize = 128;
pub(crate) const PROBE_MAX_SIZE: usize = 9000;
const TTL: u8 = 64;

/// What a probe found out about one peer's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Segmented datagrams arrive.
    Ok,
    /// Single datagrams arrive, segmented ones do not: switch UDP offload off for this node.
    SegmentedLost,
    /// Single datagrams do not arrive either (ICMP filtered, the peer down): no verdict.
    Inconclusive,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::SegmentedLost => "segmented_lost",
            Verdict::Inconclusive => "inconclusive",
        }
    }

    /// The verdict for these reply counts (out of [`PROBE_PACKETS`] each).
    pub(crate) fn from_counts(segmented: usize, single: usize) -> Self {
        if single < PROBE_MIN_SINGLE_REPLIES {
            Verdict::Inconclusive
        } else if segmented <= PROBE_MAX_SEGMENTED_WHEN_LOST {
            Verdict::SegmentedLost
        } else {
            Verdict::Ok
        }
    }
}

/// One probe's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeReport {
    pub peer: PublicKey,
    /// Our mesh address and the peer's (the inner source and destination).
    pub src: IpAddr,
    pub dst: IpAddr,
    /// The inner packet size of each request.
    pub size: usize,
    /// Requests sent each way ([`PROBE_PACKETS`]).
    pub sent: usize,
    /// Replies to the segmented and to the single requests.
    pub segmented_replies: usize,
    pub single_replies: usize,
    pub verdict: Verdict,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProbeError {
    #[error("no such peer {0}")]
    NoPeer(PublicKey),
    #[error("peer {0} has no endpoint yet; probe it once it has handshaken")]
    NoEndpoint(PublicKey),
    #[error("peer {0} has no current session; probe it after a handshake")]
    NoSession(PublicKey),
    #[error("the device has no private key")]
    NoKey,
    #[error("{src} and {dst} are not of one IP family")]
    Family { src: IpAddr, dst: IpAddr },
    #[error(
        "a probe packet of {0} bytes is outside {PROBE_MIN_SIZE}..={PROBE_MAX_SIZE}; use the interface MTU"
    )]
    Size(usize),
    #[error("the socket does not send with UDP GSO now, so there is nothing to probe")]
    GsoOff,
    #[error("{PROBE_MAX_CONCURRENT} probes run already; try again when one ended")]
    Busy,
    #[error("cannot send the probe: {0}")]
    Send(String),
}

/// The ones' complement sum of `data` folded into `acc` (not yet inverted).
fn sum(mut acc: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// An ICMP (v4) or ICMPv6 echo request of `size` bytes in all, IP header included.
pub fn echo_request(
    src: IpAddr,
    dst: IpAddr,
    size: usize,
    id: u16,
    seq: u16,
) -> Result<Vec<u8>, ProbeError> {
    if !(PROBE_MIN_SIZE..=PROBE_MAX_SIZE).contains(&size) {
        return Err(ProbeError::Size(size));
    }
    let mut p = vec![0u8; size];
    let icmp_at = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            ipv4_header(&mut p, s, d);
            20
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            ipv6_header(&mut p, s, d);
            40
        }
        _ => return Err(ProbeError::Family { src, dst }),
    };
    let v6 = icmp_at == 40;
    let icmp = &mut p[icmp_at..];
    icmp[0] = if v6 { ECHO_REQUEST_V6 } else { ECHO_REQUEST_V4 };
    icmp[4..6].copy_from_slice(&id.to_be_bytes());
    icmp[6..8].copy_from_slice(&seq.to_be_bytes());
    icmp[8..8 + PROBE_MARKER.len()].copy_from_slice(PROBE_MARKER);
    for (i, b) in icmp[8 + PROBE_MARKER.len()..].iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let len = icmp.len();
    let acc = match (src, dst) {
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            // The pseudo-header: both addresses, the upper-layer length, the next header.
            let mut acc = sum(0, &s.octets());
            acc = sum(acc, &d.octets());
            acc = sum(acc, &(len as u32).to_be_bytes());
            sum(acc, &[0, 0, 0, ICMPV6])
        }
        _ => 0,
    };
    let c = fold(sum(acc, icmp));
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    Ok(p)
}

fn ipv4_header(p: &mut [u8], src: Ipv4Addr, dst: Ipv4Addr) {
    let len = p.len() as u16;
    p[0] = 0x45;
    p[2..4].copy_from_slice(&len.to_be_bytes());
    // Don't fragment: a probe that does not fit the path must not arrive in pieces.
    p[6] = 0x40;
    p[8] = TTL;
    p[9] = ICMP;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    let c = fold(sum(0, &p[..20]));
    p[10..12].copy_from_slice(&c.to_be_bytes());
}

fn ipv6_header(p: &mut [u8], src: Ipv6Addr, dst: Ipv6Addr) {
    let payload = (p.len() - 40) as u16;
    p[0] = 0x60;
    p[4..6].copy_from_slice(&payload.to_be_bytes());
    p[6] = ICMPV6;
    p[7] = TTL;
    p[8..24].copy_from_slice(&src.octets());
    p[24..40].copy_from_slice(&dst.octets());
}

impl Device {
    /// Encrypts `packets` for `peer` through its current session into `out`, each to the
    /// peer's endpoint from its sticky source. Never starts a handshake and never queues: a
    /// peer without a current session is an error.
    pub(crate) fn encapsulate_probe(
        &self,
        now: Instant,
        peer: &PublicKey,
        packets: &[Vec<u8>],
        out: &mut PacketBatch,
    ) -> Result<(), ProbeError> {
        let state = self.read();
        let peer_arc = state.peers.get(peer).ok_or(ProbeError::NoPeer(*peer))?;
        let mut p = peer_arc.lock();
        let endpoint = p.endpoint.ok_or(ProbeError::NoEndpoint(*peer))?;
        let src = p.source();
        let machine = peer_arc
            .machine(
                &mut p,
                state.private_key.as_ref(),
                &state.rate_limiter,
                state.protocol,
                state.clock,
            )
            .ok_or(ProbeError::NoKey)?;
        if !machine.has_session(now) {
            return Err(ProbeError::NoSession(*peer));
        }
        let mut sent = 0u64;
        for packet in packets {
            let slot = out.next_slot();
            if slot.len() < packet.len() + WG_OVERHEAD {
                return Err(ProbeError::Size(packet.len()));
            }
            match machine.handle_packet(packet, slot, now) {
                Step::Network(n) => {
                    out.commit(n, endpoint);
                    out.set_src(src);
                    sent += n as u64;
                }
                // The session went away between the check and now.
                _ => return Err(ProbeError::NoSession(*peer)),
            }
        }
        p.tx_bytes += sent;
        p.last_sent = Some(now);
        Ok(())
    }
}

/// Runs probes on a running data plane: its device, its socket (through the runner's
/// [`RawSender`]) and, when there is one, the offload switch that says whether GSO is on.
#[derive(Clone)]
pub struct Prober {
    device: Arc<Device>,
    socket: RawSender,
    offload: Option<Arc<UdpOffloadSwitch>>,
}

impl Prober {
    pub fn new(
        device: Arc<Device>,
        socket: RawSender,
        offload: Option<Arc<UdpOffloadSwitch>>,
    ) -> Self {
        Self {
            device,
            socket,
            offload,
        }
    }

    /// Whether the socket sends with GSO now (without a switch: assumed so).
    pub fn gso_in_use(&self) -> bool {
        self.offload.as_ref().is_none_or(|s| s.state().gso)
    }

    /// The peers worth probing, most recent handshake first: a handshake within `recent`, and
    /// an allowed IP that is a single host of `src`'s family (the address its kernel answers
    /// pings on). Peers without one are skipped.
    pub fn candidates(&self, src: IpAddr, recent: Duration) -> Vec<(PublicKey, IpAddr)> {
        let wall = SystemTime::now();
        let snapshot = self.device.snapshot(Instant::now(), wall);
        let mut found: Vec<(SystemTime, PublicKey, IpAddr)> = snapshot
            .peers
            .iter()
            .filter_map(|p| {
                let at = p.last_handshake?;
                if wall.duration_since(at).unwrap_or_default() > recent {
                    return None;
                }
                let host = p.allowed_ips.iter().find(|net| {
                    net.prefix_len() == net.max_prefix_len()
                        && net.addr().is_ipv4() == src.is_ipv4()
                })?;
                Some((at, p.public_key, host.addr()))
            })
            .collect();
        found.sort_by_key(|f| std::cmp::Reverse(f.0));
        found.into_iter().map(|(_, k, ip)| (k, ip)).collect()
    }

    /// Probes the path to `peer`, from our mesh address `src` to its `dst`, with inner
    /// packets of `size` bytes (the interface MTU); blocks for about
    /// `PROBE_PACKETS x PROBE_SINGLE_SPACING + PROBE_REPLY_WAIT`, less when every reply came.
    pub fn probe(
        &self,
        peer: &PublicKey,
        src: IpAddr,
        dst: IpAddr,
        size: usize,
    ) -> Result<ProbeReport, ProbeError> {
        if !self.gso_in_use() {
            return Err(ProbeError::GsoOff);
        }
        let track = self.device.probes.register(dst).ok_or(ProbeError::Busy)?;
        let r = self.run(&track, peer, src, dst, size);
        self.device.probes.unregister(&track);
        let (segmented_replies, single_replies) = r?;
        Ok(ProbeReport {
            peer: *peer,
            src,
            dst,
            size,
            sent: PROBE_PACKETS,
            segmented_replies,
            single_replies,
            verdict: Verdict::from_counts(segmented_replies, single_replies),
        })
    }

    fn run(
        &self,
        track: &Track,
        peer: &PublicKey,
        src: IpAddr,
        dst: IpAddr,
        size: usize,
    ) -> Result<(usize, usize), ProbeError> {
        let mut requests = Vec::with_capacity(2 * PROBE_PACKETS);
        for seq in 0..2 * PROBE_PACKETS {
            requests.push(echo_request(src, dst, size, track.id, seq as u16)?);
        }
        // A relayed peer's probes go through its relay like its traffic (`crate::relay`).
        let send = |batch: &mut PacketBatch| {
            self.device.relays().frame(batch);
            self.socket
                .send_batch(batch)
                .map_err(|e| ProbeError::Send(e.to_string()))
        };
        // The segmented half: one batch of equal datagrams to one address is one GSO send.
        let mut batch = PacketBatch::new(size + WG_OVERHEAD + 16, PROBE_PACKETS);
        self.device.encapsulate_probe(
            Instant::now(),
            peer,
            &requests[..PROBE_PACKETS],
            &mut batch,
        )?;
        send(&mut batch)?;
        // The single half: one datagram per send, spaced.
        for request in &requests[PROBE_PACKETS..] {
            std::thread::sleep(PROBE_SINGLE_SPACING);
            batch.clear();
            self.device.encapsulate_probe(
                Instant::now(),
                peer,
                std::slice::from_ref(request),
                &mut batch,
            )?;
            send(&mut batch)?;
        }
        let deadline = Instant::now() + PROBE_REPLY_WAIT;
        while Instant::now() < deadline && track.counts() != (PROBE_PACKETS, PROBE_PACKETS) {
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(track.counts())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe_match::{ECHO_REPLY_V4, ECHO_REPLY_V6, Probes, echo_reply};

    fn reply_of(mut request: Vec<u8>) -> Vec<u8> {
        // What a kernel answers: addresses swapped, the type changed (checksums unchecked here).
        if request[0] >> 4 == 4 {
            let (s, d) = (request[12..16].to_vec(), request[16..20].to_vec());
            request[12..16].copy_from_slice(&d);
            request[16..20].copy_from_slice(&s);
            request[20] = ECHO_REPLY_V4;
        } else {
            request[40] = ECHO_REPLY_V6;
        }
        request
    }

    #[test]
    fn requests_carry_valid_checksums_and_their_replies_are_recognised() {
        let (a, b) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
        let p = echo_request(a, b, 1420, 77, 3).expect("v4");
        assert_eq!(p.len(), 1420);
        assert_eq!(fold(sum(0, &p[..20])), 0, "IPv4 header checksum");
        assert_eq!(fold(sum(0, &p[20..])), 0, "ICMP checksum");
        assert_eq!(echo_reply(&p), None, "a request is not a reply");
        assert_eq!(echo_reply(&reply_of(p)), Some((77, 3)));

        let (a6, b6): (IpAddr, IpAddr) = ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
        let p = echo_request(a6, b6, 1280, 9, 15).expect("v6");
        let (IpAddr::V6(s), IpAddr::V6(d)) = (a6, b6) else {
            unreachable!()
        };
        let mut acc = sum(sum(0, &s.octets()), &d.octets());
        acc = sum(acc, &((p.len() - 40) as u32).to_be_bytes());
        acc = sum(acc, &[0, 0, 0, ICMPV6]);
        assert_eq!(fold(sum(acc, &p[40..])), 0, "ICMPv6 checksum");
        assert_eq!(echo_reply(&reply_of(p)), Some((9, 15)));

        assert_eq!(
            echo_request(a, b6, 1420, 1, 1),
            Err(ProbeError::Family { src: a, dst: b6 })
        );
        assert_eq!(echo_request(a, b, 60, 1, 1), Err(ProbeError::Size(60)));
    }

    #[test]
    fn only_running_probes_claim_and_only_their_own_replies() {
        let probes = Probes::default();
        let (a, b) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
        let t = probes.register(b).expect("register");
        let reply = reply_of(echo_request(a, b, 200, t.id, 2).expect("request"));
        assert!(!probes.claim(&reply, a), "from another address");
        let mut other = reply_of(echo_request(a, b, 200, t.id.wrapping_add(1), 2).unwrap());
        assert!(!probes.claim(&other, b), "another identifier");
        // A normal ping reply with our identifier but without the marker.
        other = reply.clone();
        other[28..44].fill(0);
        assert!(!probes.claim(&other, b), "no marker");
        assert!(probes.claim(&reply, b));
        let late = reply_of(echo_request(a, b, 200, t.id, PROBE_PACKETS as u16 + 1).unwrap());
        assert!(probes.claim(&late, b));
        assert_eq!(t.counts(), (1, 1));
        probes.unregister(&t);
        assert!(!probes.claim(&reply, b), "nothing runs");
    }

    #[test]
    fn the_verdict_follows_the_counts() {
        assert_eq!(Verdict::from_counts(8, 8), Verdict::Ok);
        assert_eq!(Verdict::from_counts(5, 7), Verdict::Ok);
        assert_eq!(Verdict::from_counts(0, 8), Verdict::SegmentedLost);
        assert_eq!(
            Verdict::from_counts(PROBE_MAX_SEGMENTED_WHEN_LOST, PROBE_MIN_SINGLE_REPLIES),
            Verdict::SegmentedLost
        );
        assert_eq!(Verdict::from_counts(0, 0), Verdict::Inconclusive);
        assert_eq!(Verdict::from_counts(8, 1), Verdict::Inconclusive);
    }
}
