use plexsphere_wire::ApiError;
use reqwest::StatusCode;
use uuid::uuid;

use super::*;
use crate::client::ClientError;
use crate::config::ConfigError;
use crate::session::{confirmed, project_by_slug, sole_project};

fn msg(r: Result<impl std::fmt::Debug, Failure>) -> (u8, String) {
    match r {
        Ok(v) => panic!("expected a failure, got {v:?}"),
        Err(e) => (e.exit_code(), e.to_string()),
    }
}

#[test]
fn issue_request_is_built_from_checked_arguments() {
    let r = issue_request("node", "lab", "1h30m", 1, None).unwrap();
    assert_eq!(
        serde_json::to_string(&r).unwrap(),
        r#"{"kind":"node","env_prefix":"lab","ttl_secs":5400}"#
    );
    assert_eq!(
        msg(issue_request("user", "lab", "1h", 1, None)),
        (
            64,
            "--kind `user` is not a token kind; the only kind is node".into()
        )
    );
    assert_eq!(
        msg(issue_request("node", "Lab_1", "1h", 1, None)),
        (
            64,
            "--env-prefix `Lab_1` must be 1-16 characters of a-z and 0-9, e.g. lab".into()
        )
    );
    assert_eq!(
        msg(issue_request("node", "lab", "0s", 1, None)),
        (
            64,
            "--ttl: the duration `0s` is zero; give a positive one, e.g. 30s or 1h".into()
        )
    );
}

#[test]
fn reusable_and_ephemeral_tokens_are_checked_before_they_are_sent() {
    let r = issue_request("node", "asg", "1h", 3, Some("30m")).unwrap();
    assert_eq!(
        serde_json::to_string(&r).unwrap(),
        r#"{"kind":"node","env_prefix":"asg","ttl_secs":3600,"max_uses":3,"ephemeral_offline_secs":1800}"#
    );
    for uses in [0, MAX_USES + 1] {
        let (code, text) = msg(issue_request("node", "asg", "1h", uses, None));
        assert_eq!(code, 64);
        assert!(
            text.starts_with(&format!("--uses {uses} is out of range")),
            "{text}"
        );
    }
    assert_eq!(
        msg(issue_request("node", "asg", "1h", 3, Some("30"))),
        (
            64,
            "--ephemeral-offline: the duration `30` has a number without a unit; add s, m, h or d (e.g. 30s)".into()
        )
    );
}

#[test]
fn token_ids_are_checked_before_they_reach_a_path() {
    assert_eq!(
        token_id(Some(" 0123456789abcdef ")).unwrap(),
        "0123456789abcdef"
    );
    for bad in [None, Some(""), Some("../nodes"), Some("pxbt_lab_node_x_y")] {
        let (code, text) = msg(token_id(bad));
        assert_eq!(code, 64);
        assert!(text.contains("is not a bootstrap token id"), "{text}");
    }
}

#[test]
fn projects_are_found_by_slug() {
    let domain_a = uuid!("019a0816-0000-7000-8000-00000000000a");
    let domain_b = uuid!("019a0816-0000-7000-8000-00000000000b");
    let project = |id, domain_id, slug: &str| ProjectView {
        id,
        domain_id,
        slug: slug.to_owned(),
        display_name: None,
        sub_range_cidr: None,
    };
    let p1 = uuid!("019a0816-0000-7000-8000-000000000001");
    let p2 = uuid!("019a0816-0000-7000-8000-000000000002");
    let p3 = uuid!("019a0816-0000-7000-8000-000000000003");
    let all = [
        project(p1, domain_a, "lab-nodes"),
        project(p2, domain_a, "shared"),
        project(p3, domain_b, "shared"),
    ];
    assert_eq!(project_by_slug(&all, "lab-nodes").unwrap(), p1);
    assert_eq!(
        msg(project_by_slug(&all, "nope")),
        (
            1,
            "no project has the id or slug `nope`; see `plexctl project list`".into()
        )
    );
    let (code, text) = msg(project_by_slug(&all, "shared"));
    assert_eq!(code, 64);
    assert!(
        text.contains(&p2.to_string()) && text.contains(&p3.to_string()),
        "{text}"
    );
    // Without --project: the one project the token sees, else a list to choose from.
    assert_eq!(sole_project(&all[..1]).unwrap(), p1);
    let (code, text) = msg(sole_project(&all));
    assert_eq!(code, 64);
    assert!(
        text.contains("pass --project")
            && text.contains("lab-nodes")
            && text.contains(&p3.to_string()),
        "{text}"
    );
    assert_eq!(msg(sole_project(&[])).0, 1);
}

#[test]
fn api_errors_print_the_one_line_form_and_exit_1() {
    let e = Failure::from(ClientError::Api {
        status: StatusCode::CONFLICT,
        error: ApiError::new("conflict", "the bootstrap token was already consumed"),
    });
    assert_eq!(e.exit_code(), 1);
    assert_eq!(
        format!("plexctl: {e}"),
        "plexctl: the bootstrap token was already consumed (conflict, HTTP 409)"
    );
}

#[test]
fn exit_codes_per_failure_kind() {
    let not_reachable = ClientError::NotReachable {
        origin: "https://127.0.0.1:1".into(),
        detail: "Connection refused".into(),
    };
    assert_eq!(Failure::from(not_reachable).exit_code(), 2);
    let no_server = ConfigError::NoServer { config: "x".into() };
    assert_eq!(Failure::from(no_server).exit_code(), 64);
    let ca = ClientError::CaFile {
        path: "/nope".into(),
        detail: "missing".into(),
    };
    assert_eq!(Failure::from(ca).exit_code(), 64);
    assert_eq!(Failure::NotFound("x".into()).exit_code(), 1);
}

#[test]
fn revoke_confirmation() {
    for yes in ["y", "Y\n", " yes \n", "YES"] {
        assert!(confirmed(yes), "{yes:?}");
    }
    for no in ["", "\n", "n", "no", "yess", "sure"] {
        assert!(!confirmed(no), "{no:?}");
    }
    // Node ids and names: names.rs's tests.
}

#[test]
fn a_rotation_overlap_is_a_duration_of_zero_to_thirty_days() {
    assert_eq!(overlap_secs("24h").unwrap(), 86_400);
    assert_eq!(overlap_secs("0s").unwrap(), 0);
    assert_eq!(overlap_secs("30d").unwrap(), MAX_OVERLAP_SECS);
    let (code, m) = msg(overlap_secs("31d"));
    assert_eq!(code, 64, "{m}");
    assert!(m.contains("longer than the 30d"), "{m}");
    let (_, m) = msg(overlap_secs("90"));
    assert!(m.contains("--overlap"), "{m}");
}
