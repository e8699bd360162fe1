//! A machine whose `plexd join` is refused ends `Failed`, and its reason is plexd join's own
//! exit status and message (read from the result file join leaves in the machine), not
//! cloud-init's generic error. The unit is enabled, not started (a refused token does not fix
//! itself). Delete still walks it to `Deleted` and the machine is gone.
//!
//! The refusal is made deterministic by revoking the resource's bootstrap token (bound to it
//! by `resource_id` in `bootstrap-token list`) as soon as the broker mints it: the revoke is
//! answered before the test goes on, while the machine still has to boot (about 10 s), run
//! cloud-init and download plexd before it joins. Had join won the race, the revoke would be
//! refused (409, the token consumed) and the test would say so.
//!
//! Root only; it fails (never skips) without root or the machine tools.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use plexsphere_e2e::broker::{BrokerLab, json};
use plexsphere_e2e::machines::preflight;
use plexsphere_e2e::{OPENSTACK_PROJECT, wait_until};

const BOUND: Duration = Duration::from_secs(300);

#[test]
fn a_refused_join_fails_the_resource_with_joins_exit_and_message() {
    preflight().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let bridge = format!("plxbf{}", std::process::id() % 10000);
    let lab = BrokerLab::start(&tmp.path().join("cp"), &bridge, "172.30.243.1").unwrap();
    let cp = &lab.cp;
    let out = lab.create(r#"{"release":"bookworm"}"#, &[]).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let created = json(&String::from_utf8_lossy(&out.stdout)).unwrap();
    let rid = created["id"].as_str().unwrap().to_owned();

    // The broker mints the resource's token in its next pass; revoke it as soon as it shows.
    let token_id = wait_until(BOUND, "the broker mints the resource's token", || {
        let list = json(&cp.plexctl_ok(&[
            "bootstrap-token",
            "list",
            "--project",
            OPENSTACK_PROJECT,
            "--output",
            "json",
        ])?)?;
        Ok(list.as_array().and_then(|l| {
            l.iter()
                .find(|t| t["resource_id"] == rid.as_str())
                .and_then(|t| t["id"].as_str().map(str::to_owned))
        }))
    })
    .unwrap();
    let revoked = json(
        &cp.plexctl_ok(&["bootstrap-token", "revoke", &token_id, "--output", "json"])
            .unwrap(),
    )
    .unwrap();
    assert_eq!(revoked["status"], "revoked", "{revoked}");

    // The machine boots, cloud-init runs plexd join, the server refuses the revoked token:
    // join exits 11 and the resource fails with that, not with cloud-init's generic error.
    let r = wait_until(BOUND, "the resource reaches Failed", || {
        let r = json(&cp.plexctl_ok(&["resource", "get", &rid, "--output", "json"])?)?;
        Ok((r["provisioning"]["phase"] == "Failed").then_some(r))
    })
    .unwrap();
    eprintln!("--- plexctl resource get --output json:\n{r:#}");
    let reason = r["provisioning"]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("plexd join exited with 11: the bootstrap token in /etc/plexd/bootstrap-token was refused:"),
        "{reason}"
    );
    assert!(reason.contains("token_revoked, HTTP 403"), "{reason}");
    assert!(reason.contains("write a fresh token"), "{reason}");
    assert!(!reason.contains("cloud-init"), "{reason}");
    let history = r["provisioning"]["history"].as_array().unwrap();
    assert_eq!(history.last().unwrap()["observed"], reason, "{r:#}");
    assert!(r["node_id"].is_null(), "{r:#}");
    let nodes = json(
        &cp.plexctl_ok(&[
            "node",
            "list",
            "--project",
            OPENSTACK_PROJECT,
            "--output",
            "json",
        ])
        .unwrap(),
    )
    .unwrap();
    assert_eq!(nodes.as_array().map(Vec::len), Some(0), "{nodes:#}");

    // The result file in the machine is what the reason came from.
    let m = lab.machine(&rid).unwrap();
    let file = m
        .read_file("/run/plexd/join-result.json", 8192, Duration::from_secs(20))
        .unwrap()
        .unwrap_or_else(|| panic!("no join result file in machine {}", m.name()));
    let file = json(&String::from_utf8_lossy(&file)).unwrap();
    assert_eq!(file["exit_code"], 11, "{file}");
    assert!(
        reason.ends_with(file["message"].as_str().unwrap()),
        "{file}"
    );

    // cloud-init enabled the unit before the join but did not start it after a refusal that no
    // restart fixes (11 is in RestartPreventExitStatus=): it waits for a fresh token.
    let enabled = m.exec(&["systemctl", "is-enabled", "plexd"]).unwrap();
    assert_eq!(String::from_utf8_lossy(&enabled.stdout).trim(), "enabled");
    let active = m.exec(&["systemctl", "is-active", "plexd"]).unwrap();
    assert_eq!(String::from_utf8_lossy(&active.stdout).trim(), "inactive");

    // Failed is left only by a delete, which still walks to Deleted and removes the machine.
    let r = lab.delete(&rid).unwrap();
    assert_eq!(r["provisioning"]["phase"], "Deleted", "{r:#}");
    assert!(
        !lab.machine_dir(&rid).exists(),
        "the machine's directory is gone"
    );
    assert!(!m.is_running(), "the machine no longer runs");
}
