//! The nftables table's life around the daemon (root): `set_policy`'s fail-closed
//! fallback, the worker's restore after a flush, removal on leave and on a userspace start.
//! The lab and helpers are nft_root_tests.rs's.

use nix::sched::CloneFlags;

use super::nft;
use super::nft_root_tests::{A, B, B2, Lab, b_view, connects, listen, sh};
use super::nft_tests::{grant, peer, view};

#[test]
fn set_policy_fails_closed_when_nft_refuses_the_view() {
    use plexsphere_wire::node::PolicyState;
    let lab = Lab::new("p");
    let _l = (listen(&lab, B, 5432), listen(&lab, B2, 5432));
    let state = |view| PolicyState { version: 7, view };
    // Two peers claiming one address: nft refuses the map ("File exists"), so plexd falls
    // back to the closed table and answers Err.
    let clash = view(
        &[B],
        vec![
            grant(&[(5432, 5432)], &[], true, false),
            grant(&[(22, 22)], &[], false, false),
        ],
        vec![peer(1, &[A], Some(0), None), peer(2, &[A], Some(1), None)],
    );
    let mesh = lab.mesh.clone();
    let err = lab
        .in_b(move || nft::set_policy(&mesh, Some(&state(clash))))
        .unwrap_err()
        .to_string();
    assert!(err.contains("policy version 7"), "{err}");
    assert!(err.contains("nothing from any peer passes"), "{err}");
    let closed = lab.listing();
    assert!(
        closed.contains("counter") && !closed.contains("jump"),
        "{closed}"
    );
    assert!(
        !connects(&lab, false, B, 5432),
        "closed: nothing from the interface"
    );
    assert!(
        connects(&lab, false, B2, 5432),
        "another interface is untouched"
    );

    let mesh = lab.mesh.clone();
    lab.in_b(move || nft::set_policy(&mesh, Some(&state(b_view(false, &[(5432, 5432)])))))
        .unwrap();
    assert!(connects(&lab, false, B, 5432));
    let mesh = lab.mesh.clone();
    lab.in_b(move || nft::set_policy(&mesh, None)).unwrap();
    assert!(lab.listing().is_empty(), "no policy: no table");
}

/// A fresh namespace on a thread of its own (root).
fn in_fresh_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        nix::sched::unshare(CloneFlags::CLONE_NEWNET).unwrap();
        f()
    })
    .join()
    .unwrap()
}

fn wg_cfg(backend: crate::config::Backend, tag: &str) -> crate::config::WireguardConfig {
    crate::config::WireguardConfig {
        backend,
        interface: format!("pkt{tag}{}", std::process::id() % 100_000),
        listen_port: 0,
        ..crate::config::WireguardConfig::default()
    }
}

/// `plexd leave` / `plexd uninstall` without a daemon (the leftover interface of a kernel
/// node): the interface and its policy table go.
#[test]
fn leave_removes_the_table_with_the_interface() {
    let c = wg_cfg(crate::config::Backend::Kernel, "l");
    let (before, after, link) = in_fresh_netns(move || {
        let other = format!("{}p", c.interface);
        sh(&[
            "ip",
            "link",
            "add",
            &c.interface,
            "type",
            "veth",
            "peer",
            "name",
            &other,
        ]);
        nft::install_closed(&c.interface).unwrap();
        let before = nft::exists(&c.interface).unwrap();
        super::for_leave(&c, |_| Ok(())).teardown().unwrap();
        let link = super::netlink::link(&c.interface).unwrap();
        (before, nft::exists(&c.interface).unwrap(), link)
    });
    assert!(before);
    assert!(!after, "the table is gone");
    assert!(link.is_none(), "the interface is gone");
}

/// A node that switched from the kernel backend to the userspace one: the stale table would
/// filter the TUN device with an old view; the userspace start removes it.
#[test]
fn the_userspace_backend_removes_a_table_the_kernel_backend_left() {
    let c = wg_cfg(crate::config::Backend::Userspace, "s");
    let (before, after) = in_fresh_netns(move || {
        nft::install_closed(&c.interface).unwrap();
        let before = nft::exists(&c.interface).unwrap();
        let node = super::NodeSetup::new([0x41; 32], "10.77.0.2".parse().unwrap(), 16);
        let mut m = super::open(&c, &node).unwrap();
        let after = nft::exists(&c.interface).unwrap();
        m.teardown().unwrap();
        (before, after)
    });
    assert!(before);
    assert!(!after);
}

/// `nft flush ruleset` (what Debian's nftables.service runs on a restart) removes plexd's
/// table; the worker's periodic `restore` puts it back.
#[test]
fn a_flushed_table_is_restored() {
    use plexsphere_wire::node::PolicyState;
    let lab = Lab::new("f");
    let _l = (listen(&lab, B, 5432), listen(&lab, B, 5433));
    let state = PolicyState {
        version: 3,
        view: b_view(false, &[(5432, 5432)]),
    };
    let (mesh, s) = (lab.mesh.clone(), state.clone());
    lab.in_b(move || nft::set_policy(&mesh, Some(&s))).unwrap();
    assert!(!connects(&lab, false, B, 5433));
    lab.in_b(|| sh(&["nft", "flush", "ruleset"]));
    assert!(connects(&lab, false, B, 5433), "flushed: unfiltered");
    let (mesh, s) = (lab.mesh.clone(), state.clone());
    assert!(lab.in_b(move || nft::restore(&mesh, &s)).unwrap());
    assert!(!connects(&lab, false, B, 5433), "restored");
    assert!(connects(&lab, false, B, 5432));
    let (mesh, s) = (lab.mesh.clone(), state);
    assert!(
        !lab.in_b(move || nft::restore(&mesh, &s)).unwrap(),
        "in place: nothing to do"
    );
}
