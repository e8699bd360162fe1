//! The core's tests: tables of inputs at stepped times and the effects they must produce. No
//! process, socket, thread or sleep: time is a value, the mesh is a `NoneMesh` answered in
//! place, the jitter is seeded.

mod calls;
mod domain_keys;
mod leave;
mod lifecycle;
mod names;
mod policy;
mod reach;
mod rotation;
mod routes;
mod stream;

use std::time::{Duration, Instant, SystemTime};

use plexsphere_wire::node::{EventKind, HeartbeatAck, NodeState};
use plexsphere_wire::signed::SignContext;

use super::accept_fixtures::{acceptor, event_data, own, signer, state};
use super::*;
use crate::config::Config;
use crate::identity::Identity;
use crate::jitter::Jitter;
use crate::mesh::{Mesh as _, NoneMesh};
use crate::node_api::{CallError, StateAnswer};
use crate::paths::StatePaths;

pub const SEED: u64 = 0x5eed;

pub fn identity() -> Identity {
    serde_json::from_value(serde_json::json!({
        "version": 1,
        "node_id": own(),
        "domain_id": "019a0816-0000-7000-8000-000000000001",
        "project_id": "019a0816-0000-7000-8000-000000000002",
        "mesh_ip": "10.64.1.2",
        "mesh_cidr": "10.64.0.0/16",
        "node_credential": "pxnk_test",
        "domain_signing_public_key": signer().public_key_b64(),
        "api_url": "https://cp.example",
        "intervals": {"heartbeat_secs": 30, "endpoint_report_secs": 60, "state_poll_secs": 300, "ingest_secs": 60},
        "registered_at": "1970-01-01T00:00:00Z"
    }))
    .unwrap()
}

/// A core at a fixed start, its clock, a `NoneMesh` for its mesh jobs, and what it emitted.
pub struct Harness {
    pub core: Core,
    pub now: Now,
    pub t0: Instant,
    pub mesh: NoneMesh,
    /// The mesh thread's record of the installed policy (`mesh_apply::run_apply`).
    pub installed: crate::daemon::core::mesh_apply::InstalledPolicy,
    /// Answer mesh jobs at once (off: tests of a slow or stuck mesh answer them by hand).
    pub auto_mesh: bool,
    /// Mesh jobs not answered (with `auto_mesh` off).
    pub held: Vec<(MeshJobId, MeshOp)>,
    /// Answer cache writes at once, as the disk thread does when it is done (off: tests of a
    /// slow disk answer them by hand).
    pub auto_disk: bool,
}

pub fn harness_with(config: Config, watchdog: Option<Duration>) -> Harness {
    let t0 = Instant::now();
    let now = Now::new(
        t0,
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
    );
    let core = Core::new(
        Setup {
            identity: identity(),
            paths: StatePaths::new("/var/lib/plexd-test"),
            config,
            acceptor: acceptor(),
            backend: "none",
            watchdog,
            jitter: Jitter::seeded(SEED),
            rotation: Default::default(),
        },
        now,
    );
    Harness {
        core,
        now,
        t0,
        mesh: NoneMesh::default(),
        installed: Default::default(),
        auto_mesh: true,
        held: vec![],
        auto_disk: true,
    }
}

pub fn harness() -> Harness {
    harness_with(Config::default(), None)
}

impl Harness {
    /// Feeds one input at the current time; returns every effect, answering mesh jobs on
    /// the way when `auto_mesh` is on (their effects are in the list too).
    pub fn step(&mut self, input: Input) -> Vec<Effect> {
        self.core.handle(input, self.now);
        self.drain()
    }

    fn drain(&mut self) -> Vec<Effect> {
        let mut out = vec![];
        while let Some(e) = self.core.poll_effect() {
            if let Effect::Mesh { id, op } = &e {
                if self.auto_mesh {
                    let answer = self.run_mesh(op);
                    out.push(e.clone());
                    self.core.handle(Input::Mesh { id: *id, answer }, self.now);
                    continue;
                }
                self.held.push((*id, op.clone()));
            }
            if let Effect::SaveCache(w) = &e
                && self.auto_disk
            {
                let id = w.id;
                out.push(e);
                self.core.handle(Input::CacheSaved(id), self.now);
                continue;
            }
            out.push(e);
        }
        out
    }

    pub fn run_mesh(&mut self, op: &MeshOp) -> MeshAnswer {
        match op {
            MeshOp::Apply(set, policy) => crate::daemon::core::mesh_apply::run_apply(
                &mut self.mesh,
                &mut self.installed,
                set.clone(),
                policy.clone(),
            ),
            MeshOp::ReadLive => MeshAnswer::Live(self.mesh.live_peers()),
            MeshOp::Teardown => MeshAnswer::TornDown(self.mesh.teardown()),
            MeshOp::SetKey(k) => MeshAnswer::KeySet(self.mesh.set_private_key(k.0)),
        }
    }

    /// Answers the held mesh jobs in order.
    pub fn release_mesh(&mut self) -> Vec<Effect> {
        let held = std::mem::take(&mut self.held);
        let mut out = vec![];
        for (id, op) in held {
            let answer = self.run_mesh(&op);
            out.extend(self.step(Input::Mesh { id, answer }));
        }
        out
    }

    /// Moves the clock forward by `d` and ticks.
    pub fn after(&mut self, d: Duration) -> Vec<Effect> {
        self.now = self.now.plus(d);
        self.step(Input::Tick)
    }

    /// Moves the clock to the core's next deadline (at most [`IDLE_WAKE`] away, as the
    /// executor sleeps) and ticks.
    pub fn wake(&mut self) -> Vec<Effect> {
        let at = self.core.poll_timeout().min(self.now.at + IDLE_WAKE);
        let d = at.saturating_duration_since(self.now.at);
        self.after(d)
    }

    /// Since the start.
    pub fn elapsed(&self) -> Duration {
        self.now.at - self.t0
    }

    pub fn call(&mut self, r: CallResult) -> Vec<Effect> {
        self.step(Input::Call(r))
    }

    pub fn stream(&mut self, conn: u64, msg: StreamMsg) -> Vec<Effect> {
        self.step(Input::Stream { conn, msg })
    }

    pub fn frame(&mut self, conn: u64, seq: u64, kind: EventKind) -> Vec<Effect> {
        self.stream(conn, frame_msg(seq, kind))
    }

    /// The state pull answered with `s`, signed.
    pub fn state_answer(&mut self, s: &NodeState) -> Vec<Effect> {
        let env = signer().sign(SignContext::NodeState, s).unwrap();
        let body = serde_json::to_vec(&env).unwrap();
        self.call(CallResult::State(Ok(StateAnswer::Body(body))))
    }

    /// The first round (heartbeat, endpoint report, state pull, stream) answered: the node
    /// is up with `peers`, stream connection 1 connected.
    pub fn up(&mut self, s: &NodeState) -> Vec<Effect> {
        let mut out = self.step(Input::Tick);
        out.extend(self.call(CallResult::Heartbeat(Ok(ack(s.version)))));
        out.extend(self.state_answer(s));
        out.extend(self.stream(1, StreamMsg::Connected));
        out
    }
}

/// The stream frame of event `seq` for this node, signed as the control plane signs it.
pub fn frame_msg(seq: u64, kind: EventKind) -> StreamMsg {
    StreamMsg::Frame {
        id: Some(seq.to_string()),
        event: "e".into(),
        data: event_data(seq, own(), kind),
    }
}

pub fn ack(state_version: u64) -> HeartbeatAck {
    serde_json::from_value(serde_json::json!({
        "state_version": state_version,
        "intervals": {"heartbeat_secs": 30, "endpoint_report_secs": 60, "state_poll_secs": 300, "ingest_secs": 60}
    }))
    .unwrap()
}

pub fn unreachable() -> CallError {
    CallError::Unreachable("connection refused".into())
}

pub fn calls(effects: &[Effect]) -> Vec<&Call> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Call(c) => Some(c),
            _ => None,
        })
        .collect()
}

pub fn exits(effects: &[Effect]) -> Vec<&Outcome> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Exit(o) => Some(o),
            _ => None,
        })
        .collect()
}

pub fn applies(effects: &[Effect]) -> Vec<usize> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Mesh {
                op: MeshOp::Apply(set, _),
                ..
            } => Some(set.len()),
            _ => None,
        })
        .collect()
}

pub fn notified(effects: &[Effect], key: &str) -> bool {
    effects
        .iter()
        .any(|e| matches!(e, Effect::Notify(v) if v.iter().any(|(k, _)| *k == key)))
}

pub fn opens(effects: &[Effect]) -> Vec<(u64, Option<u64>)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::OpenStream { conn, resume } => Some((*conn, *resume)),
            _ => None,
        })
        .collect()
}

pub fn one_state(version: u64, n: u8) -> NodeState {
    state(
        version,
        (3..3 + n).map(super::accept_fixtures::peer).collect(),
    )
}
