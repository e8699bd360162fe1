//! The Noise IKpsk2 handshake messages of WireGuard (whitepaper section 5.4.2-5.4.7): building
//! and consuming initiations, responses and cookie replies. No state beyond one handshake, no
//! clock and no random source of its own: the state machine (`super::Tunnel`) decides when and
//! hands in the timestamp and its random source; this module only computes.

use boringtun::x25519::{PublicKey, StaticSecret};
use rand_core::CryptoRngCore;

use super::crypto::{self, TAG};
use super::session::Keys;

pub(crate) const INITIATION: u8 = 1;
pub(crate) const RESPONSE: u8 = 2;
pub(crate) const COOKIE_REPLY: u8 = 3;
pub(crate) const DATA: u8 = 4;

pub(crate) const INITIATION_LEN: usize = 148;
pub(crate) const RESPONSE_LEN: usize = 92;
pub(crate) const COOKIE_REPLY_LEN: usize = 64;
/// A data message's header: type, reserved, receiver index, counter.
pub(crate) const DATA_HEADER: usize = 16;
/// The shortest data message: a keepalive (header and tag).
pub(crate) const DATA_MIN: usize = DATA_HEADER + TAG;

const CONSTRUCTION: &[u8] = b"Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s";
const IDENTIFIER: &[u8] = b"WireGuard v1 zx2c4 Jason@zx2c4.com";
const LABEL_MAC1: &[u8] = b"mac1----";
const LABEL_COOKIE: &[u8] = b"cookie--";

/// Reads a little-endian u32 at `at` (the caller checked the length).
pub(crate) fn le32(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

pub(crate) fn le64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// One side's keys towards one peer, and what is derived from them once.
pub(crate) struct Statics {
    private: StaticSecret,
    public: [u8; 32],
    peer: [u8; 32],
    psk: [u8; 32],
    /// DH(our private, the peer's public); None for a low-order peer key, which can never
    /// complete a handshake.
    static_static: Option<[u8; 32]>,
    /// The chaining key every handshake starts from: HASH(CONSTRUCTION).
    c0: [u8; 32],
    /// HASH(HASH(c0 || IDENTIFIER) || responder's public), for each direction.
    h_to_peer: [u8; 32],
    h_to_us: [u8; 32],
    /// HASH(LABEL_MAC1 || public) for messages to the peer and to us.
    mac1_to_peer: [u8; 32],
    mac1_to_us: [u8; 32],
    /// HASH(LABEL_COOKIE || the peer's public): opens the peer's cookie replies.
    cookie_from_peer: [u8; 32],
}

impl Statics {
    pub(crate) fn new(private: StaticSecret, peer: [u8; 32], psk: Option<[u8; 32]>) -> Self {
        let public = PublicKey::from(&private).to_bytes();
        let c0 = crypto::hash(&[CONSTRUCTION]);
        let h0 = crypto::hash(&[&c0, IDENTIFIER]);
        Self {
            static_static: crypto::dh(&private, &peer),
            private,
            public,
            peer,
            psk: psk.unwrap_or([0; 32]),
            c0,
            h_to_peer: crypto::hash(&[&h0, &peer]),
            h_to_us: crypto::hash(&[&h0, &public]),
            mac1_to_peer: crypto::hash(&[LABEL_MAC1, &peer]),
            mac1_to_us: crypto::hash(&[LABEL_MAC1, &public]),
            cookie_from_peer: crypto::hash(&[LABEL_COOKIE, &peer]),
        }
    }

    #[cfg(test)]
    pub(crate) fn peer(&self) -> &[u8; 32] {
        &self.peer
    }

    /// Whether `msg`'s MAC1 (the 16 bytes at `at`) is the one for us.
    pub(crate) fn mac1_is_ours(&self, msg: &[u8], at: usize) -> bool {
        let want = crypto::mac(&self.mac1_to_us, &msg[..at]);
        crypto::ct_eq(&want, &msg[at..at + 16])
    }

    /// Writes MAC1 (and MAC2 with a cookie) at the end of a message to the peer.
    fn seal_macs(&self, msg: &mut [u8], cookie: Option<&[u8; 16]>) -> [u8; 16] {
        let at = msg.len() - 32;
        let mac1 = crypto::mac(&self.mac1_to_peer, &msg[..at]);
        msg[at..at + 16].copy_from_slice(&mac1);
        let mac2 = cookie.map_or([0; 16], |c| crypto::mac_cookie(c, &msg[..at + 16]));
        msg[at + 16..at + 32].copy_from_slice(&mac2);
        mac1
    }
}

/// Our initiation in flight: what consuming its response needs.
pub(crate) struct Initiation {
    pub local_index: u32,
    ephemeral: StaticSecret,
    chaining: [u8; 32],
    hash: [u8; 32],
    /// The initiation's MAC1: a cookie reply to it is sealed with it as associated data.
    pub mac1: [u8; 16],
}

/// Builds an initiation into `out` (148 bytes), its ephemeral key from `rng`. None when `rng`
/// fails or the peer's key is a low-order point.
pub(crate) fn initiate(
    s: &Statics,
    rng: &mut dyn CryptoRngCore,
    local_index: u32,
    timestamp: [u8; 12],
    cookie: Option<&[u8; 16]>,
    out: &mut [u8; INITIATION_LEN],
) -> Option<Initiation> {
    let ss = s.static_static?;
    let (e_priv, e_pub) = crypto::ephemeral(rng)?;
    out.fill(0);
    out[0] = INITIATION;
    out[4..8].copy_from_slice(&local_index.to_le_bytes());
    out[8..40].copy_from_slice(&e_pub);
    let [c] = crypto::kdf::<1>(&s.c0, &e_pub);
    let h = crypto::hash(&[&s.h_to_peer, &e_pub]);
    let [c, k] = crypto::kdf::<2>(&c, &crypto::dh(&e_priv, &s.peer)?);
    crypto::seal_once(&k, &h, &s.public, &mut out[40..88]);
    let h = crypto::hash(&[&h, &out[40..88]]);
    let [c, k] = crypto::kdf::<2>(&c, &ss);
    crypto::seal_once(&k, &h, &timestamp, &mut out[88..116]);
    let h = crypto::hash(&[&h, &out[88..116]]);
    let mac1 = s.seal_macs(out, cookie);
    Some(Initiation {
        local_index,
        ephemeral: e_priv,
        chaining: c,
        hash: h,
        mac1,
    })
}

/// An initiation from the peer, consumed: what answering it needs.
pub(crate) struct Consumed {
    pub peer_index: u32,
    pub timestamp: [u8; 12],
    their_ephemeral: [u8; 32],
    chaining: [u8; 32],
    hash: [u8; 32],
}

/// Consumes an initiation (its MAC1 already checked) that must come from this peer: None if
/// it does not decrypt or carries another static key.
pub(crate) fn consume_initiation(s: &Statics, msg: &[u8]) -> Option<Consumed> {
    if msg.len() != INITIATION_LEN || msg[0] != INITIATION {
        return None;
    }
    let ss = s.static_static?;
    let mut e_i = [0u8; 32];
    e_i.copy_from_slice(&msg[8..40]);
    let [c] = crypto::kdf::<1>(&s.c0, &e_i);
    let h = crypto::hash(&[&s.h_to_us, &e_i]);
    let [c, k] = crypto::kdf::<2>(&c, &crypto::dh(&s.private, &e_i)?);
    let their_static: [u8; 32] = crypto::open_once(&k, &h, &msg[40..88])?;
    if !crypto::ct_eq(&their_static, &s.peer) {
        return None;
    }
    let h = crypto::hash(&[&h, &msg[40..88]]);
    let [c, k] = crypto::kdf::<2>(&c, &ss);
    let timestamp: [u8; 12] = crypto::open_once(&k, &h, &msg[88..116])?;
    let h = crypto::hash(&[&h, &msg[88..116]]);
    Some(Consumed {
        peer_index: le32(msg, 4),
        timestamp,
        their_ephemeral: e_i,
        chaining: c,
        hash: h,
    })
}

/// Builds the response to a consumed initiation into `out` (92 bytes) and answers the
/// session's keys (the responder's: it receives with the first). The ephemeral key is from
/// `rng`; None when it fails.
pub(crate) fn respond(
    s: &Statics,
    rng: &mut dyn CryptoRngCore,
    init: &Consumed,
    local_index: u32,
    out: &mut [u8; RESPONSE_LEN],
) -> Option<Keys> {
    let (e_priv, e_pub) = crypto::ephemeral(rng)?;
    out.fill(0);
    out[0] = RESPONSE;
    out[4..8].copy_from_slice(&local_index.to_le_bytes());
    out[8..12].copy_from_slice(&init.peer_index.to_le_bytes());
    out[12..44].copy_from_slice(&e_pub);
    let [c] = crypto::kdf::<1>(&init.chaining, &e_pub);
    let h = crypto::hash(&[&init.hash, &e_pub]);
    let [c] = crypto::kdf::<1>(&c, &crypto::dh(&e_priv, &init.their_ephemeral)?);
    let [c] = crypto::kdf::<1>(&c, &crypto::dh(&e_priv, &s.peer)?);
    let [c, t, k] = crypto::kdf::<3>(&c, &s.psk);
    let h = crypto::hash(&[&h, &t]);
    crypto::seal_once(&k, &h, &[], &mut out[44..60]);
    s.seal_macs(out, None);
    let [recv, send] = crypto::kdf::<2>(&c, &[]);
    Some(Keys {
        local_index,
        remote_index: init.peer_index,
        send: crypto::AeadKey::new(&send),
        recv: crypto::AeadKey::new(&recv),
    })
}

/// Consumes the response to our initiation (its receiver index and MAC1 already matched):
/// the session's keys (the initiator's: it sends with the first).
pub(crate) fn consume_response(s: &Statics, init: &Initiation, msg: &[u8]) -> Option<Keys> {
    if msg.len() != RESPONSE_LEN || msg[0] != RESPONSE {
        return None;
    }
    let mut e_r = [0u8; 32];
    e_r.copy_from_slice(&msg[12..44]);
    let [c] = crypto::kdf::<1>(&init.chaining, &e_r);
    let h = crypto::hash(&[&init.hash, &e_r]);
    let [c] = crypto::kdf::<1>(&c, &crypto::dh(&init.ephemeral, &e_r)?);
    let [c] = crypto::kdf::<1>(&c, &crypto::dh(&s.private, &e_r)?);
    let [c, t, k] = crypto::kdf::<3>(&c, &s.psk);
    let h = crypto::hash(&[&h, &t]);
    let _: [u8; 0] = crypto::open_once(&k, &h, &msg[44..60])?;
    let [send, recv] = crypto::kdf::<2>(&c, &[]);
    Some(Keys {
        local_index: init.local_index,
        remote_index: le32(msg, 4),
        send: crypto::AeadKey::new(&send),
        recv: crypto::AeadKey::new(&recv),
    })
}

/// The cookie in the peer's reply to our initiation, if it authenticates.
pub(crate) fn consume_cookie_reply(s: &Statics, init: &Initiation, msg: &[u8]) -> Option<[u8; 16]> {
    if msg.len() != COOKIE_REPLY_LEN || msg[0] != COOKIE_REPLY {
        return None;
    }
    let mut nonce = [0u8; 24];
    nonce.copy_from_slice(&msg[8..32]);
    crypto::xopen_cookie(&s.cookie_from_peer, &nonce, &msg[32..64], &init.mac1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use plexsphere_test_support::seeded::SeededRng;

    fn pair() -> (Statics, Statics) {
        let a = StaticSecret::from([1u8; 32]);
        let b = StaticSecret::from([2u8; 32]);
        let (pa, pb) = (
            PublicKey::from(&a).to_bytes(),
            PublicKey::from(&b).to_bytes(),
        );
        (
            Statics::new(a, pb, Some([9; 32])),
            Statics::new(b, pa, Some([9; 32])),
        )
    }

    #[test]
    fn both_sides_derive_the_same_session() {
        let (a, b) = pair();
        let mut init = [0u8; INITIATION_LEN];
        let pending = initiate(&a, &mut SeededRng::new(1), 0x100, [5; 12], None, &mut init)
            .expect("initiation");
        assert!(b.mac1_is_ours(&init, 116));
        assert!(!a.mac1_is_ours(&init, 116), "MAC1 names the responder");
        let consumed = consume_initiation(&b, &init).expect("consumed");
        assert_eq!((consumed.peer_index, consumed.timestamp), (0x100, [5; 12]));
        let mut resp = [0u8; RESPONSE_LEN];
        let kb =
            respond(&b, &mut SeededRng::new(2), &consumed, 0x200, &mut resp).expect("response");
        assert!(a.mac1_is_ours(&resp, 60));
        let ka = consume_response(&a, &pending, &resp).expect("keys");
        assert_eq!((ka.local_index, ka.remote_index), (0x100, 0x200));
        assert_eq!((kb.local_index, kb.remote_index), (0x200, 0x100));
        let mut buf = [0u8; 64];
        buf[..4].copy_from_slice(b"ping");
        let n = ka.send.seal(0, &[], &mut buf, 4);
        assert_eq!(kb.recv.open(0, &[], &mut buf[..n]), Some(4));
        let n = kb.send.seal(0, &[], &mut buf, 4);
        assert_eq!(ka.recv.open(0, &[], &mut buf[..n]), Some(4));
    }

    #[test]
    fn a_changed_byte_or_another_psk_breaks_the_handshake() {
        let (a, b) = pair();
        let mut init = [0u8; INITIATION_LEN];
        initiate(&a, &mut SeededRng::new(1), 1, [5; 12], None, &mut init).expect("initiation");
        for at in [8, 40, 87, 88, 115] {
            let mut bad = init;
            bad[at] ^= 0x80;
            assert!(consume_initiation(&b, &bad).is_none(), "byte {at}");
        }
        let other_a = Statics::new(StaticSecret::from([1u8; 32]), *a.peer(), None);
        let pending = initiate(
            &other_a,
            &mut SeededRng::new(1),
            1,
            [5; 12],
            None,
            &mut init,
        )
        .expect("initiation");
        let consumed = consume_initiation(&b, &init).expect("the psk is not in the initiation");
        let mut resp = [0u8; RESPONSE_LEN];
        respond(&b, &mut SeededRng::new(2), &consumed, 2, &mut resp).expect("response");
        assert!(
            consume_response(&other_a, &pending, &resp).is_none(),
            "psk differs"
        );
    }

    #[test]
    fn an_initiation_from_another_key_is_refused() {
        let (_, b) = pair();
        let stranger = Statics::new(
            StaticSecret::from([3u8; 32]),
            PublicKey::from(&StaticSecret::from([2u8; 32])).to_bytes(),
            None,
        );
        let mut init = [0u8; INITIATION_LEN];
        initiate(
            &stranger,
            &mut SeededRng::new(1),
            1,
            [5; 12],
            None,
            &mut init,
        )
        .expect("initiation");
        assert!(b.mac1_is_ours(&init, 116), "it is addressed to b");
        assert!(
            consume_initiation(&b, &init).is_none(),
            "but b's peer is another key"
        );
    }

    #[test]
    fn mac2_is_the_cookie_mac_of_the_message_up_to_it() {
        let (a, _) = pair();
        let mut init = [0u8; INITIATION_LEN];
        initiate(
            &a,
            &mut SeededRng::new(1),
            1,
            [5; 12],
            Some(&[7; 16]),
            &mut init,
        )
        .expect("initiation");
        assert_eq!(&init[132..], &crypto::mac_cookie(&[7; 16], &init[..132]));
        initiate(&a, &mut SeededRng::new(1), 1, [5; 12], None, &mut init).expect("initiation");
        assert_eq!(&init[132..], &[0; 16]);
    }
}
