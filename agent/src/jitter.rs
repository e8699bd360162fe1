//! The agent's one source of jitter: uniform samples in `[0, 1)` from a small seeded
//! generator (SplitMix64). Decisions take a sample as a parameter; whoever runs them owns the
//! generator, seeded from the OS in production and from a fixed seed in tests, so a test can
//! replay exactly the delays a fleet member would pick.

use rand_core::{OsRng, RngCore as _};

/// A seeded stream of jitter samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jitter {
    state: u64,
}

impl Jitter {
    /// A generator that yields the same samples for the same seed.
    pub fn seeded(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator seeded from the operating system (each process picks its own delays).
    pub(crate) fn from_os() -> Self {
        Self::seeded(OsRng.next_u64())
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The next uniform sample in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        unit_interval(self.next_u64())
    }
}

/// A sample in `[0, 1)` from 64 random bits (the top 53, as many as an `f64` holds).
pub(crate) fn unit_interval(bits: u64) -> f64 {
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_samples_all_in_the_unit_interval() {
        let mut a = Jitter::seeded(7);
        let mut b = Jitter::seeded(7);
        for _ in 0..10_000 {
            let x = a.unit();
            assert!((0.0..1.0).contains(&x));
            assert_eq!(x.to_bits(), b.unit().to_bits());
        }
        assert_ne!(Jitter::seeded(8).unit(), Jitter::seeded(7).unit());
        assert_eq!(unit_interval(0), 0.0);
        assert!(unit_interval(u64::MAX) < 1.0);
    }
}
