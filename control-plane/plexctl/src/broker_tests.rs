use std::io::IsTerminal as _;

use super::*;
use crate::client::tests::{base, http, lab, runtime};
use crate::config::{Layer, resolve};
use crate::secret::Secret;

const PROJECT: &str = "019a0816-0000-7000-8000-000000000001";
const BLUEPRINT: &str = "5b2f0c6e-0000-5000-8000-00000000b00c";
const CREDENTIAL: &str = "019a0816-0000-7000-8000-0000000000cc";
const ID: &str = "019fb9d7-fb6c-7681-a082-07407e041cc0";

fn msg(r: Result<impl std::fmt::Debug, Failure>) -> (u8, String) {
    match r {
        Ok(v) => panic!("expected a failure, got {v:?}"),
        Err(e) => (e.exit_code(), e.to_string()),
    }
}

fn no_wait() -> WaitArgs {
    WaitArgs {
        wait: false,
        poll_interval: "1s".into(),
        timeout: "15m".into(),
    }
}

#[test]
fn create_request_is_built_from_checked_arguments() {
    let r = create_request("bucket", BLUEPRINT, CREDENTIAL, r#"{"region":"us-east-1"}"#).unwrap();
    assert_eq!(
        serde_json::to_string(&r).unwrap(),
        format!(
            r#"{{"kind":"bucket","blueprint_version_id":"{BLUEPRINT}","cloud_credential_id":"{CREDENTIAL}","parameters":{{"region":"us-east-1"}}}}"#
        )
    );
    assert_eq!(
        msg(create_request(
            "bucket",
            BLUEPRINT,
            CREDENTIAL,
            r#"["region"]"#
        )),
        (
            64,
            r#"--parameters must be a JSON object, e.g. '{"region":"us-east-1"}'"#.into()
        )
    );
    let (code, text) = msg(create_request("bucket", BLUEPRINT, CREDENTIAL, "region=x"));
    assert_eq!(code, 64);
    assert!(
        text.starts_with("--parameters is not valid JSON ("),
        "{text}"
    );
    assert_eq!(
        msg(create_request("bucket", "v1", CREDENTIAL, "{}")),
        (
            64,
            "--blueprint-version-id `v1` is not an id; ids are UUIDs, see `plexctl blueprint list`"
                .into()
        )
    );
    let (_, text) = msg(create_request("bucket", BLUEPRINT, "lab", "{}"));
    assert!(text.contains("plexctl cloud-credential list"), "{text}");
    let (code, text) = msg(create_request(" ", BLUEPRINT, CREDENTIAL, "{}"));
    assert_eq!(code, 64);
    assert!(text.starts_with("--kind is empty"), "{text}");
}

#[test]
fn credential_request_checks_provider_and_payload_and_hides_it() {
    let given = |text: &str| {
        payload_of(&PayloadArgs {
            payload: Some(text.to_owned()),
            payload_file: None,
            clouds_yaml: None,
            cloud: None,
        })
    };
    let r = credential_request(
        "lab",
        "openstack",
        given(r#"{"password":"hunter2"}"#).unwrap(),
    )
    .unwrap();
    assert_eq!(
        serde_json::to_string(&r).unwrap(),
        r#"{"name":"lab","provider":"openstack","payload":{"password":"hunter2"}}"#
    );
    assert!(!format!("{r:?}").contains("hunter2"));
    let empty = credential_request("lab", "local", None).unwrap();
    assert_eq!(
        serde_json::to_string(&empty).unwrap(),
        r#"{"name":"lab","provider":"local","payload":{}}"#
    );
    assert_eq!(
        msg(credential_request("lab", "aws", None)),
        (
            64,
            "--provider `aws` is not a provider; use local or openstack".into()
        )
    );
    // A payload that is not an object is refused without echoing it.
    let (code, text) = msg(given(r#""hunter2""#));
    assert_eq!(code, 64);
    assert!(!text.contains("hunter2"), "{text}");
    let (_, text) = msg(given("hunter2"));
    assert!(!text.contains("hunter2"), "{text}");
}

#[test]
fn wait_flags_are_checked_only_with_wait() {
    assert_eq!(wait_settings(&no_wait()).unwrap(), None);
    let mut args = no_wait();
    args.wait = true;
    assert_eq!(
        wait_settings(&args).unwrap(),
        Some((Duration::from_secs(1), Duration::from_secs(900)))
    );
    args.poll_interval = "0s".into();
    assert_eq!(
        msg(wait_settings(&args)),
        (
            64,
            "--poll-interval `0s` is zero; give a duration like 1s, 30s or 15m".into()
        )
    );
    args.poll_interval = "1s".into();
    args.timeout = "15".into();
    let (code, text) = msg(wait_settings(&args));
    assert_eq!(code, 64);
    assert!(text.starts_with("--timeout: "), "{text}");
}

#[test]
fn wait_failures_exit_1_and_timeouts_exit_2() {
    assert_eq!(Failure::ResourceFailed("x".into()).exit_code(), 1);
    assert_eq!(Failure::WaitTimedOut("x".into()).exit_code(), 2);
}

#[test]
fn the_command_line_parses_the_broker_commands() {
    use clap::Parser as _;

    use crate::cli::{Cli, Command};
    let cli = Cli::try_parse_from([
        "plexctl",
        "resource",
        "create",
        "--project-id",
        PROJECT,
        "--kind",
        "bucket",
        "--blueprint-version-id",
        BLUEPRINT,
        "--cloud-credential-id",
        CREDENTIAL,
        "--parameters",
        r#"{"region":"us-east-1"}"#,
        "--output",
        "json",
        "--wait",
        "--timeout",
        "5m",
    ])
    .unwrap();
    assert!(matches!(
        cli.command,
        Command::Resource(ResourceCommand::Create { ref wait, .. })
            if wait.wait && wait.timeout == "5m" && wait.poll_interval == "1s"
    ));
    // --timeout and --poll-interval only mean something with --wait.
    assert!(Cli::try_parse_from(["plexctl", "resource", "get", ID, "--timeout", "5m"]).is_err());
    assert!(Cli::try_parse_from(["plexctl", "resource", "delete", ID, "--yes", "--wait"]).is_ok());
    assert!(
        Cli::try_parse_from([
            "plexctl",
            "cloud-credential",
            "create",
            "--name",
            "lab",
            "--provider",
            "local",
            "--payload",
            "{}",
            "--payload-file",
            "p.json"
        ])
        .is_err()
    );
    assert!(Cli::try_parse_from(["plexctl", "blueprint", "list"]).is_ok());
}

fn settings_for(addr: std::net::SocketAddr, ca: std::path::PathBuf) -> Settings {
    let flags = Layer {
        server: Some(base(addr).to_string()),
        token: Some(Secret::new(format!(
            "pxop_0123456789abcdef_{}",
            "A".repeat(43)
        ))),
        token_file: None,
        ca_file: Some(ca),
    };
    resolve(flags, Layer::default(), None, "test".into()).unwrap()
}

fn resource_json(phase: &str) -> String {
    serde_json::json!({
        "id": ID, "project_id": PROJECT, "kind": "bucket", "origin": "provisioned",
        "blueprint_version_id": BLUEPRINT, "cloud_credential_id": CREDENTIAL,
        "parameters": {"region": "us-east-1"},
        "provisioning": {"phase": phase, "reason": null, "observed_at": "2026-11-30T14:31:02Z",
                         "history": [{"phase": phase, "observed": "seen", "at": "2026-11-30T14:31:02Z"}]},
        "node_id": null, "created_at": "2026-11-30T14:31:02Z"
    })
    .to_string()
}

#[test]
fn create_posts_the_checked_body_and_waits_to_ready() {
    let lab = lab(&["127.0.0.1"]);
    let (addr, requests) = lab.serve_each(vec![
        http("202 Accepted", &resource_json("Pending")),
        http("200 OK", &resource_json("Ready")),
    ]);
    let settings = settings_for(addr, lab.ca_file());
    let mut wait = no_wait();
    wait.wait = true;
    let cmd = ResourceCommand::Create {
        project_id: Some(PROJECT.into()),
        kind: "bucket".into(),
        blueprint_version_id: BLUEPRINT.into(),
        cloud_credential_id: CREDENTIAL.into(),
        parameters: r#"{"region":"us-east-1"}"#.into(),
        wait,
    };
    let printed = runtime()
        .block_on(resources(&cmd, Format::Json, &settings))
        .unwrap();
    let printed: Value = serde_json::from_str(&printed).unwrap();
    assert_eq!(printed["id"], ID);
    assert_eq!(printed["provisioning"]["phase"], "Ready");
    let post = requests.recv().unwrap();
    let lower = post.to_ascii_lowercase();
    assert!(
        lower.starts_with(&format!(
            "post /v1/projects/{PROJECT}/resources http/1.1\r\n"
        )),
        "{post}"
    );
    assert!(
        post.ends_with(&format!(
            "\r\n\r\n{{\"kind\":\"bucket\",\"blueprint_version_id\":\"{BLUEPRINT}\",\"cloud_credential_id\":\"{CREDENTIAL}\",\"parameters\":{{\"region\":\"us-east-1\"}}}}"
        )),
        "{post}"
    );
    let get = requests.recv().unwrap().to_ascii_lowercase();
    assert!(
        get.starts_with(&format!("get /v1/resources/{ID} http/1.1\r\n")),
        "{get}"
    );
}

#[test]
fn a_refused_parameter_is_the_servers_one_line_and_exit_1() {
    let lab = lab(&["127.0.0.1"]);
    let body = r#"{"code":"invalid_parameters","message":"the parameter region is required"}"#;
    let (addr, _) = lab.serve_each(vec![http("422 Unprocessable Entity", body)]);
    let settings = settings_for(addr, lab.ca_file());
    let cmd = ResourceCommand::Create {
        project_id: Some(PROJECT.into()),
        kind: "bucket".into(),
        blueprint_version_id: BLUEPRINT.into(),
        cloud_credential_id: CREDENTIAL.into(),
        parameters: "{}".into(),
        wait: no_wait(),
    };
    assert_eq!(
        msg(runtime().block_on(resources(&cmd, Format::Table, &settings))),
        (
            1,
            "the parameter region is required (invalid_parameters, HTTP 422)".into()
        )
    );
}

#[test]
fn delete_sends_delete_with_yes_and_refuses_without_a_terminal() {
    let lab = lab(&["127.0.0.1"]);
    let (addr, requests) = lab.serve_each(vec![
        http("202 Accepted", &resource_json("Deprovisioning")),
        http("200 OK", &resource_json("Ready")),
    ]);
    let settings = settings_for(addr, lab.ca_file());
    let cmd = ResourceCommand::Delete {
        id: ID.into(),
        yes: true,
        wait: no_wait(),
    };
    let printed = runtime()
        .block_on(resources(&cmd, Format::Table, &settings))
        .unwrap();
    assert!(
        printed.contains("phase:              Deprovisioning\n"),
        "{printed}"
    );
    let head = requests.recv().unwrap().to_ascii_lowercase();
    assert!(
        head.starts_with(&format!("delete /v1/resources/{ID} http/1.1\r\n")),
        "{head}"
    );
    if std::io::stdin().is_terminal() {
        return;
    }
    let cmd = ResourceCommand::Delete {
        id: ID.into(),
        yes: false,
        wait: no_wait(),
    };
    assert_eq!(
        msg(runtime().block_on(resources(&cmd, Format::Table, &settings))),
        (
            64,
            format!(
                "refusing to delete resource {ID} without confirmation: stdin is not a terminal; pass --yes"
            )
        )
    );
    let head = requests.recv().unwrap().to_ascii_lowercase();
    assert!(
        head.starts_with(&format!("get /v1/resources/{ID} ")),
        "{head}"
    );
}

#[test]
fn a_payload_file_over_the_cap_is_refused_before_anything_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    // A JSON object the server would take, one byte over the cap.
    let over = dir.path().join("big.json");
    let filler = crate::clouds_yaml::MAX_FILE as usize + 1 - r#"{"k":""}"#.len();
    std::fs::write(&over, format!(r#"{{"k":"{}"}}"#, "x".repeat(filler))).unwrap();
    assert_eq!(
        std::fs::metadata(&over).unwrap().len(),
        crate::clouds_yaml::MAX_FILE + 1
    );
    let lab = lab(&["127.0.0.1"]);
    let created = serde_json::json!({
        "id": CREDENTIAL, "name": "lab", "provider": "openstack",
        "created_at": "2026-11-30T14:31:02Z", "revoked_at": null
    });
    let (addr, requests) = lab.serve_each(vec![http("201 Created", &created.to_string())]);
    let settings = settings_for(addr, lab.ca_file());
    let create = |path: &std::path::Path| CredentialCommand::Create {
        name: "lab".into(),
        provider: "openstack".into(),
        payload: PayloadArgs {
            payload: None,
            payload_file: Some(path.to_owned()),
            clouds_yaml: None,
            cloud: None,
        },
    };
    let (code, text) =
        msg(runtime().block_on(credentials(&create(&over), Format::Table, &settings)));
    assert_eq!(code, 64);
    assert_eq!(
        text,
        format!(
            "--payload-file {} is 1048577 bytes; at most 1048576 bytes (1 MiB) are read; give a readable file holding a JSON object",
            over.display()
        )
    );
    // The refusal came before any request: the server saw none.
    assert!(requests.try_recv().is_err());

    // A file at the cap is read and sent.
    let at = dir.path().join("at.json");
    std::fs::write(&at, format!(r#"{{"k":"{}"}}"#, "x".repeat(filler - 1))).unwrap();
    runtime()
        .block_on(credentials(&create(&at), Format::Table, &settings))
        .unwrap();
    let head = requests.recv().unwrap().to_ascii_lowercase();
    assert!(head.starts_with("post /v1/cloud-credentials "), "{head}");
}
