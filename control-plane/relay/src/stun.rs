//! The STUN responder (RFC 8489, Binding only): a Binding request gets a success response with
//! the sender's address as XOR-MAPPED-ADDRESS, the only thing a node asks a STUN server for
//! (its reflexive address, and with two servers how its NAT maps). Pure: bytes in, bytes out,
//! so the relay's UDP socket and the control plane's `--stun-listen` share it.
//!
//! A request with a comprehension-required attribute this responder does not know gets the
//! 420 (Unknown Attribute) error response that RFC 8489 §6.3.1 asks for. Anything else
//! (responses, indications, other methods, malformed bytes) gets no answer at all: a STUN
//! server never answers what it cannot read, so it is no reflector.
//!
//! An answer carries what the node needs and nothing more (no SOFTWARE attribute, an empty
//! reason phrase in the 420): a Binding success answer is 32 bytes for IPv4 and 44 for IPv6,
//! 1.6x and 2.2x the smallest 20-byte request (it was 48 and 60, 2.4x and 3.0x, with SOFTWARE).
//! And since a forged source names its victim, answers are budgeted per source /24 or /48
//! ([`Responder`] here, the relay's core on its UDP port).

use std::net::SocketAddr;
use std::time::Instant;

use bytecodec::{DecodeExt as _, EncodeExt as _};
use stun_codec::rfc5389::attributes::{ErrorCode, UnknownAttributes, XorMappedAddress};
use stun_codec::rfc5389::{Attribute, methods::BINDING};
use stun_codec::{Attribute as _, Message, MessageClass, MessageDecoder, MessageEncoder};

use crate::limits::LIMIT_LOG_EVERY;
use crate::prefix::{PrefixBuckets, PrefixLimits};

/// The error code of an answer to a request with an unknown comprehension-required attribute.
const UNKNOWN_ATTRIBUTE: u16 = 420;

/// The answer to a STUN datagram from `from`, or `None` when it gets none.
pub fn answer(request: &[u8], from: SocketAddr) -> Option<Vec<u8>> {
    if plexsphere_wire::reach::classify(request) != plexsphere_wire::reach::Kind::Stun {
        return None;
    }
    let mut decoder = MessageDecoder::<Attribute>::new();
    let message = decoder.decode_from_bytes(request).ok()?.ok()?;
    if message.class() != MessageClass::Request || message.method() != BINDING {
        return None;
    }
    let unknown: Vec<_> = message
        .unknown_attributes()
        .map(|a| a.get_type())
        .filter(|t| t.is_comprehension_required())
        .collect();
    let response = if unknown.is_empty() {
        let mut ok = Message::<Attribute>::new(
            MessageClass::SuccessResponse,
            BINDING,
            message.transaction_id(),
        );
        ok.add_attribute(XorMappedAddress::new(plexsphere_wire::endpoint::canonical(
            from,
        )));
        ok
    } else {
        let mut err = Message::<Attribute>::new(
            MessageClass::ErrorResponse,
            BINDING,
            message.transaction_id(),
        );
        // The reason phrase is for people and optional; the code says it all, in 8 bytes.
        err.add_attribute(ErrorCode::new(UNKNOWN_ATTRIBUTE, String::new()).ok()?);
        err.add_attribute(UnknownAttributes::new(unknown));
        err
    };
    MessageEncoder::new().encode_into_bytes(response).ok()
}

/// A Binding request with a transaction id (what a node sends); for tests and clients.
pub fn binding_request(transaction_id: [u8; 12]) -> Vec<u8> {
    let message = Message::<Attribute>::new(
        MessageClass::Request,
        BINDING,
        stun_codec::TransactionId::new(transaction_id),
    );
    MessageEncoder::new()
        .encode_into_bytes(message)
        .unwrap_or_default()
}

/// The XOR-MAPPED-ADDRESS of a Binding success response with that transaction id.
pub fn mapped_address(response: &[u8], transaction_id: [u8; 12]) -> Option<SocketAddr> {
    let mut decoder = MessageDecoder::<Attribute>::new();
    let message = decoder.decode_from_bytes(response).ok()?.ok()?;
    if message.class() != MessageClass::SuccessResponse
        || message.method() != BINDING
        || message.transaction_id().as_bytes() != &transaction_id
    {
        return None;
    }
    message
        .get_attribute::<XorMappedAddress>()
        .map(|a| a.address())
}

/// The control plane's responder: [`answer`] within a budget per source /24 or /48, with
/// what it answered and dropped counted, and a drop logged at most every [`LIMIT_LOG_EVERY`].
pub struct Responder {
    buckets: PrefixBuckets,
    pub answered: u64,
    pub dropped: u64,
    logged: Option<(Instant, u64)>,
}

impl Responder {
    pub fn new(limits: PrefixLimits, now: Instant) -> Self {
        Self {
            buckets: PrefixBuckets::new(limits, now),
            answered: 0,
            dropped: 0,
            logged: None,
        }
    }

    /// The answer to send to `from`, if it gets one and its prefix has one left.
    pub fn reply(&mut self, request: &[u8], from: SocketAddr, now: Instant) -> Option<Vec<u8>> {
        self.buckets.tick(now);
        let reply = answer(request, from)?;
        if self.buckets.take(from.ip(), now) {
            self.answered += 1;
            return Some(reply);
        }
        self.dropped += 1;
        let (last, times) = self.logged.get_or_insert((now - LIMIT_LOG_EVERY * 2, 0));
        *times += 1;
        if now.saturating_duration_since(*last) >= LIMIT_LOG_EVERY {
            let limits = self.buckets.limits();
            tracing::warn!(
                times = std::mem::take(times),
                rate = limits.per_sec,
                burst = limits.burst,
                "a source /24 or /48 sent more STUN requests than it gets answers; the rest go unanswered (--stun-answers-per-sec, --stun-answers-burst)"
            );
            *last = now;
        }
        None
    }
}

/// Answers Binding requests on `socket` until the future is dropped, within `limits` per
/// source /24 or /48; everything else is ignored. What `plexsphere serve --stun-listen` runs.
pub async fn serve(socket: tokio::net::UdpSocket, limits: PrefixLimits) {
    let mut buf = vec![0u8; 2048];
    let mut responder = Responder::new(limits, Instant::now());
    loop {
        match socket.recv_from(&mut buf).await {
            Ok((n, from)) => {
                if let Some(reply) = responder.reply(&buf[..n], from, Instant::now()) {
                    let _ = socket.send_to(&reply, from).await;
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "stun receive failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binding_request_answers_the_sender_v4_and_v6() {
        for from in ["198.51.100.7:40000", "[2001:db8::1]:51820"] {
            let from: SocketAddr = from.parse().unwrap();
            let req = binding_request([9; 12]);
            let resp = answer(&req, from).unwrap();
            assert_eq!(mapped_address(&resp, [9; 12]), Some(from));
            assert_eq!(mapped_address(&resp, [8; 12]), None);
        }
    }

    #[test]
    fn mapped_v4_is_reported_as_v4() {
        let from: SocketAddr = "[::ffff:192.0.2.1]:1234".parse().unwrap();
        let resp = answer(&binding_request([1; 12]), from).unwrap();
        assert_eq!(
            mapped_address(&resp, [1; 12]),
            Some("192.0.2.1:1234".parse().unwrap())
        );
    }

    #[test]
    fn the_xor_is_on_the_wire() {
        // RFC 8489 §14.2: the port is XORed with the cookie's top 16 bits.
        let from: SocketAddr = "192.0.2.1:32853".parse().unwrap();
        let resp = answer(&binding_request([2; 12]), from).unwrap();
        let port = 32853u16 ^ 0x2112;
        assert!(resp.windows(2).any(|w| w == port.to_be_bytes()));
        assert!(!resp.windows(2).any(|w| w == 32853u16.to_be_bytes()));
    }

    #[test]
    fn no_answer_to_what_is_not_a_binding_request() {
        let from: SocketAddr = "192.0.2.1:1".parse().unwrap();
        assert_eq!(answer(b"", from), None);
        assert_eq!(answer(&[0u8; 19], from), None);
        let mut resp = answer(&binding_request([3; 12]), from).unwrap();
        // A response is never answered.
        assert_eq!(answer(&resp, from), None);
        // Garbage with a STUN header shape.
        resp.truncate(20);
        resp[2] = 0;
        resp[3] = 7;
        assert_eq!(answer(&resp, from), None);
    }

    #[test]
    fn unknown_required_attribute_gets_420() {
        let mut req = binding_request([4; 12]);
        // Attribute 0x7777 (comprehension-required), 4 bytes of value.
        req.extend_from_slice(&[0x77, 0x77, 0, 4, 1, 2, 3, 4]);
        req[3] = 8;
        let from: SocketAddr = "192.0.2.1:1".parse().unwrap();
        let resp = answer(&req, from).unwrap();
        assert_eq!(resp[0] & 0x01, 0x01, "an error response class");
        assert!(resp.windows(2).any(|w| w == [0x77, 0x77]));
        assert_eq!(mapped_address(&resp, [4; 12]), None);
        // Header, ERROR-CODE with no reason phrase, UNKNOWN-ATTRIBUTES: 1.3x the request.
        assert_eq!(resp.len(), 20 + 8 + 8, "{} bytes", resp.len());
    }

    #[test]
    fn answers_carry_no_software_and_nothing_but_the_address() {
        for (from, len) in [("192.0.2.1:1", 32), ("[2001:db8::1]:1", 44)] {
            let from: SocketAddr = from.parse().unwrap();
            let req = binding_request([5; 12]);
            assert_eq!(req.len(), 20);
            let resp = answer(&req, from).unwrap();
            let message = MessageDecoder::<Attribute>::new()
                .decode_from_bytes(&resp)
                .unwrap()
                .unwrap();
            assert!(
                message
                    .get_attribute::<stun_codec::rfc5389::attributes::Software>()
                    .is_none(),
                "a SOFTWARE attribute in the answer"
            );
            assert_eq!(message.attributes().count(), 1, "XOR-MAPPED-ADDRESS alone");
            // Amplification: 1.6x (IPv4) and 2.2x (IPv6) the smallest request.
            assert_eq!(resp.len(), len, "answer to {from}");
        }
    }

    #[test]
    fn the_responder_answers_a_flood_within_its_prefixs_bucket() {
        let limits = PrefixLimits {
            per_sec: 10,
            burst: 25,
            max_prefixes: 16,
        };
        let t0 = Instant::now();
        let mut r = Responder::new(limits, t0);
        let req = binding_request([6; 12]);
        let flood: SocketAddr = "198.51.100.7:4000".parse().unwrap();
        let neighbour: SocketAddr = "198.51.100.99:4000".parse().unwrap();
        let other: SocketAddr = "203.0.113.1:4000".parse().unwrap();
        let answered = (0..1000)
            .filter(|_| r.reply(&req, flood, t0).is_some())
            .count();
        assert_eq!(answered, 25);
        assert!(r.reply(&req, neighbour, t0).is_none(), "the same /24");
        assert!(
            r.reply(&req, other, t0).is_some(),
            "another /24 has its own"
        );
        // A second later: the rate's worth again.
        let t1 = t0 + std::time::Duration::from_secs(1);
        assert_eq!(
            (0..1000)
                .filter(|_| r.reply(&req, flood, t1).is_some())
                .count(),
            10
        );
        assert_eq!((r.answered, r.dropped), (36, 1966));
        // What gets no answer costs no token.
        assert!(r.reply(b"not stun", other, t1).is_none());
        assert_eq!(r.dropped, 1966);
    }
}
