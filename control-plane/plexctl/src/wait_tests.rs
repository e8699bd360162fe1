use time::macros::datetime;

use super::*;
use crate::broker_output::HistoryView;
use crate::client::tests::{base, http, lab, runtime};

fn entry(phase: &str, observed: &str, at: OffsetDateTime) -> HistoryView {
    HistoryView {
        phase: phase.to_owned(),
        observed: observed.to_owned(),
        at,
    }
}

/// The provisioning object after the first `n` of the tutorial's bucket transitions.
fn bucket(n: usize) -> ProvisioningView {
    let all = [
        entry(
            "Pending",
            "the declaration was accepted",
            datetime!(2026-11-30 14:31:02 UTC),
        ),
        entry(
            "Provisioning",
            "the substrate accepted the composite",
            datetime!(2026-11-30 14:31:12 UTC),
        ),
        entry(
            "Ready",
            "the substrate reported the bucket ready",
            datetime!(2026-11-30 14:33:12 UTC),
        ),
    ];
    let history: Vec<HistoryView> = all[..n].to_vec();
    let last = history[n - 1].clone();
    ProvisioningView {
        phase: last.phase,
        reason: None,
        observed_at: last.at,
        history,
    }
}

#[test]
fn the_first_poll_shows_the_current_phase() {
    assert_eq!(
        phase_lines(None, &bucket(1)),
        ["14:31:02 Pending (the declaration was accepted)"]
    );
    // A resource already far along shows where it is, not its whole life.
    assert_eq!(
        phase_lines(None, &bucket(3)),
        ["14:33:12 Ready (the substrate reported the bucket ready)"]
    );
}

#[test]
fn later_polls_show_every_transition_since_the_previous_one() {
    assert!(phase_lines(Some(&bucket(1)), &bucket(1)).is_empty());
    assert_eq!(
        phase_lines(Some(&bucket(1)), &bucket(2)),
        ["14:31:12 Provisioning (the substrate accepted the composite)"]
    );
    // Two transitions between polls: neither is lost.
    assert_eq!(
        phase_lines(Some(&bucket(1)), &bucket(3)),
        [
            "14:31:12 Provisioning (the substrate accepted the composite)",
            "14:33:12 Ready (the substrate reported the bucket ready)",
        ]
    );
}

#[test]
fn without_history_a_phase_change_is_still_shown_with_the_reason() {
    let before = ProvisioningView {
        phase: "Provisioning".into(),
        reason: None,
        observed_at: datetime!(2026-11-30 14:31:12 UTC),
        history: Vec::new(),
    };
    let failed = ProvisioningView {
        phase: "Failed".into(),
        reason: Some("cloud-init reported an error".into()),
        // Not UTC: the line is in UTC.
        observed_at: datetime!(2026-11-30 16:40:05 +02:00),
        history: Vec::new(),
    };
    assert_eq!(
        phase_lines(Some(&before), &failed),
        ["14:40:05 Failed (cloud-init reported an error)"]
    );
    assert!(phase_lines(Some(&before), &before).is_empty());
    assert_eq!(phase_lines(None, &before), ["14:31:12 Provisioning"]);
}

#[test]
fn verdicts_per_goal() {
    assert_eq!(verdict(Goal::Ready, &bucket(2)), Verdict::Continue);
    assert_eq!(verdict(Goal::Ready, &bucket(3)), Verdict::Reached);
    assert_eq!(verdict(Goal::Deleted, &bucket(3)), Verdict::Continue);
    let mut p = bucket(2);
    p.phase = "Failed".into();
    p.reason = Some("the substrate refused: quota exceeded".into());
    assert_eq!(
        verdict(Goal::Ready, &p),
        Verdict::Failed("the substrate refused: quota exceeded".into())
    );
    assert_eq!(
        verdict(Goal::Deleted, &p),
        Verdict::Failed("the substrate refused: quota exceeded".into())
    );
    p.phase = "Deleted".into();
    assert_eq!(verdict(Goal::Deleted, &p), Verdict::Reached);
    assert_eq!(
        verdict(Goal::Ready, &p),
        Verdict::Failed("it was deleted".into())
    );
}

const ID: &str = "019fb9d7-fb6c-7681-a082-07407e041cc0";

fn resource_json(phases: &[(&str, &str, &str)], reason: Option<&str>) -> String {
    let history: Vec<serde_json::Value> = phases
        .iter()
        .map(|(phase, observed, at)| serde_json::json!({"phase": phase, "observed": observed, "at": at}))
        .collect();
    let (phase, _, at) = phases[phases.len() - 1];
    serde_json::json!({
        "id": ID,
        "project_id": "019a0816-0000-7000-8000-000000000001",
        "kind": "bucket",
        "origin": "provisioned",
        "provisioning": {"phase": phase, "reason": reason, "observed_at": at, "history": history},
        "node_id": null,
        "created_at": "2026-11-30T14:31:02Z"
    })
    .to_string()
}

#[test]
fn watch_follows_a_scripted_server_to_ready() {
    let p = (
        "Pending",
        "the declaration was accepted",
        "2026-11-30T14:31:02Z",
    );
    let v = (
        "Provisioning",
        "the substrate accepted the composite",
        "2026-11-30T14:31:12Z",
    );
    let r = (
        "Ready",
        "the substrate reported it ready",
        "2026-11-30T14:33:12Z",
    );
    let answers = [
        resource_json(&[p], None),
        resource_json(&[p], None),
        resource_json(&[p, v], None),
        resource_json(&[p, v, r], None),
    ];
    let lab = lab(&["127.0.0.1"]);
    let (addr, requests) = lab.serve_each(answers.iter().map(|b| http("200 OK", b)).collect());
    let api = Api::new(base(addr), None, Some(&lab.ca_file())).unwrap();
    let mut lines = Vec::new();
    let ended = runtime()
        .block_on(watch(
            &api,
            Uuid::parse_str(ID).unwrap(),
            None,
            Goal::Ready,
            Duration::from_millis(5),
            Duration::from_secs(60),
            &mut lines,
        ))
        .unwrap();
    assert!(matches!(ended, Ended::Reached(ref r) if r.view.provisioning.phase == "Ready"));
    assert_eq!(
        String::from_utf8(lines).unwrap(),
        "14:31:02 Pending (the declaration was accepted)\n\
         14:31:12 Provisioning (the substrate accepted the composite)\n\
         14:33:12 Ready (the substrate reported it ready)\n"
    );
    for _ in 0..answers.len() {
        let request = requests.recv().unwrap().to_ascii_lowercase();
        assert!(
            request.starts_with(&format!("get /v1/resources/{ID} http/1.1\r\n")),
            "{request}"
        );
    }
}

#[test]
fn watch_stops_at_failed_with_the_reason_and_times_out_when_nothing_settles() {
    let d = (
        "Deprovisioning",
        "a delete was requested",
        "2026-11-30T15:00:00Z",
    );
    let f = ("Failed", "the substrate failed", "2026-11-30T15:00:09Z");
    let lab = lab(&["127.0.0.1"]);
    let failing = resource_json(&[d, f], Some("the substrate failed: volume busy"));
    let (addr, _) = lab.serve_each(vec![http("200 OK", &failing)]);
    let api = Api::new(base(addr), None, Some(&lab.ca_file())).unwrap();
    let first: Resource = serde_json::from_str(&resource_json(&[d], None)).unwrap();
    let mut lines = Vec::new();
    let id = Uuid::parse_str(ID).unwrap();
    let ended = runtime()
        .block_on(watch(
            &api,
            id,
            Some(first.clone()),
            Goal::Deleted,
            Duration::from_millis(5),
            Duration::from_secs(60),
            &mut lines,
        ))
        .unwrap();
    assert!(
        matches!(ended, Ended::Failed(_, ref reason) if reason == "the substrate failed: volume busy")
    );
    assert_eq!(
        String::from_utf8(lines).unwrap(),
        "15:00:00 Deprovisioning (a delete was requested)\n15:00:09 Failed (the substrate failed)\n"
    );
    // A timeout shorter than the poll interval: one look, no request, then TimedOut.
    let mut lines = Vec::new();
    let ended = runtime()
        .block_on(watch(
            &api,
            id,
            Some(first),
            Goal::Deleted,
            Duration::from_secs(3600),
            Duration::from_secs(1),
            &mut lines,
        ))
        .unwrap();
    assert!(
        matches!(ended, Ended::TimedOut(ref r) if r.view.provisioning.phase == "Deprovisioning")
    );
    assert_eq!(
        String::from_utf8(lines).unwrap(),
        "15:00:00 Deprovisioning (a delete was requested)\n"
    );
}
