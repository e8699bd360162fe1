//! The simulator's tests: every pair of NAT kinds ends on its expected path and a run repeats
//! byte for byte from its seed (`pairs.rs`); a relay killed, a node roaming, 5 % loss
//! (`faults.rs`); a thousand nodes (`thousand.rs`).

mod faults;
mod pairs;
mod thousand;
