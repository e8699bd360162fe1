//! The live switch for UDP segmentation offload of the WireGuard socket: GSO on send
//! (`UDP_SEGMENT`, runs of equal datagrams to one peer in one system call) and GRO on receive
//! (`UDP_GRO`, the kernel hands over runs of datagrams as one).
//!
//! Some Linux kernels have shipped GSO bugs that corrupt or lose segmented datagrams, so an
//! operator can switch both off for a node (its signed state's `udp_offload`), and plexd does
//! so without a restart: the owner calls [`UdpOffloadSwitch::set`]; the socket (in
//! `crate::linux::udp_switch`) sees the new generation at its next send or receive (within
//! one poll interval) and applies it through the socket options, then reports back what the
//! kernel now does. Plain atomics: no lock on the packet path.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// What the socket does now, as it last read it back from the kernel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdpOffloadState {
    /// What the owner asked for: false when offload is switched off.
    pub allowed: bool,
    /// Whether the socket sends with UDP GSO.
    pub gso: bool,
    /// Whether the socket has `UDP_GRO` set (read back with `getsockopt`).
    pub gro: bool,
    /// Whether the socket applied the latest request (false between `set` and its next call).
    pub applied: bool,
}

/// Shared by the owner (plexd's daemon) and the data plane's socket.
#[derive(Debug)]
pub struct UdpOffloadSwitch {
    allowed: AtomicBool,
    /// Bumped by every `set`; the socket compares it with the one it applied.
    generation: AtomicU64,
    applied: AtomicU64,
    gso: AtomicBool,
    gro: AtomicBool,
}

impl UdpOffloadSwitch {
    /// A switch that starts allowed (`true`: offload where the kernel has it) or off.
    pub fn new(allowed: bool) -> Self {
        Self {
            allowed: AtomicBool::new(allowed),
            generation: AtomicU64::new(1),
            applied: AtomicU64::new(0),
            gso: AtomicBool::new(false),
            gro: AtomicBool::new(false),
        }
    }

    /// Allows offload (where the kernel has it) or switches it off; the socket applies it at
    /// its next call.
    pub fn set(&self, allowed: bool) {
        self.allowed.store(allowed, Ordering::SeqCst);
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    pub fn allowed(&self) -> bool {
        self.allowed.load(Ordering::SeqCst)
    }

    /// The request the socket has not applied yet, if any: (its generation, allowed).
    pub fn pending(&self, applied: u64) -> Option<(u64, bool)> {
        let generation = self.generation.load(Ordering::SeqCst);
        (generation != applied).then(|| (generation, self.allowed()))
    }

    /// The socket applied request `generation` and now does `gso`/`gro`.
    pub fn report(&self, generation: u64, gso: bool, gro: bool) {
        self.gso.store(gso, Ordering::SeqCst);
        self.gro.store(gro, Ordering::SeqCst);
        self.applied.store(generation, Ordering::SeqCst);
    }

    pub fn state(&self) -> UdpOffloadState {
        let applied = self.applied.load(Ordering::SeqCst) == self.generation.load(Ordering::SeqCst);
        UdpOffloadState {
            allowed: self.allowed(),
            gso: self.gso.load(Ordering::SeqCst),
            gro: self.gro.load(Ordering::SeqCst),
            applied,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_pending_until_the_socket_reports_it() {
        let s = UdpOffloadSwitch::new(true);
        let (generation, allowed) = s.pending(0).unwrap();
        assert!(allowed);
        assert!(!s.state().applied);
        s.report(generation, true, true);
        assert_eq!(s.pending(generation), None);
        assert_eq!(
            s.state(),
            UdpOffloadState {
                allowed: true,
                gso: true,
                gro: true,
                applied: true
            }
        );
        s.set(false);
        assert!(!s.state().applied, "a new request is not applied yet");
        let (next, allowed) = s.pending(generation).unwrap();
        assert!(next > generation && !allowed);
        s.report(next, false, false);
        assert_eq!(
            s.state(),
            UdpOffloadState {
                allowed: false,
                gso: false,
                gro: false,
                applied: true
            }
        );
    }
}
