//! The public key type of the mesh code ([`crate::peer_key::PeerKey`], shared with reach).

pub use crate::peer_key::PeerKey;
