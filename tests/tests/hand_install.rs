//! The README's hand install, followed verbatim in a fresh machine (systemd-nspawn, real
//! systemd and journald): the code blocks between `<!-- hand-install:begin -->` and
//! `<!-- hand-install:end -->` are run as written, with only the placeholders filled in and
//! `sudo ` dropped (the machine's shell is root). The token is "pasted" on stdin; the Domain
//! key is the one `plexctl domain list` shows.
//!
//! Root only; it fails (never skips) without root or the machine tools.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use plexsphere_e2e::machines::{TestBridge, TestMachine, preflight};
use plexsphere_e2e::{ControlPlane, LAB_NODES_PROJECT, readme, wait_until};

const BOUND: Duration = Duration::from_secs(120);

/// The `Nice=` of the unit plexd installs (systemd/plexd.service), as /proc shows it.
fn unit_nice() -> String {
    let unit = include_str!("../../systemd/plexd.service");
    let nice = unit
        .lines()
        .find_map(|l| l.strip_prefix("Nice="))
        .expect("systemd/plexd.service sets Nice=");
    nice.trim().to_owned()
}

#[test]
fn the_readme_hand_install_enrols_a_machine_and_a_reused_token_is_refused() {
    preflight().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let net = TestBridge::new(
        &format!("plxhi{}", std::process::id() % 10000),
        "172.30.241.1/24",
    )
    .unwrap();
    let host_ip = net.bridge.host_address().to_string();
    let cp = ControlPlane::start_dev_on(
        &tmp.path().join("cp"),
        &format!("{host_ip}:0"),
        &["--san", &host_ip],
    )
    .unwrap();
    let api = cp.url.trim_start_matches("https://").to_owned();
    let token = cp.issue_token(LAB_NODES_PROJECT).unwrap();
    // The Domain key as the operator sees it (`plexctl domain list`), not from the downloads.
    let domains: serde_json::Value = serde_json::from_str(
        &cp.plexctl_ok(&["domain", "list", "--output", "json"])
            .unwrap(),
    )
    .unwrap();
    let domain_key = domains
        .as_array()
        .and_then(|d| d.iter().find(|d| d["slug"] == "lab"))
        .and_then(|d| d["signing_public_key"].as_str())
        .unwrap_or_else(|| panic!("the lab Domain's key in {domains}"))
        .to_owned();

    let m = TestMachine::boot(
        &tmp.path().join("machines"),
        &net.bridge,
        &format!("hi{}", std::process::id() % 100000),
        10,
        "#cloud-config\n{}\n",
    )
    .unwrap();
    m.write("/root/pasted-token", &format!("{token}\n"))
        .unwrap();

    let blocks = readme::blocks("hand-install").unwrap();
    assert!(
        blocks.len() >= 5,
        "the README's hand-install blocks: {blocks:?}"
    );
    let fill = [
        ("<api>", api.as_str()),
        ("<project-id>", LAB_NODES_PROJECT),
        ("<name>", "hand-installed"),
        ("<domain-key>", domain_key.as_str()),
    ];
    for block in &blocks {
        let (text, out) = readme::run(&m, block, &fill).unwrap();
        eprintln!("--- README block ran:\n{text}--- output:\n{out}");
        // The block that checks the signature: openssl verified it (under `sh -e` a failed
        // check has already failed the block).
        if text.contains("openssl pkeyutl -verify") {
            assert!(out.contains("Signature Verified Successfully"), "{out}");
        }
    }

    // The journal shows the registration with the node's ID and mesh IP, then the stream.
    let journal = wait_until(BOUND, "the journal shows the stream connected", || {
        let j = m.machine.journal("plexd")?;
        Ok(j.contains("event stream connected").then_some(j))
    })
    .unwrap();
    let identity = m.sh("cat /var/lib/plexd/identity.json").unwrap();
    let v: serde_json::Value = serde_json::from_str(&identity).unwrap();
    let node_id = v["node_id"].as_str().unwrap().to_owned();
    let mesh_ip = v["mesh_ip"].as_str().unwrap().to_owned();
    let registered = journal
        .lines()
        .find(|l| l.contains("registered as node") && l.contains(&node_id))
        .unwrap_or_else(|| panic!("a registration line with the node id in:\n{journal}"));
    assert!(registered.contains(&mesh_ip), "{registered}");
    assert!(!journal.contains(&token), "the token is never logged");
    assert_eq!(
        m.sh("test -e /etc/plexd/bootstrap-token || echo gone")
            .unwrap()
            .trim(),
        "gone"
    );
    wait_until(BOUND, "the control plane shows the node online", || {
        Ok(Some(cp.node(&node_id)?).filter(|n| n["status"] == "online"))
    })
    .unwrap();
    let status = m.sh("plexd status --output json").unwrap();
    eprintln!("--- journalctl -u plexd:\n{journal}\n--- plexd status --output json:\n{status}");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["node_id"], node_id.as_str());
    // The unit's Nice= reaches the daemon and its packet threads (they inherit it): every
    // thread of the running plexd at the unit's priority (field 19 of /proc/<pid>/task/*/stat).
    let nices = m
        .sh("pid=$(systemctl show -p MainPID --value plexd); for t in /proc/$pid/task/*/stat; do sed 's/.*) //' \"$t\" | cut -d' ' -f17; done")
        .unwrap();
    let nices: Vec<&str> = nices.split_whitespace().collect();
    assert!(nices.len() >= 3, "plexd's threads: {nices:?}");
    let want = unit_nice();
    assert!(
        nices.iter().all(|n| *n == want),
        "every plexd thread at the unit's Nice={want}: {nices:?}"
    );
    // `systemctl reload` reaches the daemon (ExecReload sends SIGHUP) and it stays up.
    m.sh("systemctl reload plexd").unwrap();
    wait_until(BOUND, "the journal shows the reload", || {
        Ok(m.machine
            .journal("plexd")?
            .contains("SIGHUP: config reloaded")
            .then_some(()))
    })
    .unwrap();
    assert_eq!(m.sh("systemctl is-active plexd").unwrap().trim(), "active");

    // A rebuilt host (new key) restarted with the same, consumed token file is refused.
    m.sh(&format!(
        "systemctl stop plexd\nrm -rf /var/lib/plexd\n(umask 077; printf '%s\\n' '{token}' >/etc/plexd/bootstrap-token)\nsystemctl start plexd || true"
    ))
    .unwrap();
    let expected = "the bootstrap token in /etc/plexd/bootstrap-token was already used (token_consumed, HTTP 403); write a fresh token to /etc/plexd/bootstrap-token and start plexd again";
    wait_until(BOUND, "the journal shows token_consumed", || {
        Ok(m.machine.journal("plexd")?.contains(expected).then_some(()))
    })
    .unwrap();
    // Exit 10 is in RestartPreventExitStatus: systemd does not restart it in a loop.
    let result = wait_until(BOUND, "the unit settles as failed", || {
        let r = m
            .sh("systemctl show -p Result -p ExecMainStatus -p NRestarts plexd")
            .unwrap();
        Ok(r.contains("ExecMainStatus=10").then_some(r))
    })
    .unwrap();
    assert!(result.contains("NRestarts=0"), "{result}");

    // The fix the message names: a fresh token, and plexd starts again as a new node.
    let fresh = cp.issue_token(LAB_NODES_PROJECT).unwrap();
    m.sh(&format!(
        "(umask 077; printf '%s\\n' '{fresh}' >/etc/plexd/bootstrap-token)\nsystemctl start plexd"
    ))
    .unwrap();
    let second = wait_until(BOUND, "the node enrols again with the fresh token", || {
        let id = m.sh("cat /var/lib/plexd/identity.json 2>/dev/null || true")?;
        Ok(serde_json::from_str::<serde_json::Value>(&id)
            .ok()
            .and_then(|v| v["node_id"].as_str().map(str::to_owned))
            .filter(|id| *id != node_id))
    })
    .unwrap();
    wait_until(BOUND, "the new node is online", || {
        Ok(Some(cp.node(&second)?).filter(|n| n["status"] == "online"))
    })
    .unwrap();

    // The README's removal, verbatim: the node leaves through the daemon under systemd.
    let blocks = readme::blocks("uninstall").unwrap();
    assert_eq!(blocks.len(), 1, "{blocks:?}");
    let out = m.sh(&blocks[0].text.replace("sudo ", "")).unwrap();
    eprintln!("--- {}{out}", blocks[0].text);
    assert!(
        out.contains(&format!("node {second} left the mesh: deregistered")),
        "{out}"
    );
    assert!(out.contains("stopped and disabled plexd.service"), "{out}");
    let after = m
        .sh("for p in /etc/systemd/system/plexd.service /etc/plexd /var/lib/plexd; do \
               if test -e $p; then echo \"present $p\"; else echo \"gone $p\"; fi; done
             if ip link show plexd0 >/dev/null 2>&1; then echo 'present plexd0'; else echo 'gone plexd0'; fi
             echo \"enabled: $(systemctl is-enabled plexd 2>&1 || true)\"
             echo \"active: $(systemctl is-active plexd 2>&1 || true)\"
             command -v plexd")
        .unwrap();
    for gone in [
        "gone /etc/systemd/system/plexd.service",
        "gone /etc/plexd",
        "gone /var/lib/plexd",
        "gone plexd0",
    ] {
        assert!(after.contains(gone), "{gone}:\n{after}");
    }
    assert!(!after.contains("enabled: enabled"), "{after}");
    assert!(!after.contains("active: active"), "{after}");
    assert!(
        after.contains("/usr/local/bin/plexd"),
        "the binary is kept:\n{after}"
    );
    let out = cp.plexctl(&["node", "get", &second]).unwrap();
    assert!(
        !out.status.success(),
        "the control plane no longer has the node"
    );
}
