use proptest::prelude::*;
use time::macros::datetime;

use super::*;

const T0: OffsetDateTime = datetime!(2026-11-30 14:31:02 UTC);

fn node() -> Uuid {
    Uuid::from_u128(0x019a0816_0000_7000_8000_0000000000aa)
}

fn all_observations() -> Vec<Observation> {
    vec![
        Observation::SubstrateAccepted,
        Observation::MachineBooted,
        Observation::SubstrateReady,
        Observation::NodeRegistered { node_id: node() },
        Observation::SubstrateFailed {
            reason: "quota exceeded".into(),
        },
        Observation::CloudInitFailed {
            detail: "runcmd failed".into(),
        },
        Observation::JoinFailed {
            exit_code: 3,
            detail: "token_consumed".into(),
        },
        Observation::DeleteRequested,
        Observation::SubstrateGone,
    ]
}

/// The expected table, written out independently of `decide`: every (class, phase,
/// observation) that moves, and where to. Everything not listed is ignored.
fn expected(class: Class, phase: Phase, obs: &Observation) -> Option<Phase> {
    use Observation as O;
    use Phase as P;
    let m = class == Class::Machine;
    let live = [P::Pending, P::Provisioning, P::Enrolling, P::Ready];
    Some(match obs {
        O::SubstrateAccepted if phase == P::Pending => P::Provisioning,
        O::MachineBooted if m && phase == P::Provisioning => P::Enrolling,
        O::SubstrateReady if !m && phase == P::Provisioning => P::Ready,
        O::NodeRegistered { .. } if m && phase == P::Enrolling => P::Ready,
        O::SubstrateFailed { .. } if live.contains(&phase) || phase == P::Deprovisioning => {
            P::Failed
        }
        O::CloudInitFailed { .. } | O::JoinFailed { .. } if m && live.contains(&phase) => P::Failed,
        O::DeleteRequested if phase != P::Deprovisioning && phase != P::Deleted => {
            P::Deprovisioning
        }
        O::SubstrateGone if phase == P::Deprovisioning => P::Deleted,
        O::SubstrateGone if [P::Provisioning, P::Enrolling, P::Ready].contains(&phase) => P::Failed,
        _ => return None,
    })
}

#[test]
fn every_cell_of_the_table_is_as_documented() {
    let mut moves = 0;
    for class in [Class::Machine, Class::Standalone] {
        for phase in Phase::ALL {
            for obs in all_observations() {
                let got = decide(class, phase, &obs);
                match (expected(class, phase, &obs), &got) {
                    (Some(to), Decision::Move { to: got_to, reason }) => {
                        assert_eq!(*got_to, to, "{class:?} {phase} {obs:?}");
                        assert_eq!(reason.is_some(), to == Phase::Failed, "{phase} {obs:?}");
                        moves += 1;
                    }
                    (None, Decision::Ignore { why }) => assert!(!why.is_empty()),
                    (want, got) => panic!("{class:?} {phase} {obs:?}: want {want:?}, got {got:?}"),
                }
            }
        }
    }
    // 126 cells; 25 move for a machine, 16 for a standalone resource (counted by hand).
    assert_eq!(moves, 41);
}

#[test]
fn a_machine_walks_pending_provisioning_enrolling_ready() {
    let mut p = Provisioning::new(T0);
    let steps = [
        (Observation::SubstrateAccepted, Phase::Provisioning),
        (Observation::MachineBooted, Phase::Enrolling),
        (
            Observation::NodeRegistered { node_id: node() },
            Phase::Ready,
        ),
    ];
    for (i, (obs, want)) in steps.iter().enumerate() {
        let at = T0 + time::Duration::seconds(10 * (i as i64 + 1));
        let out = p.observe(Class::Machine, obs, at);
        assert!(
            matches!(out, Outcome::Moved { to, .. } if to == *want),
            "{out:?}"
        );
        assert_eq!(p.observed_at, at);
    }
    let phases: Vec<_> = p.history.iter().map(|h| h.phase.as_str()).collect();
    assert_eq!(phases, ["Pending", "Provisioning", "Enrolling", "Ready"]);
    assert_eq!(
        p.history[3].observed,
        "node 019a0816-0000-7000-8000-0000000000aa registered with the resource's bootstrap token"
    );
    assert_eq!(p.reason, None);
}

#[test]
fn a_standalone_resource_skips_enrolling() {
    let mut p = Provisioning::new(T0);
    p.observe(Class::Standalone, &Observation::SubstrateAccepted, T0);
    let out = p.observe(Class::Standalone, &Observation::MachineBooted, T0);
    assert_eq!(
        out,
        Outcome::Ignored {
            phase: Phase::Provisioning,
            why: "a standalone resource has no machine"
        }
    );
    p.observe(Class::Standalone, &Observation::SubstrateReady, T0);
    let phases: Vec<_> = p.history.iter().map(|h| h.phase).collect();
    assert_eq!(phases, [Phase::Pending, Phase::Provisioning, Phase::Ready]);
}

#[test]
fn re_offered_observations_are_ignored_and_change_nothing() {
    let mut p = Provisioning::new(T0);
    p.observe(Class::Machine, &Observation::SubstrateAccepted, T0);
    let before = p.clone();
    let later = T0 + time::Duration::minutes(1);
    let out = p.observe(Class::Machine, &Observation::SubstrateAccepted, later);
    assert_eq!(
        out,
        Outcome::Ignored {
            phase: Phase::Provisioning,
            why: "the substrate already accepted it"
        }
    );
    assert_eq!(p, before);
    // A registration seen before the boot is not applied; the loop re-offers it later.
    let out = p.observe(
        Class::Machine,
        &Observation::NodeRegistered { node_id: node() },
        later,
    );
    assert!(matches!(out, Outcome::Ignored { .. }));
    assert_eq!(p.phase, Phase::Provisioning);
}

#[test]
fn failed_carries_the_observed_reason_and_only_a_delete_leaves_it() {
    let mut p = Provisioning::new(T0);
    p.observe(Class::Machine, &Observation::SubstrateAccepted, T0);
    p.observe(Class::Machine, &Observation::MachineBooted, T0);
    let obs = Observation::JoinFailed {
        exit_code: 3,
        detail: "the bootstrap token was already used (token_consumed)".into(),
    };
    p.observe(Class::Machine, &obs, T0);
    assert_eq!(p.phase, Phase::Failed);
    assert_eq!(
        p.reason.as_deref(),
        Some("plexd join exited with 3: the bootstrap token was already used (token_consumed)")
    );
    for o in all_observations() {
        if o != Observation::DeleteRequested {
            assert!(matches!(
                p.clone().observe(Class::Machine, &o, T0),
                Outcome::Ignored { .. }
            ));
        }
    }
    p.observe(Class::Machine, &Observation::DeleteRequested, T0);
    assert_eq!(
        (p.phase, p.reason.as_deref()),
        (Phase::Deprovisioning, None)
    );
    p.observe(Class::Machine, &Observation::SubstrateGone, T0);
    assert_eq!(p.phase, Phase::Deleted);
}

#[test]
fn deleted_needs_the_substrate_to_confirm() {
    let mut p = Provisioning::new(T0);
    p.observe(Class::Standalone, &Observation::DeleteRequested, T0);
    for o in all_observations() {
        if o != Observation::SubstrateGone && !matches!(o, Observation::SubstrateFailed { .. }) {
            p.observe(Class::Standalone, &o, T0);
            assert_eq!(p.phase, Phase::Deprovisioning, "{o:?}");
        }
    }
    p.observe(Class::Standalone, &Observation::SubstrateGone, T0);
    assert_eq!(p.phase, Phase::Deleted);
}

#[test]
fn history_is_bounded_and_keeps_the_first_entry() {
    let mut p = Provisioning::new(T0);
    let fail = Observation::SubstrateFailed { reason: "x".into() };
    for _ in 0..100 {
        p.observe(Class::Machine, &Observation::DeleteRequested, T0);
        p.observe(Class::Machine, &fail, T0);
    }
    assert_eq!(p.history.len(), MAX_HISTORY);
    assert_eq!(p.history[0].observed, "the declaration was accepted");
    assert_eq!(p.history.last().map(|h| h.phase), Some(Phase::Failed));
}

fn observation() -> impl Strategy<Value = Observation> {
    prop::sample::select(all_observations())
}

fn class() -> impl Strategy<Value = Class> {
    prop::sample::select(vec![Class::Machine, Class::Standalone])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn no_sequence_leaves_a_terminal_phase_but_by_the_allowed_edges(
        class in class(),
        seq in prop::collection::vec(observation(), 0..40),
    ) {
        let mut p = Provisioning::new(T0);
        let mut seen_delete = false;
        for (i, obs) in seq.iter().enumerate() {
            let before = p.clone();
            let at = T0 + time::Duration::seconds(i as i64);
            let out = p.observe(class, obs, at);
            match out {
                Outcome::Ignored { .. } => prop_assert_eq!(&p, &before),
                Outcome::Moved { from, to } => {
                    prop_assert_eq!(from, before.phase);
                    prop_assert_ne!(from, to);
                    prop_assert_eq!(p.history.last().map(|h| (h.phase, h.at)), Some((to, at)));
                    // Deleted is final.
                    prop_assert_ne!(from, Phase::Deleted);
                    // Failed leaves only to Deprovisioning, on a delete.
                    if from == Phase::Failed {
                        prop_assert_eq!(to, Phase::Deprovisioning);
                        prop_assert_eq!(obs, &Observation::DeleteRequested);
                    }
                    // Deleted only from Deprovisioning, only on SubstrateGone, only after a delete.
                    if to == Phase::Deleted {
                        prop_assert_eq!(from, Phase::Deprovisioning);
                        prop_assert_eq!(obs, &Observation::SubstrateGone);
                        prop_assert!(seen_delete);
                    }
                    if to == Phase::Deprovisioning {
                        prop_assert_eq!(obs, &Observation::DeleteRequested);
                    }
                    // Ready means: a machine's node registered, a standalone's substrate is ready.
                    if to == Phase::Ready {
                        let want = if class == Class::Machine {
                            matches!(obs, Observation::NodeRegistered { .. })
                        } else {
                            obs == &Observation::SubstrateReady
                        };
                        prop_assert!(want);
                    }
                    prop_assert_eq!(p.reason.is_some(), to == Phase::Failed);
                    if class == Class::Standalone {
                        prop_assert_ne!(to, Phase::Enrolling);
                    }
                }
            }
            if obs == &Observation::DeleteRequested {
                seen_delete = true;
            }
        }
        // Every recorded entry but the first came from an observation that moved the phase.
        for pair in p.history.windows(2) {
            prop_assert_ne!(pair[0].phase, pair[1].phase);
        }
    }
}
