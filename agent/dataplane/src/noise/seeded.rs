//! Random sources for tests only: [`SeededRng`] gives the same bytes for the same seed, so a
//! [`super::Tunnel`] built with it writes the same handshake messages for the same inputs;
//! [`Failing`] fails as the OS's source may. Production passes the OS's CSPRNG
//! (`rand_core::OsRng`), never these: a 64-bit seed is guessable.

use std::num::NonZeroU32;

use rand_core::{CryptoRng, RngCore};

/// SHA-256 in counter mode over a seed: block `i` is `SHA-256("plexd-dataplane test rng" |
/// seed | i)`, given out byte by byte.
pub(crate) struct SeededRng {
    seed: u64,
    counter: u64,
    block: [u8; 32],
    /// Bytes of `block` already given out.
    used: usize,
}

impl SeededRng {
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            seed,
            counter: 0,
            block: [0; 32],
            used: 32,
        }
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
                let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
                ctx.update(b"plexd-dataplane test rng");
                ctx.update(&self.seed.to_be_bytes());
                ctx.update(&self.counter.to_be_bytes());
                self.block.copy_from_slice(ctx.finish().as_ref());
                self.counter += 1;
                self.used = 0;
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
pub(crate) struct Failing;

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
        "the second block differs from the first"
    );
}
