//! Random sources for tests and simulators only. [`SeededRng`]: the same seed gives the same
//! bytes, so a machine built with it (plexd's `Engine::seeded`, the reach node and schedule
//! tests, the data plane's `noise::Tunnel`) gives the same outputs byte for byte for the same
//! inputs. [`Failing`]: fails as the OS's source may, for the fail-closed tests.
//!
//! SHA-256 in counter mode over the seed: block `i` is `SHA-256("plexd seeded rng" | seed |
//! i)`. That is a sound generator in itself, but a 64-bit seed is guessable, so this is a
//! dev-dependency only; production passes the OS's CSPRNG (`rand_core::OsRng`).

use std::num::NonZeroU32;

use rand_core::{CryptoRng, RngCore};

pub struct SeededRng {
    seed: u64,
    /// The next block's number.
    counter: u64,
    block: [u8; 32],
    /// Bytes of `block` already given out.
    used: usize,
}

impl SeededRng {
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            counter: 0,
            block: [0; 32],
            used: 32,
        }
    }

    fn refill(&mut self) {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(b"plexd seeded rng");
        ctx.update(&self.seed.to_be_bytes());
        ctx.update(&self.counter.to_be_bytes());
        self.block.copy_from_slice(ctx.finish().as_ref());
        self.counter = self.counter.wrapping_add(1);
        self.used = 0;
    }
}

impl RngCore for SeededRng {
    fn next_u32(&mut self) -> u32 {
        let mut b = [0; 4];
        self.fill_bytes(&mut b);
        u32::from_le_bytes(b)
    }

    fn next_u64(&mut self) -> u64 {
        let mut b = [0; 8];
        self.fill_bytes(&mut b);
        u64::from_le_bytes(b)
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for byte in dest {
            if self.used == self.block.len() {
                self.refill();
            }
            *byte = self.block[self.used];
            self.used += 1;
        }
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

/// Tests only (see the module docs).
impl CryptoRng for SeededRng {}

/// A random source that always fails.
pub struct Failing;

impl RngCore for Failing {
    fn next_u32(&mut self) -> u32 {
        unreachable!("the code under test uses try_fill_bytes only")
    }

    fn next_u64(&mut self) -> u64 {
        unreachable!("the code under test uses try_fill_bytes only")
    }

    fn fill_bytes(&mut self, _: &mut [u8]) {
        unreachable!("the code under test uses try_fill_bytes only")
    }

    fn try_fill_bytes(&mut self, _: &mut [u8]) -> Result<(), rand_core::Error> {
        Err(NonZeroU32::new(rand_core::Error::CUSTOM_START)
            .unwrap_or(NonZeroU32::MIN)
            .into())
    }
}

impl CryptoRng for Failing {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_bytes_and_another_seed_others() {
        let draw = |seed| {
            let mut rng = SeededRng::new(seed);
            let mut a = [0u8; 45];
            rng.fill_bytes(&mut a);
            (a, rng.next_u64())
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
        let (bytes, _) = draw(1);
        assert_ne!(
            bytes[..13],
            bytes[32..],
            "the second block is not the first again"
        );
    }
}
