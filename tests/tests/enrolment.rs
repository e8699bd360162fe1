//! Enrolment end to end, across processes: `plexsphere dev` (real TLS from its generated lab CA,
//! a real SQLite file), `plexctl` issuing tokens, and `plexd install` + `plexd join` in a
//! temporary host root.

use plexsphere_e2e::{ControlPlane, Host, LAB_NODES_PROJECT, OPENSTACK_PROJECT, mode};

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}
fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The two lines `plexd join` prints, as (node_id, mesh_ip).
fn identity_lines(out: &str) -> (String, String) {
    let mut node = None;
    let mut ip = None;
    for line in out.lines() {
        if let Some(v) = line.strip_prefix("node_id: ") {
            node = Some(v.to_owned());
        }
        if let Some(v) = line.strip_prefix("mesh_ip: ") {
            ip = Some(v.to_owned());
        }
    }
    (node.expect("a node_id: line"), ip.expect("a mesh_ip: line"))
}

#[test]
fn install_join_rejoin_and_a_consumed_token() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_dev(&tmp.path().join("cp")).unwrap();
    let token = cp.issue_token(OPENSTACK_PROJECT).unwrap();
    assert!(token.starts_with("pxbt_lab_node_"), "{token}");

    // The runbook: token file, install, the operator's registration keys, then join.
    let host = Host::new(&tmp.path().join("host-a")).unwrap();
    host.write_token(&token).unwrap();
    let ca = cp.ca_file();
    let out = host.install(&cp.url, Some(&ca)).unwrap();
    assert!(out.status.success(), "install: {}", stderr(&out));
    assert_eq!(mode(&host.etc()).unwrap(), 0o700);
    assert!(host.unit_dir().join("plexd.service").is_file());
    let mut config = std::fs::read_to_string(host.config()).unwrap();
    config.push_str(&format!(
        "registration:\n  project_id: {OPENSTACK_PROJECT}\n  resource_handle: host-a\n"
    ));
    std::fs::write(host.config(), config).unwrap();

    let out = host.plexd(&["join"]).unwrap();
    assert!(out.status.success(), "join: {}", stderr(&out));
    let (node_id, mesh_ip) = identity_lines(&stdout(&out));
    assert!(
        mesh_ip.starts_with("10.64.1."),
        "the openstack sub-range: {mesh_ip}"
    );

    // The identity and the key are saved 0600 in a 0700 state dir; the token file is gone.
    assert_eq!(mode(&host.state_dir()).unwrap() & 0o077, 0);
    assert_eq!(
        mode(&host.state_dir().join("identity.json")).unwrap(),
        0o600
    );
    assert_eq!(
        mode(&host.state_dir().join("wireguard.key")).unwrap(),
        0o600
    );
    assert!(
        !host.token_file().exists(),
        "the consumed token file is removed"
    );
    let identity = std::fs::read_to_string(host.state_dir().join("identity.json")).unwrap();
    assert!(!identity.contains(&token), "the token is not kept");

    // A second join on the enrolled node prints the same identity without a token.
    let again = host.plexd(&["join"]).unwrap();
    assert!(again.status.success(), "second join: {}", stderr(&again));
    assert_eq!(
        identity_lines(&stdout(&again)),
        (node_id.clone(), mesh_ip.clone())
    );

    // The operator sees the node and the consumed token, with the node that consumed it.
    let nodes = cp
        .plexctl_ok(&["node", "list", "--output", "json"])
        .unwrap();
    assert!(nodes.contains(&node_id), "{nodes}");
    let tokens = cp
        .plexctl_ok(&["bootstrap-token", "list", "--project", OPENSTACK_PROJECT])
        .unwrap();
    let row = tokens
        .lines()
        .find(|l| l.contains("consumed"))
        .unwrap_or_else(|| panic!("a consumed token row in:\n{tokens}"));
    assert!(row.contains(&node_id), "{row}");

    // Another host (another WireGuard key) with the same token is refused: token_consumed.
    let other = Host::new(&tmp.path().join("host-b")).unwrap();
    other.write_token(&token).unwrap();
    let out = other.install(&cp.url, Some(&ca)).unwrap();
    assert!(out.status.success(), "install b: {}", stderr(&out));
    let out = other.plexd(&["join"]).unwrap();
    assert_eq!(out.status.code(), Some(10), "{}", stderr(&out));
    let path = other.token_file();
    let expected = format!(
        "the bootstrap token in {p} was already used (token_consumed, HTTP 403); write a fresh token to {p} and start plexd again",
        p = path.display()
    );
    assert!(stderr(&out).contains(&expected), "{}", stderr(&out));
    assert!(
        stdout(&out).is_empty(),
        "nothing on stdout: {}",
        stdout(&out)
    );
    assert!(
        path.exists(),
        "a refused token file is left for the operator"
    );
}

#[test]
fn an_untrusted_server_is_refused_until_its_ca_is_given() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_dev(&tmp.path().join("cp")).unwrap();
    let token = cp.issue_token(LAB_NODES_PROJECT).unwrap();
    let host = Host::new(&tmp.path().join("host")).unwrap();
    host.write_token(&token).unwrap();
    let out = host.install(&cp.url, None).unwrap();
    assert!(out.status.success(), "install: {}", stderr(&out));

    let out = host.plexd(&["join"]).unwrap();
    assert_eq!(out.status.code(), Some(13), "{}", stderr(&out));
    assert!(stderr(&out).contains("not trusted"), "{}", stderr(&out));
    assert!(
        host.token_file().exists(),
        "the token is kept for the next try"
    );
    // The key was generated and saved before the API was called.
    assert_eq!(
        mode(&host.state_dir().join("wireguard.key")).unwrap(),
        0o600
    );

    // The same server, trusted through --ca-file, takes the same token.
    let ca = cp.ca_file();
    let out = host.install(&cp.url, Some(&ca)).unwrap();
    assert!(out.status.success(), "install with ca: {}", stderr(&out));
    let out = host.plexd(&["join"]).unwrap();
    assert!(out.status.success(), "join: {}", stderr(&out));
    let (_, mesh_ip) = identity_lines(&stdout(&out));
    assert!(mesh_ip.starts_with("10.64."), "{mesh_ip}");
    assert!(
        !mesh_ip.starts_with("10.64.1."),
        "outside the openstack sub-range: {mesh_ip}"
    );
}

#[test]
fn a_corrupt_config_names_the_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let host = Host::new(&tmp.path().join("host")).unwrap();
    std::fs::create_dir_all(host.etc()).unwrap();
    std::fs::write(
        host.config(),
        "api_url: https://plexsphere.example\nregistration:\n  project_id: 42\n  resource_handel: x\n",
    )
    .unwrap();
    let out = host.plexd(&["join"]).unwrap();
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains(host.config().to_str().unwrap()), "{err}");
    assert!(
        err.contains(":3:") || err.contains(":4:"),
        "a line number: {err}"
    );
}

#[test]
fn revoked_tokens_are_refused_and_listed_as_revoked() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_dev(&tmp.path().join("cp")).unwrap();
    let issued = cp
        .plexctl_ok(&plexsphere_e2e::control_plane::issue_token_args(
            LAB_NODES_PROJECT,
        ))
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&issued).unwrap();
    let id = v["id"].as_str().unwrap().to_owned();
    let token = v["token"].as_str().unwrap().to_owned();
    cp.plexctl_ok(&["bootstrap-token", "revoke", &id]).unwrap();

    let list = cp
        .plexctl_ok(&[
            "bootstrap-token",
            "list",
            "--project",
            LAB_NODES_PROJECT,
            "--output",
            "json",
        ])
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&list).unwrap();
    let items = v.as_array().or_else(|| v["items"].as_array()).unwrap();
    let row = items.iter().find(|t| t["id"] == id.as_str()).unwrap();
    assert_eq!(row["status"], "revoked");

    let host = Host::new(&tmp.path().join("host")).unwrap();
    host.write_token(&token).unwrap();
    let ca = cp.ca_file();
    let out = host.install(&cp.url, Some(&ca)).unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let out = host.plexd(&["join"]).unwrap();
    assert_eq!(out.status.code(), Some(11), "{}", stderr(&out));
    assert!(stderr(&out).contains("token_revoked"), "{}", stderr(&out));
}

/// Issue 24, reproduced on main with `plexd join` and curl: a fleet neighbour holds the
/// group's reusable token (it sits in every machine's user data) and node v's public key (every
/// peer receives it). Right after v's join, before its daemon's first call, one registration
/// with them was answered 200 with v's node id and a new credential, and v's own credential was
/// refused for good. Now the neighbour cannot prove v's key; v keeps its credential and joins.
#[test]
fn a_neighbour_with_the_groups_token_and_vs_public_key_cannot_take_over_v_after_its_join() {
    use base64::Engine as _;
    use plexsphere_e2e::daemon::{KEEPALIVE, node, start};
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_dev_with(&tmp.path().join("cp"), KEEPALIVE).unwrap();
    let issued = cp
        .plexctl_ok(&[
            "bootstrap-token",
            "issue",
            "--project",
            LAB_NODES_PROJECT,
            "--env-prefix",
            "asg",
            "--uses",
            "5",
        ])
        .unwrap();
    let token = issued.lines().next().unwrap().trim().to_owned();
    let v = node(&cp, tmp.path(), "v", &cp.url);
    v.write_machine_id("3d1219c7c4c5404aaa1f6d2a48adfda4")
        .unwrap();
    v.write_token(&token).unwrap();
    let out = v.plexd(&["join"]).unwrap();
    assert!(out.status.success(), "join: {}", stderr(&out));
    let (node_id, _) = identity_lines(&stdout(&out));

    // v's public key, as its peers hold it.
    let private = std::fs::read_to_string(v.state_dir().join("wireguard.key")).unwrap();
    let secret: [u8; 32] = base64::engine::general_purpose::STANDARD
        .decode(private.trim())
        .unwrap()
        .try_into()
        .unwrap();
    let public = plexsphere_wire::reach::public_key(&secret).to_base64();
    let http = plexsphere_e2e::ha_client::client(&cp.ca_file()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (status, body) = rt.block_on(async {
        let r = http
            .post(format!("{}/v1/register", cp.url))
            .json(&serde_json::json!({
                "bootstrap_token": token,
                "wireguard_public_key": public,
                "hostname": "neighbour",
                "arch": "amd64",
                "plexd_version": "0.1.0",
            }))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json::<serde_json::Value>().await.unwrap())
    });
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("proof_required")),
        "{body}"
    );

    // v's daemon authenticates with its own credential and its event stream connects.
    let (_proc, status) = start(&v);
    assert_eq!(status["node_id"], node_id.as_str(), "{status}");
}
