//! `plexd join` as a real process against a real TLS server on 127.0.0.1:0.

mod support;

use support::*;

fn config_for(url: &str, extra: &str) -> String {
    format!("api_url: {url}\n{extra}")
}

#[test]
fn key_is_saved_before_the_api_is_called_and_unreachable_is_13() {
    let node = Node::new();
    let origin = dead_origin();
    node.write_config(&config_for(&origin, ""));
    node.write_token();
    // A short --max-wait: the default (300 s) of retrying an unreachable API would take the
    // test to nextest's own limit.
    let out = node.plexd(&["join", "--max-wait", "2s"]);
    assert_eq!(out.status.code(), Some(13), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("is not reachable"), "{err}");
    assert!(node.key_file().exists());
    assert_eq!(mode(&node.key_file()), 0o600);
    assert_eq!(mode(&node.state_dir()), 0o700);
    assert!(
        node.token_file().exists(),
        "the token must survive a failed join"
    );
    assert!(stdout(&out).is_empty());
}

#[test]
fn token_file_errors_are_11_and_name_the_file() {
    let node = Node::new();
    node.write_config(&config_for("https://127.0.0.1:9", ""));
    let out = node.plexd(&["join"]);
    assert_eq!(out.status.code(), Some(11), "{}", stderr(&out));
    assert!(stderr(&out).contains(&node.token_file().display().to_string()));
    assert!(
        node.key_file().exists(),
        "the key is generated before the token is read"
    );

    std::fs::write(node.token_file(), "").unwrap();
    let out = node.plexd(&["join"]);
    assert_eq!(out.status.code(), Some(11));
    assert!(stderr(&out).contains("is empty"), "{}", stderr(&out));

    std::fs::write(node.token_file(), "not-a-token\n").unwrap();
    let out = node.plexd(&["join"]);
    assert_eq!(out.status.code(), Some(11));
    assert!(
        stderr(&out).contains("does not hold a bootstrap token"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn bad_config_is_78_with_file_and_line() {
    let node = Node::new();
    node.write_config("api_url: https://a.example\nregistration:\n  project_id: nope\n");
    let out = node.plexd(&["join"]);
    assert_eq!(out.status.code(), Some(78));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("{}:3:", node.config_file().display())),
        "{err}"
    );
    assert!(err.contains("registration.project_id"), "{err}");
}

#[test]
fn untrusted_server_is_13_not_trusted() {
    let pki = TestPki::new();
    let server = TlsServer::start(&pki, Answer::json(201, REGISTERED));
    let node = Node::new();
    node.write_config(&config_for(&server.url(), ""));
    node.write_token();
    let out = node.plexd(&["join"]);
    assert_eq!(out.status.code(), Some(13), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("the API at {} is not trusted:", server.url())),
        "{err}"
    );
    assert!(
        err.contains("--ca-file") && err.contains("tls.ca_sha256"),
        "{err}"
    );
    assert!(server.requests.lock().unwrap().is_empty());
    assert!(!node.identity_file().exists());
}

#[test]
fn trusted_via_ca_file_registers_saves_identity_and_removes_token() {
    let pki = TestPki::new();
    let server = TlsServer::start(&pki, Answer::json(201, REGISTERED));
    let node = Node::new();
    let ca = node.root.path().join("lab-ca.pem");
    std::fs::write(&ca, pki.ca_pem()).unwrap();
    node.write_config(&config_for(
        &server.url(),
        "registration:\n  project_id: 019a0816-0000-7000-8000-000000000002\n  resource_handle: web-1\n",
    ));
    let token = node.write_token();
    let out = node.plexd(&["join", "--ca-file", ca.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "node_id: 019a0816-0000-7000-8000-0000000000aa\nmesh_ip: 10.64.1.2\n"
    );
    assert_eq!(mode(&node.identity_file()), 0o600);
    assert!(
        !node.token_file().exists(),
        "the used token file is removed"
    );
    let id: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(node.identity_file()).unwrap()).unwrap();
    assert_eq!(id["version"], 1);
    assert_eq!(id["mesh_cidr"], "10.64.0.0/16");
    assert_eq!(id["api_url"], server.url());

    let requests = server.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 1);
    let req: plexsphere_wire::RegisterRequest = serde_json::from_str(&requests[0]).unwrap();
    assert_eq!(req.bootstrap_token, token);
    assert_eq!(req.resource_handle.as_deref(), Some("web-1"));
    assert_eq!(req.plexd_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(req.arch, plexd::join::arch());
    assert!(!req.hostname.is_empty());
    let key = std::fs::read_to_string(node.key_file()).unwrap();
    assert!(
        !requests[0].contains(key.trim()),
        "the private key never leaves the node"
    );
    // The registration proves the key over the challenge's nonce, bound to the token.
    assert_eq!(req.nonce.as_deref(), Some("4102444800.r.t"));
    let public = plexsphere_wire::key::PublicKey::from_base64(&req.wireguard_public_key).unwrap();
    let token_id = plexsphere_wire::secret::BootstrapToken::parse(&token)
        .unwrap()
        .id;
    assert!(plexsphere_wire::proof::verify_register(
        &support::SERVER_PROOF_SECRET,
        &public,
        &token_id,
        "4102444800.r.t",
        req.proof.as_deref().unwrap(),
    ));
    assert!(
        server.lines.lock().unwrap().starts_with(&[
            "POST /v1/register/challenge".to_owned(),
            "POST /v1/register".to_owned()
        ]),
        "a challenge, then the registration"
    );

    // A second join needs no token and does not call the API.
    let again = node.plexd(&["join"]);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert_eq!(stdout(&again), stdout(&out));
    assert_eq!(server.requests.lock().unwrap().len(), 1);
}

#[test]
fn trusted_via_dropped_ca_crt() {
    let pki = TestPki::new();
    let server = TlsServer::start(&pki, Answer::json(201, REGISTERED));
    let node = Node::new();
    node.write_config(&config_for(&server.url(), ""));
    std::fs::write(node.config_dir().join("ca.crt"), pki.ca_pem()).unwrap();
    node.write_token();
    let out = node.plexd(&["join"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn trusted_via_ca_sha256_pin() {
    let pki = TestPki::new();
    let server = TlsServer::start(&pki, Answer::json(201, REGISTERED));
    let node = Node::new();
    let pin = pki.ca_fingerprint().to_lowercase();
    node.write_config(&config_for(
        &server.url(),
        &format!("tls:\n  ca_sha256: \"{pin}\"\n"),
    ));
    node.write_token();
    let out = node.plexd(&["join"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("node_id: "));

    // A pin of another CA does not trust this server.
    let other = TestPki::new();
    let node2 = Node::new();
    node2.write_config(&config_for(
        &server.url(),
        &format!("tls:\n  ca_sha256: \"{}\"\n", other.ca_fingerprint()),
    ));
    node2.write_token();
    let out = node2.plexd(&["join"]);
    assert_eq!(out.status.code(), Some(13), "{}", stderr(&out));
    assert!(stderr(&out).contains("is not trusted"));
}

#[test]
fn consumed_token_prints_the_exact_next_step_and_exits_10() {
    let pki = TestPki::new();
    let server = TlsServer::start(
        &pki,
        Answer::json(
            403,
            r#"{"code":"token_consumed","message":"the bootstrap token was already used"}"#,
        ),
    );
    let node = Node::new();
    node.write_config(&config_for(&server.url(), ""));
    std::fs::write(node.config_dir().join("ca.crt"), pki.ca_pem()).unwrap();
    node.write_token();
    let out = node.plexd(&["join"]);
    assert_eq!(out.status.code(), Some(10));
    let t = node.token_file().display().to_string();
    assert_eq!(
        stderr(&out),
        format!(
            "the bootstrap token in {t} was already used (token_consumed, HTTP 403); write a fresh token to {t} and start plexd again\n"
        )
    );
    assert!(stdout(&out).is_empty());
    assert!(node.token_file().exists());
}

#[test]
fn other_refusals_map_to_their_codes() {
    for (status, code, exit) in [
        (401, "token_expired", 11),
        (403, "project_mismatch", 11),
        (409, "mesh_range_exhausted", 14),
        (500, "internal", 14),
    ] {
        let pki = TestPki::new();
        let body = format!(r#"{{"code":"{code}","message":"m"}}"#);
        let server = TlsServer::start(&pki, Answer::json(status, &body));
        let node = Node::new();
        node.write_config(&config_for(&server.url(), ""));
        std::fs::write(node.config_dir().join("ca.crt"), pki.ca_pem()).unwrap();
        node.write_token();
        let out = node.plexd(&["join"]);
        assert_eq!(out.status.code(), Some(exit), "{code}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(&format!("({code}, HTTP {status})")),
            "{}",
            stderr(&out)
        );
    }
}

#[test]
fn rate_limited_past_the_bound_is_12() {
    let pki = TestPki::new();
    let mut answer = Answer::json(429, r#"{"code":"rate_limited","message":"slow down"}"#);
    answer.headers.push(("retry-after".into(), "1".into()));
    let server = TlsServer::start(&pki, answer);
    let node = Node::new();
    node.write_config(&config_for(&server.url(), ""));
    std::fs::write(node.config_dir().join("ca.crt"), pki.ca_pem()).unwrap();
    node.write_token();
    // 1 s + jitter < 2 s fits once into 3 s; a second wait does not always fit, so at most 3 tries.
    let out = node.plexd(&["join", "--max-wait", "3s"]);
    assert_eq!(out.status.code(), Some(12), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("429 rate_limited"),
        "{}",
        stderr(&out)
    );
    let n = server.requests.lock().unwrap().len();
    assert!((2..=4).contains(&n), "{n} attempts");
}
