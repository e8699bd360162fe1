//! What wakes the executor's loop, as one enum: the core's own inputs, plus the two that
//! carry something the core must not hold (a signal, and a socket request with the channel
//! its answer goes back on).

use tokio::sync::oneshot;

use super::core::io;
use super::core::protocol::{Answer, Request};

#[derive(Debug)]
pub enum Input {
    /// An input for the core as it is (a call's answer, a stream message, a mesh answer).
    Core(io::Input),
    Signal(Signal),
    /// A request on the status socket and where to answer it.
    Control(Request, oneshot::Sender<Answer>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Term,
    Int,
    Hup,
}

impl Signal {
    pub fn name(self) -> &'static str {
        match self {
            Signal::Term => "SIGTERM",
            Signal::Int => "SIGINT",
            Signal::Hup => "SIGHUP",
        }
    }
}
