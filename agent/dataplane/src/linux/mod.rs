//! Linux devices: the TUN interface and the UDP socket.

mod mmsg;
mod pktinfo;
mod poll;
pub mod sched;
mod tun;
mod udp;
mod udp_switch;

pub use tun::{LinuxTun, TunError};
pub use udp::{LinuxUdp, LinuxUdpBinder};
pub use udp_switch::{SwitchedBinder, SwitchedUdp};
