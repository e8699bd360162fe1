//! A WireGuard public key as the mesh and reach code handle it: 32 bytes, shown in base64
//! (public, so it may be logged). A top-level module so the mesh, its diff and the reach
//! runtime share it without importing each other.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// A WireGuard public key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerKey(pub [u8; 32]);

impl PeerKey {
    pub fn from_base64(text: &str) -> Option<Self> {
        let bytes = STANDARD.decode(text.trim()).ok()?;
        Some(Self(bytes.try_into().ok()?))
    }

    pub fn to_base64(self) -> String {
        STANDARD.encode(self.0)
    }
}

impl fmt::Display for PeerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_base64())
    }
}

impl fmt::Debug for PeerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PeerKey({self})")
    }
}
