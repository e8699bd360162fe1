//! The STUN client: Binding requests from the WireGuard socket (through the runtime) to the
//! state's STUN servers and every relay's UDP address, and what the answers say about this
//! node's NAT. Sans-IO: a [`StunProbe`] makes the requests and reads the answers; the runtime
//! carries them and calls [`StunProbe::poll_probe`] with the time.
//!
//! A probe sends one request per server, retries a server that did not answer after
//! [`RETRY_AFTER`] up to [`TRIES`] times in all, and is done when every server answered or ran
//! out of tries. Transaction ids are random and matched exactly; an answer from a server the
//! probe did not ask, or with an unknown id, is not the probe's.
//!
//! The NAT report ([`nat_report`]): no answer at all is `udp_blocked`; a reflexive address
//! equal to a local one (with the WireGuard port) is mapping `none`; two servers that saw the
//! same address are `endpoint_independent`, two that saw different ones
//! `endpoint_dependent`; one answer alone says nothing (`unknown`).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use bytecodec::{DecodeExt as _, EncodeExt as _};
use plexsphere_wire::node::{NatMapping, NatReport};
use stun_codec::rfc5389::Attribute;
use stun_codec::rfc5389::attributes::{MappedAddress, XorMappedAddress};
use stun_codec::rfc5389::methods::BINDING;
use stun_codec::{Message, MessageClass, MessageDecoder, MessageEncoder, TransactionId};

/// How long a server gets to answer before it is asked again.
pub const RETRY_AFTER: Duration = Duration::from_millis(800);
/// Requests per server in one probe.
pub const TRIES: u32 = 3;
/// The most servers one probe asks (the state's STUN servers plus the relays).
pub const MAX_SERVERS: usize = 8;

/// A Binding request with this transaction id.
pub fn binding_request(id: [u8; 12]) -> Vec<u8> {
    let msg = Message::<Attribute>::new(MessageClass::Request, BINDING, TransactionId::new(id));
    // Encoding a message without attributes cannot fail; an empty datagram is never sent.
    MessageEncoder::new()
        .encode_into_bytes(msg)
        .unwrap_or_default()
}

/// A Binding success response: its transaction id and the reflexive address it carries
/// (XOR-MAPPED-ADDRESS, or MAPPED-ADDRESS from an old server).
pub fn parse_binding_response(datagram: &[u8]) -> Option<([u8; 12], SocketAddr)> {
    let msg = MessageDecoder::<Attribute>::new()
        .decode_from_bytes(datagram)
        .ok()?
        .ok()?;
    if msg.class() != MessageClass::SuccessResponse || msg.method() != BINDING {
        return None;
    }
    let addr = msg
        .get_attribute::<XorMappedAddress>()
        .map(XorMappedAddress::address)
        .or_else(|| {
            msg.get_attribute::<MappedAddress>()
                .map(MappedAddress::address)
        })?;
    Some((*msg.transaction_id().as_bytes(), addr))
}

#[derive(Debug, Clone)]
struct Asking {
    server: SocketAddr,
    id: [u8; 12],
    sent: Instant,
    tries: u32,
}

/// One round of Binding requests; see the module docs.
#[derive(Debug)]
pub struct StunProbe {
    asking: Vec<Asking>,
    /// (server, what it saw), in the order the answers came.
    answers: Vec<(SocketAddr, SocketAddr)>,
    ids: HashMap<[u8; 12], SocketAddr>,
}

/// What [`StunProbe::poll_probe`] answers.
#[derive(Debug, PartialEq, Eq)]
pub enum Poll {
    /// Requests to send now (first tries and retries), each to its server.
    Send(Vec<(SocketAddr, Vec<u8>)>),
    /// Every server answered or ran out of tries: (server, reflexive address) per answer.
    Done(Vec<(SocketAddr, SocketAddr)>),
}

impl StunProbe {
    /// A probe of `servers` (deduplicated, at most [`MAX_SERVERS`]); `id` makes transaction
    /// ids (random in the runtime, fixed in tests). Nothing is sent until [`Self::poll_probe`].
    pub fn new(servers: &[SocketAddr], now: Instant, mut id: impl FnMut() -> [u8; 12]) -> Self {
        let mut seen = Vec::new();
        for s in servers {
            if !seen.contains(s) && seen.len() < MAX_SERVERS {
                seen.push(*s);
            }
        }
        let mut ids = HashMap::new();
        let asking = seen
            .into_iter()
            .map(|server| {
                let a = Asking {
                    server,
                    id: id(),
                    // Due at once.
                    sent: now.checked_sub(RETRY_AFTER).unwrap_or(now),
                    tries: 0,
                };
                ids.insert(a.id, server);
                a
            })
            .collect();
        Self {
            asking,
            answers: Vec::new(),
            ids,
        }
    }

    /// Whether `datagram` from `from` answers this probe (then it is taken).
    pub fn handle_datagram(&mut self, datagram: &[u8], from: SocketAddr) -> bool {
        let Some((id, seen)) = parse_binding_response(datagram) else {
            return false;
        };
        if self.ids.get(&id) != Some(&from) {
            return false;
        }
        self.ids.remove(&id);
        self.asking.retain(|a| a.server != from);
        self.answers.push((from, seen));
        true
    }

    /// When [`Self::poll_probe`] next has something to do: the earliest retry or give-up of a
    /// server still asked (a moment already past when a first try is due). `None` once every
    /// server answered or gave up: then `poll_probe` answers `Done` at once.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.asking
            .iter()
            .filter_map(|a| a.sent.checked_add(RETRY_AFTER))
            .min()
    }

    /// What to send now, or the result once nothing is left to wait for.
    pub fn poll_probe(&mut self, now: Instant) -> Poll {
        let mut out = Vec::new();
        self.asking
            .retain(|a| a.tries < TRIES || now.saturating_duration_since(a.sent) < RETRY_AFTER);
        for a in &mut self.asking {
            if a.tries < TRIES && now.saturating_duration_since(a.sent) >= RETRY_AFTER {
                a.tries += 1;
                a.sent = now;
                out.push((a.server, binding_request(a.id)));
            }
        }
        if self.asking.is_empty() {
            return Poll::Done(std::mem::take(&mut self.answers));
        }
        Poll::Send(out)
    }
}

/// The reflexive candidates and the NAT report from a probe's answers; `local` are this
/// node's interface addresses, `port` the WireGuard socket's port. See the module docs.
pub fn nat_report(
    answers: &[(SocketAddr, SocketAddr)],
    local: &[IpAddr],
    port: u16,
) -> (Vec<SocketAddr>, NatReport) {
    let mut reflexive: Vec<SocketAddr> = Vec::new();
    for (_, seen) in answers {
        if !reflexive.contains(seen) {
            reflexive.push(*seen);
        }
    }
    let mapping = if answers.is_empty() {
        NatMapping::Unknown
    } else if reflexive
        .iter()
        .any(|r| r.port() == port && local.contains(&r.ip()))
    {
        NatMapping::None
    } else if answers.len() < 2 {
        NatMapping::Unknown
    } else if reflexive.len() == 1 {
        NatMapping::EndpointIndependent
    } else {
        NatMapping::EndpointDependent
    };
    let nat = NatReport {
        mapping,
        udp_blocked: answers.is_empty(),
    };
    // No NAT: the local addresses are the candidates already.
    if mapping == NatMapping::None {
        reflexive.clear();
    }
    (reflexive, nat)
}

#[cfg(test)]
mod tests {
    use super::*;
    use stun_codec::rfc5389::attributes::XorMappedAddress;

    fn answer(id: [u8; 12], seen: SocketAddr) -> Vec<u8> {
        let mut m = Message::<Attribute>::new(
            MessageClass::SuccessResponse,
            BINDING,
            TransactionId::new(id),
        );
        m.add_attribute(XorMappedAddress::new(seen));
        MessageEncoder::new().encode_into_bytes(m).unwrap()
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_request_is_a_binding_request_the_wire_classifies_as_stun() {
        let r = binding_request([9; 12]);
        assert_eq!(r.len(), 20);
        assert_eq!(&r[..2], &[0, 1]);
        assert_eq!(
            plexsphere_wire::reach::classify(&r),
            plexsphere_wire::reach::Kind::Stun
        );
        let seen = addr("203.0.113.7:40001");
        assert_eq!(
            parse_binding_response(&answer([9; 12], seen)),
            Some(([9; 12], seen))
        );
        // The request itself is no answer; nor is garbage.
        assert_eq!(parse_binding_response(&r), None);
        assert_eq!(parse_binding_response(b"pxd\x01hello"), None);
    }

    #[test]
    fn answers_are_matched_by_id_and_server_and_silent_servers_are_retried_then_given_up() {
        let t0 = Instant::now();
        let (s1, s2) = (addr("198.51.100.1:3478"), addr("198.51.100.2:3478"));
        let mut n = 0u8;
        let mut p = StunProbe::new(&[s1, s2, s1], t0, || {
            n += 1;
            [n; 12]
        });
        let Poll::Send(first) = p.poll_probe(t0) else {
            panic!("nothing sent")
        };
        assert_eq!(
            first.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
            vec![s1, s2]
        );
        let seen = addr("203.0.113.7:40001");
        // Right id, wrong server; wrong id, right server: neither counts.
        assert!(!p.handle_datagram(&answer([1; 12], seen), s2));
        assert!(!p.handle_datagram(&answer([7; 12], seen), s1));
        assert!(p.handle_datagram(&answer([1; 12], seen), s1));
        // s2 is asked again after RETRY_AFTER, and at most TRIES times in all.
        assert_eq!(
            p.poll_probe(t0 + Duration::from_millis(10)),
            Poll::Send(vec![])
        );
        let mut t = t0;
        let mut resent = 0;
        loop {
            t += RETRY_AFTER;
            match p.poll_probe(t) {
                Poll::Send(v) => {
                    assert!(v.iter().all(|(s, _)| *s == s2));
                    resent += v.len();
                }
                Poll::Done(answers) => {
                    assert_eq!(answers, vec![(s1, seen)]);
                    break;
                }
            }
            assert!(resent < 10, "never gave up");
        }
        assert_eq!(resent, (TRIES - 1) as usize);
    }

    #[test]
    fn poll_timeout_names_every_retry_and_the_give_up_and_nothing_is_due_before_it() {
        let t0 = Instant::now();
        let s1 = addr("198.51.100.1:3478");
        let mut p = StunProbe::new(&[s1], t0, || [1; 12]);
        // The first try is due at once.
        assert!(p.poll_timeout().is_some_and(|at| at <= t0));
        assert!(matches!(p.poll_probe(t0), Poll::Send(v) if v.len() == 1));
        let mut sent = 1;
        let mut last = t0;
        loop {
            let at = p
                .poll_timeout()
                .expect("a server still asked has a deadline");
            assert_eq!(at, last + RETRY_AFTER);
            assert_eq!(
                p.poll_probe(at - Duration::from_millis(1)),
                Poll::Send(vec![])
            );
            match p.poll_probe(at) {
                Poll::Send(v) => {
                    assert_eq!(v.len(), 1);
                    sent += 1;
                }
                Poll::Done(answers) => {
                    assert_eq!(answers, vec![]);
                    break;
                }
            }
            assert!(sent <= TRIES, "more tries than TRIES");
            last = at;
        }
        assert_eq!(sent, TRIES);
        assert_eq!(p.poll_timeout(), None);

        // An answer ends the waiting: no deadline, and the result at once.
        let mut p = StunProbe::new(&[s1], t0, || [2; 12]);
        let _ = p.poll_probe(t0);
        let seen = addr("203.0.113.7:40001");
        assert!(p.handle_datagram(&answer([2; 12], seen), s1));
        assert_eq!(p.poll_timeout(), None);
        assert_eq!(p.poll_probe(t0), Poll::Done(vec![(s1, seen)]));
    }

    #[test]
    fn the_nat_is_classified_from_what_the_servers_saw() {
        let (s1, s2) = (addr("198.51.100.1:3478"), addr("198.51.100.2:3478"));
        let local: Vec<IpAddr> = vec!["192.168.1.5".parse().unwrap()];
        let pub1 = addr("203.0.113.7:40001");
        type Row = (Vec<(SocketAddr, SocketAddr)>, NatMapping, bool, usize);
        let rows: Vec<Row> = vec![
            (vec![], NatMapping::Unknown, true, 0),
            (vec![(s1, pub1)], NatMapping::Unknown, false, 1),
            (
                vec![(s1, pub1), (s2, pub1)],
                NatMapping::EndpointIndependent,
                false,
                1,
            ),
            (
                vec![(s1, pub1), (s2, addr("203.0.113.7:40002"))],
                NatMapping::EndpointDependent,
                false,
                2,
            ),
            (
                vec![
                    (s1, addr("192.168.1.5:51820")),
                    (s2, addr("192.168.1.5:51820")),
                ],
                NatMapping::None,
                false,
                0,
            ),
        ];
        for (answers, mapping, blocked, candidates) in rows {
            let (refl, nat) = nat_report(&answers, &local, 51820);
            assert_eq!(nat.mapping, mapping, "{answers:?}");
            assert_eq!(nat.udp_blocked, blocked, "{answers:?}");
            assert_eq!(refl.len(), candidates, "{answers:?}");
        }
    }
}
