//! The punch: both nodes ping each other's cold candidates (those that do not answer yet) at
//! the same moment, timed through the relay.
//!
//! Why timed: a NAT router whose own input accepts unsolicited datagrams (many Linux NAT
//! gateways and cloud NAT instances: "EIM, input accept") keeps a conntrack entry for a
//! datagram that reaches its public port before its inside host sent to the datagram's
//! source. That entry holds the tuple, so the host's own mapping towards that peer takes
//! another port, which the peer never learns, and every later probe refreshes the entry. One
//! node's early ping is enough: if it reaches the peer's router before the peer's own ping
//! left it, the pair stays relayed. (Routers that drop such datagrams keep no state for them;
//! there an early ping only costs a retry.) So a ping to a cold candidate goes out only as one
//! half of a punch both nodes time:
//!
//! | step | this node | the peer |
//! |---|---|---|
//! | probe round | pings its warm candidates at once, and the peer through a relay | |
//! | | | answers the relay ping (it is there and knows us) |
//! | the relay's pong, `rtt` after our ping | sends a call-me-maybe through that relay; the cold candidates are due in `rtt / 2` | |
//! | `rtt / 2` later | pings every cold candidate ([`Engine::poll_timeout`] says when) | gets the call-me-maybe and pings our addresses at once |
//!
//! Both sides' pings leave their NATs about together: each router has its host's outbound
//! entry before the peer's ping arrives, as long as the two relay legs are about as fast as
//! each other (the error is under the direct path's one-way delay). A peer that receives a
//! ping from an address it never had answers there and learns it (peer-reflexive,
//! `probe`), so a node whose router did move its mapping is still found where its pings
//! come from whenever the other side's router lets them in.
//!
//! Without a relay to time through (none in the state, or all down or gone for the peer), cold
//! candidates are pinged at once in the round, as nothing else can reach the peer. A peer that
//! never answers through any relay (it does not know us yet) is not pinged cold at all until it
//! does: an untimed ping is what poisons such routers. Nor is a peer every relay said is not
//! registered, for [`super::GONE_WAIT`] after the last said so (`Engine::registering`): it has
//! not started, or not reached a relay yet, and when it does it comes to us through one.
//!
//! A punch that loses the race anyway (the direct path's one-way delay is shorter than the
//! error of the timing) leaves such an entry, and every later punch would refresh it. So both
//! nodes count the pair's call-me-maybes, sent and received (the same messages on both sides),
//! since a direct candidate last answered (`Peer::count_punch`): past
//! [`super::PUNCHES_BEFORE_QUIET`] neither punches, nor answers a call-me-maybe with pings,
//! until [`super::PUNCH_QUIET`] after the last one, when the routers forgot the entries and
//! the moved mappings; then the next probe round punches again. New addresses on either side
//! start a new series at once.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use plexsphere_wire::reach::disco::Message;

use super::Engine;
use super::peer::Dest;
use super::probe::Outbox;
use crate::reach::io::Effect;
use plexsphere_wire::key::PublicKey;

impl Engine {
    /// The earliest moment the engine wants an [`crate::reach::io::Input::Tick`] before the next
    /// regular one: a punch that is due. The runtime waits no longer than this.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.peers.values().filter_map(|p| p.punch_at).min()
    }

    /// Our addresses a call-me-maybe names: local ones, then reflexive ones.
    fn own_addrs(&self) -> Vec<SocketAddr> {
        let mut ours: Vec<SocketAddr> = self.local.addrs.clone();
        for a in &self.local.reflexive {
            if !ours.contains(a) {
                ours.push(*a);
            }
        }
        ours
    }

    /// The peer answered through `relay` in `rtt`: call it through the same relay and ping its
    /// cold candidates `rtt / 2` from now, when its answering pings leave its NAT.
    pub(super) fn start_punch(
        &mut self,
        key: PublicKey,
        relay: &str,
        rtt: Duration,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        let ours = self.own_addrs();
        let Some(peer) = self.peers.get_mut(&key) else {
            return;
        };
        peer.punch_wanted = false;
        // The peer's call-me-maybe may have ended the series since our probe round.
        if peer.quiet(now) {
            return;
        }
        peer.punch_at = Some(now + rtt / 2);
        if ours.is_empty() {
            return;
        }
        peer.count_punch(now);
        let mut post = Outbox::new(&mut self.sealer, &mut self.counters, out, now);
        let cmm = Message::CallMeMaybe { addrs: ours };
        post.send(key, peer, Dest::Relay(relay.to_owned()), cmm);
    }

    /// Pings the cold candidates of every peer whose punch is due.
    pub(super) fn fire_punches(&mut self, now: Instant, out: &mut Vec<Effect>) {
        let due: Vec<PublicKey> = self
            .peers
            .iter()
            .filter(|(_, p)| p.punch_at.is_some_and(|at| at <= now))
            .map(|(k, _)| *k)
            .collect();
        for key in due {
            let Some(peer) = self.peers.get_mut(&key) else {
                continue;
            };
            peer.punch_at = None;
            let cold: Vec<SocketAddr> = peer
                .candidates
                .iter()
                .filter(|c| !c.alive(now))
                .map(|c| c.addr)
                .collect();
            self.ping_each(key, cold.into_iter().map(Dest::Direct), now, out);
        }
    }
}
