//! The primary selection by table, stepping time: lease expiry, probe failure, hold-down, no
//! pre-emption, ties, a denied primary, every router gone, exits.

use super::*;
use uuid::Uuid;

const NET: &str = "10.1.0.0/24";

fn router(n: u128) -> Router {
    Router {
        node_id: Uuid::from_u128(n),
        cidr: NET.parse().unwrap(),
        kind: Kind::Route,
        probe: Some("10.1.0.5".parse().unwrap()),
        advertised: true,
        healthy: true,
        healthy_since: Some(0),
        // Reports renew every second; the tests that let a lease expire stop renewing.
        last_report: 100,
        approval: Approval::Approved,
        approved_at: Some(0),
        primary_since: None,
    }
}

/// Runs the selection at `now` and writes the verdicts back (what the store does); answers
/// the primary's node number and every role.
fn step(rows: &mut [Router], now: i64) -> (Option<u128>, Vec<RouterRole>) {
    let v = select(rows, now);
    for (r, v) in rows.iter_mut().zip(&v) {
        r.primary_since = v.primary_since;
    }
    let primary = rows
        .iter()
        .zip(&v)
        .find(|(r, v)| r.kind == Kind::Route && v.role == RouterRole::Primary)
        .map(|(r, _)| r.node_id.as_u128());
    (primary, v.iter().map(|v| v.role).collect())
}

/// Both routers report at `now` (the renewals every second).
fn report(rows: &mut [Router], which: &[usize], now: i64) {
    for &i in which {
        rows[i].last_report = now;
    }
}

#[test]
fn the_longest_healthy_router_is_primary_and_the_other_stands_by() {
    let mut rows = vec![router(2), router(1)];
    rows[0].healthy_since = Some(-100); // r2 healthy longer
    rows[1].healthy_since = Some(-50);
    let (p, roles) = step(&mut rows, 0);
    assert_eq!(p, Some(2));
    assert_eq!(roles, vec![RouterRole::Primary, RouterRole::Standby]);
}

#[test]
fn ties_go_to_the_earliest_approval_then_the_smallest_id() {
    let mut rows = vec![router(2), router(1)];
    rows[0].approved_at = Some(-5);
    assert_eq!(step(&mut rows, 0).0, Some(2), "earliest approval");
    let mut rows = vec![router(2), router(1)];
    assert_eq!(step(&mut rows, 0).0, Some(1), "smallest id");
}

#[test]
fn a_killed_primary_is_replaced_once_its_lease_expires_and_does_not_take_back_over() {
    let mut rows = vec![router(1), router(2)];
    rows[1].healthy_since = Some(10);
    assert_eq!(step(&mut rows, 100).0, Some(1));
    // r1 stops reporting at 100; r2 keeps renewing.
    for t in 101..=104 {
        report(&mut rows, &[1], t);
        assert_eq!(step(&mut rows, t).0, Some(1), "within the lease at {t}");
    }
    report(&mut rows, &[1], 105);
    let (p, roles) = step(&mut rows, 105);
    assert_eq!(p, Some(2), "lease of 4 s expired at 105");
    assert_eq!(roles[0], RouterRole::Inactive);
    let v = select(&rows, 105);
    assert!(v[0].reason.contains("no report for 5 s"), "{}", v[0].reason);
    // r1 comes back (a fresh healthy period); no pre-emption, ever, while r2 is eligible.
    rows[0].healthy_since = Some(106);
    for t in 106..400 {
        report(&mut rows, &[0, 1], t);
        assert_eq!(step(&mut rows, t).0, Some(2), "at {t}");
    }
    assert_eq!(step(&mut rows, 400).1[0], RouterRole::Standby);
}

#[test]
fn a_failing_probe_moves_the_route_at_once() {
    let mut rows = vec![router(1), router(2)];
    assert_eq!(step(&mut rows, 100).0, Some(1));
    rows[0].healthy = false;
    rows[0].healthy_since = None;
    let (p, _) = step(&mut rows, 100);
    assert_eq!(p, Some(2));
    assert!(
        select(&rows, 100)[0]
            .reason
            .contains("probe of 10.1.0.5 fails")
    );
}

#[test]
fn the_hold_down_prefers_a_router_healthy_long_enough_but_never_leaves_the_route_without_one() {
    let mut rows = vec![router(1), router(2), router(3)];
    assert_eq!(step(&mut rows, 100).0, Some(1));
    // r2 flapped recently (healthy 10 s), r3 healthy 40 s: r3 passes the hold-down.
    rows[1].healthy_since = Some(90);
    rows[2].healthy_since = Some(60);
    report(&mut rows, &[1, 2], 100);
    let (_, roles) = step(&mut rows, 100);
    assert_eq!(roles[1], RouterRole::Inactive, "within the hold-down");
    rows[0].healthy = false;
    rows[0].healthy_since = None;
    assert_eq!(step(&mut rows, 100).0, Some(3));
    // Only fresh routers left: the longest healthy one anyway.
    let mut rows = vec![router(1), router(2), router(3)];
    assert_eq!(step(&mut rows, 100).0, Some(1));
    rows[1].healthy_since = Some(95);
    rows[2].healthy_since = Some(90);
    rows[0].healthy = false;
    assert!(
        select(&rows, 100)[2]
            .reason
            .contains("no router passed the hold-down")
    );
    let (p, _) = step(&mut rows, 100);
    assert_eq!(p, Some(3));
}

#[test]
fn denying_or_withdrawing_the_primary_moves_the_route_and_pending_routers_never_carry() {
    let mut rows = vec![router(1), router(2)];
    assert_eq!(step(&mut rows, 100).0, Some(1));
    rows[0].approval = Approval::Denied;
    assert_eq!(step(&mut rows, 100).0, Some(2));
    rows[1].advertised = false;
    let (p, roles) = step(&mut rows, 100);
    assert_eq!(p, None, "every router gone: no primary");
    assert_eq!(roles, vec![RouterRole::Inactive, RouterRole::Inactive]);
    let mut pending = vec![router(1)];
    pending[0].approval = Approval::Pending;
    assert_eq!(step(&mut pending, 0).0, None);
    assert!(select(&pending, 0)[0].reason.contains("pending approval"));
}

#[test]
fn every_router_gone_leaves_no_primary_and_the_first_back_takes_over() {
    let mut rows = vec![router(1), router(2)];
    assert_eq!(step(&mut rows, 100).0, Some(1));
    assert_eq!(step(&mut rows, 200).0, None, "both leases expired");
    rows[1].last_report = 201;
    rows[1].healthy_since = Some(201);
    assert_eq!(step(&mut rows, 201).0, Some(2));
}

#[test]
fn routes_of_different_cidrs_are_separate_and_exits_serve_while_eligible() {
    let mut other = router(1);
    other.cidr = "10.2.0.0/24".parse().unwrap();
    let mut exit = router(3);
    exit.kind = Kind::Exit;
    exit.cidr = "0.0.0.0/0".parse().unwrap();
    let mut rows = vec![router(2), other, exit];
    let (_, roles) = step(&mut rows, 0);
    assert_eq!(roles, vec![RouterRole::Primary; 3]);
    rows[2].approval = Approval::Pending;
    assert_eq!(step(&mut rows, 0).1[2], RouterRole::Inactive);
}
