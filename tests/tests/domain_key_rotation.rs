//! Domain signing-key rotation end to end (root): the real control plane on the host and plexd
//! nodes (embedded userspace data plane) in network namespaces.
//!
//! Nodes A and B reach each other through the mesh; B's plexd is killed. The operator rotates
//! the Domain's key with a 3 s overlap (`POST /v1/domains/{domain}/signing-keys`): A, online,
//! finds the next key announced in its signed state and keeps it in its identity file; after
//! the overlap documents are signed by the new key, A promotes it (its identity pins the new
//! key, no next key) and applies what the new key signs: node C joins and A reaches C. Then B
//! starts again: it never saw the announcement, so the first state it pulls is signed by a key
//! it does not know; it fetches the key chain, follows it from its pinned key, pins the new
//! key and reaches A and C.
//!
//! That a state signed by a key nobody announced is refused (and the node keeps its last good
//! state) is shown without a control plane by plexd's core tests
//! (`agent/src/daemon/core/tests/domain_keys.rs`) and `agent/tests/run.rs`.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use plexsphere_e2e::netns::{self, Lab};
use plexsphere_e2e::{ControlPlane, Host, Proc, wait_until};

const BOUND: Duration = Duration::from_secs(45);
/// The rotation's overlap: short, so the test does not wait long for the new key to sign.
const OVERLAP_SECS: u64 = 3;

fn config_extra(iface: &str) -> String {
    format!(
        "wireguard:\n  backend: userspace\n  interface: {iface}\ndaemon:\n  backoff_initial_ms: 200\n  backoff_cap_secs: 2\n  intervals:\n    heartbeat_secs: 1\n    endpoint_report_secs: 2\n    state_poll_secs: 2\n    ingest_secs: 1\n"
    )
}

fn node(lab: &mut Lab, cp: &ControlPlane, root: &std::path::Path) -> (String, Host, Proc) {
    let (ns, host, _) =
        netns::prepare_node(lab, cp, root, "rotate-agent-node", config_extra).unwrap();
    let proc = netns::start_daemon(&ns, &host).unwrap();
    (ns, host, proc)
}

/// The identity file as JSON.
fn identity(host: &Host) -> anyhow::Result<serde_json::Value> {
    let text = std::fs::read_to_string(host.state_dir().join("identity.json"))?;
    Ok(serde_json::from_str(&text)?)
}

fn mesh_ip(host: &Host) -> String {
    wait_until(BOUND, "the node is enrolled", || {
        Ok(Some(host.identity()?.1))
    })
    .unwrap()
}

/// Waits until one ping from `ns` to `ip` is answered.
fn reaches(ns: &str, ip: &str, what: &str, out: &dyn Fn() -> String) {
    wait_until(BOUND, what, || {
        let o = netns::exec(ns, "ping", &["-c", "1", "-W", "1", ip])?;
        Ok(o.status.success().then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", out()));
}

/// `POST /v1/domains/{domain}/signing-keys` as the operator (the token `plexsphere dev` wrote).
fn rotate(cp: &ControlPlane, domain: &str) -> serde_json::Value {
    let token = std::fs::read_to_string(cp.data_dir.join("operator-token")).unwrap();
    let url = format!(
        "{}/v1/domains/{domain}/signing-keys",
        cp.url.trim_end_matches('/')
    );
    let out = std::process::Command::new("curl")
        .args(["-sS", "--fail-with-body", "--cacert"])
        .arg(cp.ca_file())
        .args(["-X", "POST", "-H", "content-type: application/json"])
        .arg("-H")
        .arg(format!("authorization: Bearer {}", token.trim()))
        .args(["-d", &format!("{{\"overlap_secs\":{OVERLAP_SECS}}}")])
        .arg(url)
        .output()
        .unwrap();
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the rotation was refused: {body} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&body).unwrap_or(serde_json::Value::Null)
}

#[test]
fn a_rotated_domain_key_reaches_the_online_node_by_announcement_and_the_offline_one_by_the_chain() {
    let tmp = tempfile::tempdir().unwrap();
    let mut lab = Lab::new().unwrap();
    let cp = netns::start_control_plane(&tmp.path().join("cp"), lab.host_addr(), &[]).unwrap();
    let (a_ns, a, a_proc) = node(&mut lab, &cp, tmp.path());
    let (b_ns, b, b_proc) = node(&mut lab, &cp, tmp.path());
    let (a_ip, b_ip) = (mesh_ip(&a), mesh_ip(&b));
    let out = |procs: &[&Proc]| {
        let mut s = String::new();
        for (i, p) in procs.iter().enumerate() {
            s.push_str(&format!("--- plexd {i}:\n{}\n", p.output()));
        }
        s.push_str(&format!("--- control plane:\n{}", cp.proc.output()));
        s
    };
    reaches(&a_ns, &b_ip, "A reaches B", &|| out(&[&a_proc, &b_proc]));
    reaches(&b_ns, &a_ip, "B reaches A", &|| out(&[&a_proc, &b_proc]));
    let first = identity(&a).unwrap();
    let old_key = first["domain_signing_public_key"]
        .as_str()
        .unwrap()
        .to_owned();
    let domain = first["domain_id"].as_str().unwrap().to_owned();
    assert!(first["next_signing_key"].is_null(), "{first}");

    // B goes away for the whole overlap (SIGKILL: nothing is written on the way out).
    drop(b_proc);

    let answer = rotate(&cp, &domain);
    // A learns the next key from its signed state and keeps it.
    let next = wait_until(
        BOUND,
        "A's identity file holds the announced next key",
        || {
            Ok(identity(&a)?
                .get("next_signing_key")
                .filter(|k| !k.is_null())
                .cloned())
        },
    )
    .unwrap_or_else(|e| panic!("{e}\nrotation answer: {answer}\n{}", out(&[&a_proc])));
    let new_key = next["public_key"].as_str().unwrap().to_owned();
    assert_ne!(new_key, old_key);
    let generation = next["generation"].as_u64().unwrap();

    // After the overlap the new key signs: C joins, A applies it (signed by the new key) and
    // has promoted the key.
    let (c_ns, c, c_proc) = node(&mut lab, &cp, tmp.path());
    let c_ip = mesh_ip(&c);
    reaches(
        &a_ns,
        &c_ip,
        "A reaches C, who joined after the rotation",
        &|| out(&[&a_proc, &c_proc]),
    );
    reaches(&c_ns, &a_ip, "C reaches A", &|| out(&[&a_proc, &c_proc]));
    let promoted = wait_until(BOUND, "A pins the new key", || {
        let id = identity(&a)?;
        Ok((id["domain_signing_public_key"] == new_key.as_str()
            && id["next_signing_key"].is_null())
        .then_some(id))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", out(&[&a_proc])));
    assert_eq!(
        promoted["domain_signing_key_generation"].as_u64(),
        Some(generation),
        "{promoted}"
    );
    let status = a.status().unwrap().unwrap();
    assert_eq!(
        status["domain_key"]["generation"].as_u64(),
        Some(generation),
        "{status}"
    );
    assert!(
        a_proc
            .output()
            .contains("the Domain's signing key moved from generation")
    );

    // B comes back: still pinned to the old key, it follows the chain to the new one.
    assert_eq!(
        identity(&b).unwrap()["domain_signing_public_key"],
        old_key.as_str()
    );
    let b_proc = netns::start_daemon(&b_ns, &b).unwrap();
    let all = || out(&[&a_proc, &b_proc, &c_proc]);
    wait_until(BOUND, "B follows the key chain to the new key", || {
        let id = identity(&b)?;
        Ok((id["domain_signing_public_key"] == new_key.as_str()).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", all()));
    assert!(
        b_proc.output().contains("followed the Domain's key chain"),
        "{}",
        all()
    );
    reaches(&b_ns, &a_ip, "B reaches A after the chain", &all);
    reaches(
        &b_ns,
        &c_ip,
        "B reaches C, who joined while it was away",
        &all,
    );
    reaches(&c_ns, &b_ip, "C reaches B", &all);
}
