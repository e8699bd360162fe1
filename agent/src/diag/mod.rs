//! The diagnostics: `plexd ping`, `plexd netcheck` and `plexd bugreport`. Each command has a
//! pure part (what to send, how to read answers, the verdicts, the report and its rendering,
//! tested without sockets) and a thin I/O part.
//!
//! | file              | owns                                                          |
//! |-------------------|---------------------------------------------------------------|
//! | `ping.rs`         | resolving a peer from the daemon's status, ICMP echo packets, the summary |
//! | `icmp.rs`         | the ICMP socket (an unprivileged ping socket, else a raw one) |
//! | `netcheck.rs`     | the checks' verdicts, hints and rendering                     |
//! | `netcheck_probe.rs` | the probes: TCP, TLS, STUN, the MTUs                        |
//! | `bugreport.rs`    | what goes in the tarball, the redaction, the size bound       |
//! | `tarball.rs`      | writing the tar.gz                                            |
//! | `commands.rs`     | `ping` and `netcheck`: gather with the probes, judge, print   |
//! | `collect.rs`      | `bugreport`: gather the entries, redact, bound, write         |

pub mod bugreport;
pub mod collect;
pub mod commands;
pub mod netcheck;
pub mod netcheck_probe;
pub mod ping;
pub mod tarball;
