//! The node's machines driven directly, with a stepped clock.

mod node;
mod relays;
mod rig;
mod routing;
mod schedule;
