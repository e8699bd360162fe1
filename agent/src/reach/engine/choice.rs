//! Which path each peer takes, and why.
//!
//! | what holds | path |
//! |---|---|
//! | a direct candidate answered (fresh pong, not [`MISSED_PINGS`] missed) | the fastest one; a working one is replaced only by one [`RTT_HYSTERESIS`] faster |
//! | no direct; the relay the peer is on is still usable | stays there |
//! | else the peer's home relay is usable | the home relay |
//! | else a relay of the state carried a pong within [`RELAY_FRESH`] | the first such, in the state's order |
//! | nothing | none |
//!
//! A relay is usable for a peer while it is in the state, registered (`RelayUp`, which gives
//! the transport) and did not say the peer is gone. Every change is one `SetPath` and one info
//! line: "db-1: relay r1 over udp -> direct 192.0.2.7:51820: pong in 3 ms". A peer that loses
//! its path is probed at once (through every other relay when its relay went away).

use std::time::{Duration, Instant};

use super::peer::Peer;
use super::{Engine, MISSED_PINGS, RELAY_FRESH, RTT_HYSTERESIS};
use crate::reach::io::{Effect, Path, Transport};
use plexsphere_wire::key::PublicKey;

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

/// The path as the journal and status say it.
pub fn describe(path: &Path) -> String {
    match path {
        Path::None => "none".to_owned(),
        Path::Direct { endpoint } => format!("direct {endpoint}"),
        Path::Relay { relay, transport } => format!("relay {relay} over {}", over(*transport)),
    }
}

fn over(t: Transport) -> &'static str {
    match t {
        Transport::Udp => "udp",
        Transport::Tcp => "tcp",
    }
}

impl Engine {
    /// Chooses every peer's path; answers a `SetPath` for each that changed.
    pub(super) fn choose_all(&mut self, now: Instant, out: &mut Vec<Effect>) {
        let keys: Vec<PublicKey> = self.peers.keys().copied().collect();
        for key in keys {
            self.choose_peer(key, now, out);
        }
    }

    /// Chooses one peer's path (a disco message concerns only its sender).
    pub(super) fn choose_peer(&mut self, key: PublicKey, now: Instant, out: &mut Vec<Effect>) {
        let Some(peer) = self.peers.get(&key) else {
            return;
        };
        let (path, rtt, why) = self.choose(peer, now);
        let lost = self.lost(peer, now).is_some();
        let Some(peer) = self.peers.get_mut(&key) else {
            return;
        };
        peer.rtt = rtt;
        if path == peer.path {
            return;
        }
        tracing::info!(
            peer = %peer.reach.hostname,
            key = %key,
            "{}: {} -> {}: {why}",
            peer.reach.hostname,
            describe(&peer.path),
            describe(&path)
        );
        let direct = matches!(path, Path::Direct { .. });
        peer.path = path.clone();
        peer.reason = why;
        out.push(Effect::SetPath { peer: key, path });
        if lost && !direct {
            self.probe(key, now, out);
        }
    }

    /// The path `peer` should take now, its RTT, and the reason to give if it changes.
    fn choose(&self, peer: &Peer, now: Instant) -> (Path, Option<Duration>, String) {
        let best = peer
            .candidates
            .iter()
            .filter(|c| c.alive(now))
            .min_by_key(|c| c.rtt.unwrap_or(Duration::MAX));
        let current = match &peer.path {
            Path::Direct { endpoint } => peer.candidate(*endpoint).filter(|c| c.alive(now)),
            _ => None,
        };
        if let Some(best) = best {
            let rtt = best.rtt.unwrap_or_default();
            let Some(cur) = current else {
                let why = format!("pong in {} ms", ms(rtt));
                return (
                    Path::Direct {
                        endpoint: best.addr,
                    },
                    best.rtt,
                    why,
                );
            };
            let cur_rtt = cur.rtt.unwrap_or_default();
            if rtt + RTT_HYSTERESIS < cur_rtt {
                let why = format!(
                    "pong in {} ms ({} ms on {})",
                    ms(rtt),
                    ms(cur_rtt),
                    cur.addr
                );
                return (
                    Path::Direct {
                        endpoint: best.addr,
                    },
                    best.rtt,
                    why,
                );
            }
            return (peer.path.clone(), cur.rtt, peer.reason.clone());
        }
        let lost = self.lost(peer, now);
        if let Some((relay, transport)) = self.relay_for(peer, now) {
            let rtt = peer
                .heard
                .get(&relay)
                .filter(|h| now.saturating_duration_since(h.at) < RELAY_FRESH)
                .map(|h| h.rtt);
            let path = Path::Relay {
                relay: relay.clone(),
                transport,
            };
            if path == peer.path {
                return (path, rtt, peer.reason.clone());
            }
            let why = match (&peer.path, lost) {
                (Path::Relay { relay: r, .. }, _) if *r == relay => {
                    format!("relay {relay} reconnected over {}", over(transport))
                }
                (_, Some(lost)) => lost,
                (_, None) => match rtt {
                    Some(rtt) => format!("pong via relay {relay} in {} ms", ms(rtt)),
                    None => "the peer's home relay; no direct candidate answered yet".to_owned(),
                },
            };
            return (path, rtt, why);
        }
        let why = lost.unwrap_or_else(|| match &peer.path {
            Path::None => peer.reason.clone(),
            _ => "nothing answers".to_owned(),
        });
        (Path::None, None, why)
    }

    /// Why the peer's current path no longer holds, if it does not.
    fn lost(&self, peer: &Peer, now: Instant) -> Option<String> {
        match &peer.path {
            Path::None => None,
            Path::Direct { endpoint } => match peer.candidate(*endpoint) {
                None => Some(format!("{endpoint} is no longer a candidate")),
                Some(c) if c.dead(now) => Some(format!("{MISSED_PINGS} pings unanswered")),
                Some(c) if !c.alive(now) => Some(match c.last_pong {
                    Some(p) => format!(
                        "no pong for {} s",
                        now.saturating_duration_since(p).as_secs()
                    ),
                    None => "no pong".to_owned(),
                }),
                Some(_) => None,
            },
            Path::Relay { relay, .. } => {
                if !self.local.relays.iter().any(|s| s.name == *relay) {
                    Some(format!("relay {relay} is no longer in the state"))
                } else if let Some(why) = self.local.down.get(relay) {
                    Some(format!("relay {relay} is down: {why}"))
                } else if peer.gone.contains_key(relay) {
                    Some(format!("the peer is not registered at relay {relay}"))
                } else if !self.local.up.contains_key(relay) {
                    Some(format!("relay {relay} is not connected"))
                } else {
                    None
                }
            }
        }
    }

    /// The relay the peer should be carried through, with its transport (see the table).
    fn relay_for(&self, peer: &Peer, now: Instant) -> Option<(String, Transport)> {
        let usable = |r: &str| -> Option<Transport> {
            if !self.local.relays.iter().any(|s| s.name == r) || peer.gone.contains_key(r) {
                return None;
            }
            self.local.up.get(r).copied()
        };
        if let Path::Relay { relay, .. } = &peer.path
            && let Some(t) = usable(relay)
        {
            return Some((relay.clone(), t));
        }
        if let Some(home) = &peer.reach.home_relay
            && let Some(t) = usable(home)
        {
            return Some((home.clone(), t));
        }
        self.local.relays.iter().find_map(|s| {
            let heard = peer
                .heard
                .get(&s.name)
                .is_some_and(|h| now.saturating_duration_since(h.at) < RELAY_FRESH);
            let t = usable(&s.name)?;
            heard.then(|| (s.name.clone(), t))
        })
    }
}
