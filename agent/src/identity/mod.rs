//! What the node keeps in its state dir: the WireGuard key and the identity it registered.

pub mod host;
mod key;
pub mod rotation;
mod state;

pub use key::{KeyError, NodeKey};
pub use state::{IDENTITY_VERSION, Identity, IdentityError, SecretString};
