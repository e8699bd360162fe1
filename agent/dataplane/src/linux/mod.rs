//! Linux devices: the TUN interface and the UDP socket.

mod mmsg;
mod pktinfo;
mod poll;
pub mod sched;
pub mod tun;
pub mod udp;
pub mod udp_switch;

pub use tun::{LinuxTun, TunError};
pub use udp::{LinuxUdp, LinuxUdpBinder};
pub use udp_switch::{SwitchedBinder, SwitchedUdp};
