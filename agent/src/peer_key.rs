//! A WireGuard public key as the mesh and reach code handle it: the wire crate's
//! [`PublicKey`](plexsphere_wire::key::PublicKey), the one public-key type of the agent, the data
//! plane and the codecs, under the name this crate's code has used for it. A top-level module so
//! the mesh, its diff and the reach runtime share it without importing each other.

pub use plexsphere_wire::key::PublicKey as PeerKey;
