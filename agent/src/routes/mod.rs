//! Subnet routes and exit nodes on the node (docs/routes.md "On the node").
//!
//! | file | owns |
//! |---|---|
//! | [`report`] | sans-IO: when the route report goes out, what it says, the probes' hysteresis |
//! | [`probe`] | the ICMP echo probes (one thread per target) |
//! | [`plan`] | pure: the kernel routes, the exit, forwarding and masquerade the host should have |
//! | [`host`] | makes the host match the plan and removes exactly what it added |
//! | [`netlink`] | routes and policy rules over rtnetlink, with plexd's protocol number |
//! | [`router`] | forwarding sysctls and the nat table `inet plexd_<iface>_nat` |
//! | [`runtime`] | the task tying them to the daemon ([`RoutesHandle`]) |
//! | [`status`] | `routes` of `plexd status` |

mod op;
pub mod plan;
pub mod report;
pub mod status;

#[cfg(target_os = "linux")]
pub mod host;
#[cfg(target_os = "linux")]
pub mod netlink;
#[cfg(target_os = "linux")]
pub mod probe;
#[cfg(target_os = "linux")]
pub mod router;
#[cfg(target_os = "linux")]
pub mod runtime;

#[cfg(all(test, target_os = "linux"))]
mod root_tests;

#[cfg(target_os = "linux")]
pub use runtime::{RoutesHandle, RoutesSetup};

pub use op::RoutesOp;

/// `plexd leave` / `plexd uninstall` without a running daemon: the nat table and the exit's
/// policy rules a crashed run may have left (the routes go with the interface).
#[cfg(target_os = "linux")]
pub(crate) fn remove_leftovers(iface: &str) -> Result<(), String> {
    router::remove_on_leave(iface)?;
    let found = netlink::list_rules(
        |p| [host::PRIO_EXEMPT, host::PRIO_SUPPRESS, host::PRIO_EXIT].contains(&p),
        &[netlink::TABLE_MAIN, plan::EXIT_TABLE],
    )
    .map_err(|e| format!("cannot list the policy rules: {e}"))?;
    for (_, prio, msg) in found {
        netlink::del_rule_message(msg)
            .map_err(|e| format!("cannot remove the exit's rule of priority {prio}: {e}; run `ip rule del priority {prio}`"))?;
    }
    Ok(())
}
