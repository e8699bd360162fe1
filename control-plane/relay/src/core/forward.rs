//! Forwarding a `send`: the sender's registration and budget checked, then where it goes on
//! (its destination's peer) or what its sender is answered (`busy`, `peer_gone`, `refused`).

use std::time::Instant;

use plexsphere_wire::reach::relay::{Frame, KeyPrefix, RefuseCode};

use super::{Core, Limit, Now, Out, Peer, Transmit};

impl Core {
    /// A `send` of `len` payload bytes to `dst` from `peer` (its bytes stay with the shell);
    /// queues where it goes on ([`Transmit::Forward`]) or the answer to its sender, for
    /// [`Core::poll_transmit`]. A dropped one (counted) queues nothing.
    pub fn handle_send(&mut self, dst: &KeyPrefix, len: usize, peer: Peer, now: Now) {
        let out = self.forward(dst, len, peer, now);
        self.push(out);
    }

    /// Where a `send` goes on, or the answer to its sender; `None`: dropped (counted).
    pub(super) fn forward(
        &mut self,
        dst: &KeyPrefix,
        len: usize,
        peer: Peer,
        now: Now,
    ) -> Option<Transmit> {
        let Some(src) = self.by_peer.get(&peer).copied() else {
            return self.not_registered(peer, now.at);
        };
        let Some(reg) = self.nodes.get_mut(&src) else {
            return self.not_registered(peer, now.at);
        };
        if reg.expires <= now.at {
            return self.not_registered(peer, now.at);
        }
        if !reg.frames.take(1, now.at) || !reg.bytes.take(len as u64, now.at) {
            self.counters.dropped_budget.inc();
            let answer = reg.answers.take(1, now.at);
            self.hit(Limit::NodeBudget, now.at);
            return match (answer, self.to(peer)) {
                (true, Some(to)) => {
                    let busy = Frame::Refused {
                        code: RefuseCode::Busy,
                        reason: "over this node's budget at this relay; frames are dropped".into(),
                    };
                    Some(Transmit::Frame(Out {
                        to,
                        frame: self.seal_for(peer, busy, now.unix_secs()),
                    }))
                }
                _ => None,
            };
        }
        let target = self
            .by_prefix
            .get(dst)
            .and_then(|key| self.nodes.get(key))
            .filter(|r| r.expires > now.at)
            .map(|r| r.peer);
        match target.and_then(|p| self.to(p)) {
            Some(to) => Some(Transmit::Forward { to, src }),
            None => {
                self.counters.peer_gone.inc();
                let answer = self
                    .nodes
                    .get_mut(&src)
                    .is_some_and(|r| r.answers.take(1, now.at));
                match (answer, self.to(peer)) {
                    (true, Some(to)) => Some(Transmit::Frame(Out {
                        to,
                        frame: self.seal_for(peer, Frame::PeerGone { dst: *dst }, now.unix_secs()),
                    })),
                    _ => None,
                }
            }
        }
    }

    fn not_registered(&mut self, peer: Peer, now: Instant) -> Option<Transmit> {
        self.refuse(
            peer,
            RefuseCode::NotRegistered,
            "send from an address or connection with no registration: register first",
            now,
        )
        .map(Transmit::Frame)
    }
}
