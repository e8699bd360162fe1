//! Paths end to end (root, issue 28): two real plexd nodes behind endpoint-independent NATs
//! (tests/src/nat.rs, the cheapest lab that punches a direct path) report their paths; the
//! control plane's `/v1/mesh/map` and `/v1/nodes/{id}/paths` show the pair direct with an
//! RTT; when node 0's router starts dropping UDP the pair moves to a relay and the console's
//! event stream (`/v1/console/events`) says so with a `map` event; a token bound to another
//! project sees neither the nodes nor their link.
//!
//! The API is called with curl inside the lab's public namespace (where the control plane's
//! address is), with the admin token `plexsphere dev` wrote.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use plexsphere_e2e::nat::{NatMode, NodeSpec, ReachLab};
use plexsphere_e2e::netns::in_netns;
use serde_json::Value;

/// Enrolment, STUN, punching and the first report (debounce, 1 s samples): as reach.rs.
const PATH_BOUND: Duration = Duration::from_secs(60);

fn admin_token(lab: &ReachLab) -> String {
    let cfg = std::fs::read_to_string(lab.cp.plexctl_config()).unwrap();
    let file = cfg
        .lines()
        .find_map(|l| l.strip_prefix("token_file: "))
        .unwrap()
        .trim();
    std::fs::read_to_string(file).unwrap().trim().to_owned()
}

/// curl of `path` with `token`, at most `max_secs` long.
fn curl(lab: &ReachLab, token: &str, path: &str, max_secs: u32) -> Command {
    let mut c = Command::new("curl");
    c.args(["-sSN", "--max-time", &max_secs.to_string(), "--cacert"])
        .arg(lab.cp.ca_file())
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .arg(format!("{}{path}", lab.cp.url.trim_end_matches('/')));
    in_netns(lab.topo.public_ns(), &c)
}

fn get(lab: &ReachLab, token: &str, path: &str) -> Value {
    let out = curl(lab, token, path, 10).output().unwrap();
    assert!(
        out.status.success(),
        "curl {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{path}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn node_id(lab: &ReachLab, i: usize) -> String {
    lab.nodes[i].host.identity().unwrap().0
}

/// The link between nodes `a` and `b` on the map.
fn link(map: &Value, a: &str, b: &str) -> Option<Value> {
    let (x, y) = if a < b { (a, b) } else { (b, a) };
    map["links"]
        .as_array()?
        .iter()
        .find(|l| l["a"] == x && l["b"] == y)
        .cloned()
}

/// Polls `what` until `ok` holds (bounded).
fn wait<T>(what: &str, bound: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < bound, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The console's event stream, written to a file by curl.
struct Stream {
    child: Child,
    file: std::path::PathBuf,
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_direct_pair_shows_on_the_map_and_a_path_change_is_a_map_event() {
    let mut lab = ReachLab::start(&[NatMode::Eim, NatMode::Eim], 1).unwrap();
    for r in 0..2 {
        lab.add_node(&NodeSpec {
            router: r,
            backend: "userspace",
        })
        .unwrap();
    }
    for i in 0..2 {
        lab.start_node(i)
            .unwrap_or_else(|e| panic!("{e:#}\n{}", lab.dump()));
    }
    let token = admin_token(&lab);
    let (a, b) = (node_id(&lab, 0), node_id(&lab, 1));

    // Both report: the map shows the pair direct, with an RTT.
    let l = wait("a direct link with an RTT on the map", PATH_BOUND, || {
        let map = get(&lab, &token, "/v1/mesh/map");
        link(&map, &a, &b).filter(|l| l["path"] == "direct" && l["rtt_ms"].is_number())
    });
    assert!(l["relay"].is_null() && l["updated_at"].is_string(), "{l}");
    let map = get(&lab, &token, "/v1/mesh/map");
    assert_eq!(map["nodes"].as_array().unwrap().len(), 2, "{map}");
    assert!(
        map["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["online"] == true),
        "{map}"
    );
    let paths = get(&lab, &token, &format!("/v1/nodes/{a}/paths"));
    let peer = paths["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["peer_node_id"] == b.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("no peer {b} in {paths}"));
    assert_eq!(peer["path"], "direct", "{peer}");
    assert!(
        peer["rtt_ms"].is_number() && peer["endpoint"].is_string(),
        "{peer}"
    );
    assert!(paths["candidates"].is_array(), "{paths}");

    // A token bound to another project sees neither node nor their link.
    let projects = lab
        .plexctl_ok(&["project", "list", "--output", "json"])
        .unwrap();
    let projects: Value = serde_json::from_str(&projects).unwrap();
    let list = projects
        .as_array()
        .or(projects["items"].as_array())
        .cloned()
        .unwrap_or_default();
    let mine = map["nodes"][0]["project_id"].as_str().unwrap().to_owned();
    let other = list
        .iter()
        .filter_map(|p| p["id"].as_str())
        .find(|p| *p != mine)
        .unwrap_or_else(|| panic!("the lab seed has one project only: {projects}"));
    {
        let out = lab
            .plexctl_ok(&[
                "operator-token",
                "create",
                "--name",
                "other-project",
                "--scope",
                "read-only",
                "--project",
                other,
                "--expires-in",
                "1h",
                "--output",
                "json",
            ])
            .unwrap();
        let created: Value = serde_json::from_str(&out).unwrap();
        let other_token = created["token"].as_str().unwrap().to_owned();
        let theirs = get(&lab, &other_token, "/v1/mesh/map");
        assert_eq!(theirs["nodes"].as_array().unwrap().len(), 0, "{theirs}");
        assert_eq!(theirs["links"].as_array().unwrap().len(), 0, "{theirs}");
    }

    // The relay of the lab, probed by the control plane: healthy over both transports.
    let relays = get(&lab, &token, "/v1/relays");
    let r1 = &relays[0];
    assert_eq!(r1["name"], "r1", "{relays}");
    assert_eq!(
        r1["transports"],
        serde_json::json!(["udp", "tcp"]),
        "{relays}"
    );
    assert_eq!(r1["healthy"], true, "{relays}");

    // The console's stream: a snapshot first, then the move to a relay as a map event.
    let file = lab.dir.path().join("console-events.txt");
    let mut cmd = curl(&lab, &token, "/v1/console/events", 120);
    cmd.stdout(Stdio::from(std::fs::File::create(&file).unwrap()));
    let stream = Stream {
        child: cmd.spawn().unwrap(),
        file,
    };
    let read = || std::fs::read_to_string(&stream.file).unwrap_or_default();
    wait("the snapshot event", PATH_BOUND, || {
        read().contains("event: snapshot").then_some(())
    });
    lab.set_mode(0, NatMode::DropUdp).unwrap();
    let data = wait("a map event with the relayed path", PATH_BOUND, || {
        read()
            .split("\n\n")
            .filter(|b| b.contains("event: map"))
            .filter_map(|b| {
                b.lines()
                    .find_map(|l| l.strip_prefix("data: "))
                    .map(str::to_owned)
            })
            .find(|d| d.contains("\"path\":\"relay\""))
    });
    let v: Value = serde_json::from_str(&data).unwrap();
    let moved = v["links"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["path"] == "relay")
        .unwrap();
    assert!(moved["relay"].is_string(), "{moved}");
    let map = get(&lab, &token, "/v1/mesh/map");
    assert_eq!(link(&map, &a, &b).unwrap()["path"], "relay", "{map}");
    drop(stream);
}
