//! The node's machines driven directly, with a stepped clock.

mod base;
mod carry;
mod node;
mod rekey;
mod relays;
mod rig;
mod routing;
mod sans_io;
mod schedule;
mod scripted;
