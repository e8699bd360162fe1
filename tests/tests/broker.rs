//! The broker end to end, with real machines (root): `plexctl resource create --wait` walks a
//! node resource through Pending, Provisioning, Enrolling and Ready; inside, cloud-init is done,
//! the lab CA is in the system store and plexd runs under systemd; two such machines ping each
//! other over their mesh IPs; deleting one reaches Deleted, the machine is gone, and the other
//! drops it as a peer. A required parameter left out fails closed and creates nothing.
//!
//! Root only; it fails (never skips) without root or the machine tools.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use plexsphere_e2e::broker::{BrokerLab, json};
use plexsphere_e2e::machines::preflight;
use plexsphere_e2e::{OPENSTACK_PROJECT, wait_until};

const BOUND: Duration = Duration::from_secs(180);

/// Runs a command inside the machine of a resource.
fn in_machine(lab: &BrokerLab, resource_id: &str, argv: &[&str]) -> String {
    let m = lab.machine(resource_id).unwrap();
    let out = m.exec(argv).unwrap();
    assert!(
        out.status.success(),
        "{argv:?} in {}: {}",
        m.name(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn broker_machines_enrol_mesh_and_are_deleted() {
    preflight().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let bridge = format!("plxbk{}", std::process::id() % 10000);
    let lab = BrokerLab::start(&tmp.path().join("cp"), &bridge, "172.30.242.1").unwrap();
    let cp = &lab.cp;
    let create = |params: &str| lab.create(params, &["--wait", "--timeout", "10m"]).unwrap();

    // A required parameter left out fails closed: a 4xx naming it, and nothing is created.
    let refused = create("{}");
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("release") && err.contains("invalid_parameters"),
        "{err}"
    );
    let list = json(
        &cp.plexctl_ok(&[
            "resource",
            "list",
            "--project-id",
            OPENSTACK_PROJECT,
            "--output",
            "json",
        ])
        .unwrap(),
    )
    .unwrap();
    assert_eq!(list.as_array().unwrap().len(), 0, "no resource was stored");
    assert!(
        plexsphere_nspawn::Machine::list(&cp.data_dir.join("nspawn"))
            .map(|l| l.is_empty())
            .unwrap_or(true),
        "no machine was created"
    );

    // Two machines through the broker; --wait prints each phase as it is observed.
    let mut machines = Vec::new();
    for _ in 0..2 {
        let out = create(r#"{"release":"bookworm"}"#);
        let phases = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{phases}");
        eprintln!("--- plexctl resource create --wait:\n{phases}");
        let order: Vec<usize> = ["Pending", "Provisioning", "Enrolling", "Ready"]
            .iter()
            .map(|p| phases.find(p).unwrap_or_else(|| panic!("{p} in {phases}")))
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "in order: {phases}");
        let r = json(&String::from_utf8_lossy(&out.stdout)).unwrap();
        assert_eq!(r["provisioning"]["phase"], "Ready");
        machines.push((
            r["id"].as_str().unwrap().to_owned(),
            r["node_id"].as_str().unwrap().to_owned(),
        ));
    }

    let mut mesh_ips = Vec::new();
    for (rid, node_id) in &machines {
        let status = in_machine(&lab, rid, &["cloud-init", "status", "--long"]);
        assert!(status.contains("status: done"), "{status}");
        assert!(!status.to_lowercase().contains("error"), "{status}");
        // The lab CA is in the machine's system store.
        let ca = std::fs::read_to_string(cp.ca_file()).unwrap();
        let body: String = ca.lines().filter(|l| !l.starts_with("-----")).collect();
        let bundle = in_machine(&lab, rid, &["cat", "/etc/ssl/certs/ca-certificates.crt"]);
        let bundle: String = bundle.lines().filter(|l| !l.starts_with("-----")).collect();
        assert!(bundle.contains(&body), "the lab CA is in the system bundle");
        let journal = wait_until(BOUND, "plexd's journal shows the event stream", || {
            let j = in_machine(
                &lab,
                rid,
                &["journalctl", "-u", "plexd", "--no-pager", "-o", "cat"],
            );
            Ok(j.contains("event stream connected").then_some(j))
        })
        .unwrap();
        assert!(journal.contains(node_id.as_str()), "{journal}");
        // plexd join ran from cloud-init: its two lines are in the machine's console log.
        let console = std::fs::read_to_string(lab.machine_dir(rid).join("console.log")).unwrap();
        assert!(
            console.contains(&format!("node_id: {node_id}")),
            "{console}"
        );
        assert!(console.contains("mesh_ip: 10.64.1."), "{console}");
        eprintln!("--- journalctl -u plexd in {rid}:\n{journal}");
        mesh_ips.push(
            cp.node(node_id).unwrap()["mesh_ip"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }

    // The two machines reach each other over their mesh IPs.
    for (i, (rid, _)) in machines.iter().enumerate() {
        let other = &mesh_ips[1 - i];
        wait_until(BOUND, "a ping over the mesh", || {
            let out = lab
                .machine(rid)?
                .exec(&["ping", "-c", "1", "-W", "2", other])?;
            Ok(out.status.success().then_some(()))
        })
        .unwrap();
    }

    let status = in_machine(
        &lab,
        &machines[0].0,
        &["plexd", "status", "--output", "json"],
    );
    eprintln!("--- plexd status --output json in the first machine:\n{status}");
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    let peer = &v["peers"][0];
    assert_eq!(peer["mesh_ip"], mesh_ips[1].as_str());
    assert!(peer["rx_bytes"].as_u64().unwrap() > 0, "{status}");

    // Delete the first: Deleted, the machine is gone, the second no longer lists it.
    let (gone_rid, gone_node) = &machines[0];
    let r = lab.delete(gone_rid).unwrap();
    assert_eq!(r["provisioning"]["phase"], "Deleted");
    assert!(
        !lab.machine_dir(gone_rid).exists(),
        "the machine's directory is gone"
    );
    let (keep_rid, _) = &machines[1];
    wait_until(BOUND, "the other machine drops the deleted node", || {
        let s = in_machine(&lab, keep_rid, &["plexd", "status", "--output", "json"]);
        let v: serde_json::Value = serde_json::from_str(&s)?;
        let listed = v["peers"]
            .as_array()
            .map(|p| p.iter().any(|p| p["node_id"] == gone_node.as_str()))
            .unwrap_or(true);
        Ok((!listed).then_some(()))
    })
    .unwrap();
}
