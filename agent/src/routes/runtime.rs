//! The routes shell: one task that owns the [`Reporter`] (sends its reports with the node
//! API), the probes' threads, and the host thread that applies the [`HostPlan`] (netlink and
//! `nft` block). The daemon's core tells it the config, the applied peers and the signed
//! state's served routes and relays through [`RoutesHandle::send`]; `plexd status` reads its
//! snapshot. Stopping withdraws the routes (an empty report, bounded by [`STOP_REPORT`]) and
//! removes everything the host thread added.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use plexsphere_wire::node::PeerSpec;
use plexsphere_wire::routes::{RoutesAck, ServedRoute};
use tokio::sync::{mpsc, oneshot};

use super::host::Host;
use super::netlink::TABLE_MAIN;
use super::op::RoutesOp;
use super::plan::{self, HostPlan};
use super::probe::{ProbeResult, Probes};
use super::report::Reporter;
use super::status::{AdvertisedStatus, RoutesStatus};
use crate::config::routes::RoutesConfig;
use crate::node_api::NodeApi;

/// How long a stopping plexd waits for its withdrawal to be answered.
pub(crate) const STOP_REPORT: Duration = Duration::from_secs(2);
/// How long a stopping plexd waits for the host to be cleaned up.
pub(crate) const STOP_HOST: Duration = Duration::from_secs(10);
/// Probe results waiting for the task (a probe thread waits when it is full).
const PROBE_QUEUE: usize = 64;

enum Msg {
    Op(RoutesOp),
    Stop(oneshot::Sender<()>),
}

/// What the routes task needs.
pub struct RoutesSetup {
    pub api: NodeApi,
    pub iface: String,
    pub mesh: IpNet,
    /// plexd's WireGuard UDP ports (marked while an exit is in use).
    pub ports: Vec<u16>,
    /// False for `wireguard.backend: none`: reports only, the host is left alone.
    pub host: bool,
    pub config: RoutesConfig,
}

/// The running routes task.
pub struct RoutesHandle {
    tx: mpsc::UnboundedSender<Msg>,
    status: Arc<Mutex<RoutesStatus>>,
    task: tokio::task::JoinHandle<()>,
}

impl RoutesHandle {
    pub fn start(setup: RoutesSetup) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let status = Arc::new(Mutex::new(RoutesStatus::default()));
        let task = tokio::spawn(run(setup, rx, status.clone()));
        Self { tx, status, task }
    }

    /// Hands the task a change (never waits).
    pub fn send(&self, op: RoutesOp) {
        let _ = self.tx.send(Msg::Op(op));
    }

    /// The snapshot for `plexd status`.
    pub fn status(&self) -> RoutesStatus {
        self.status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Withdraws the routes and removes what was added to the host.
    pub async fn stop(self) {
        let (done, wait) = oneshot::channel();
        if self.tx.send(Msg::Stop(done)).is_ok() {
            let _ = tokio::time::timeout(STOP_REPORT + STOP_HOST, wait).await;
        }
        self.task.abort();
    }
}

enum HostMsg {
    Apply(HostPlan, BTreeSet<IpAddr>),
    Clear(std::sync::mpsc::Sender<()>),
}

/// The thread that changes the host; the latest plan wins.
fn host_thread(
    iface: String,
    mesh: IpNet,
    ports: Vec<u16>,
    errors: Arc<Mutex<Vec<String>>>,
) -> std::io::Result<std::sync::mpsc::Sender<HostMsg>> {
    let (tx, rx) = std::sync::mpsc::channel::<HostMsg>();
    std::thread::Builder::new()
        .name("plexd-routes".into())
        .spawn(move || {
            let mut host = Host::start(&iface, mesh, ports);
            let mut last: Vec<String> = Vec::new();
            while let Ok(mut msg) = rx.recv() {
                // Only the newest plan matters.
                while let Ok(next) = rx.try_recv() {
                    if matches!(msg, HostMsg::Clear(_)) {
                        break;
                    }
                    msg = next;
                }
                let (errs, done) = match msg {
                    HostMsg::Apply(plan, exempt) => (host.apply(&plan, &exempt), None),
                    HostMsg::Clear(done) => (host.clear(), Some(done)),
                };
                for e in errs.iter().filter(|e| !last.contains(e)) {
                    tracing::warn!(interface = %iface, "routes: {e}");
                }
                last.clone_from(&errs);
                *errors.lock().unwrap_or_else(PoisonError::into_inner) = errs;
                if let Some(done) = done {
                    let _ = done.send(());
                    return;
                }
            }
        })?;
    Ok(tx)
}

async fn resolve_api(api: &NodeApi) -> Vec<IpAddr> {
    let url = api.url("");
    let Some(host) = url.host_str() else {
        return vec![];
    };
    if let Ok(ip) = host.trim_matches(['[', ']']).parse::<IpAddr>() {
        return vec![ip];
    }
    let port = url.port_or_known_default().unwrap_or(443);
    match tokio::net::lookup_host((host, port)).await {
        Ok(addrs) => addrs.map(|a| a.ip()).collect(),
        Err(e) => {
            tracing::warn!(
                "cannot resolve the control plane's {host} to keep it off an exit's tunnel: {e}"
            );
            vec![]
        }
    }
}

struct Task {
    setup: RoutesSetup,
    reporter: Reporter,
    peers: Arc<Vec<PeerSpec>>,
    served: Vec<ServedRoute>,
    relays: Vec<IpAddr>,
    api_addrs: Vec<IpAddr>,
    plan: Option<(HostPlan, BTreeSet<IpAddr>)>,
    host: Option<std::sync::mpsc::Sender<HostMsg>>,
    host_errors: Arc<Mutex<Vec<String>>>,
}

async fn run(
    setup: RoutesSetup,
    mut rx: mpsc::UnboundedReceiver<Msg>,
    status: Arc<Mutex<RoutesStatus>>,
) {
    let (probe_tx, mut probe_rx) = mpsc::channel::<ProbeResult>(PROBE_QUEUE);
    let (call_tx, mut call_rx) = mpsc::channel::<Result<RoutesAck, String>>(1);
    let mut probes = Probes::new(probe_tx);
    let host_errors = Arc::new(Mutex::new(Vec::new()));
    let host = if setup.host {
        match host_thread(
            setup.iface.clone(),
            setup.mesh,
            setup.ports.clone(),
            host_errors.clone(),
        ) {
            Ok(tx) => Some(tx),
            Err(e) => {
                tracing::warn!(
                    "routes: cannot start the routes thread: {e}; routes are not applied on this host"
                );
                None
            }
        }
    } else {
        None
    };
    let api_addrs = resolve_api(&setup.api).await;
    let mut t = Task {
        reporter: Reporter::default(),
        peers: Arc::new(vec![]),
        served: vec![],
        relays: vec![],
        api_addrs,
        plan: None,
        host,
        host_errors,
        setup,
    };
    t.reporter
        .handle_config(&t.setup.config, t.setup.mesh, Instant::now());
    probes.sync(&t.reporter.probes());
    loop {
        let now = Instant::now();
        if let Some(report) = t.reporter.poll_report(now) {
            let (api, tx) = (t.setup.api.clone(), call_tx.clone());
            tokio::spawn(async move {
                let answer = api.routes(&report).await.map_err(|e| e.to_string());
                let _ = tx.send(answer).await;
            });
        }
        t.publish(&status);
        let wake = t.reporter.poll_timeout().map_or(
            tokio::time::Instant::now() + Duration::from_secs(3600),
            tokio::time::Instant::from_std,
        );
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(Msg::Op(op)) => {
                    t.on_op(op);
                    probes.sync(&t.reporter.probes());
                }
                Some(Msg::Stop(done)) => {
                    probes.stop();
                    t.stop().await;
                    t.publish(&status);
                    let _ = done.send(());
                    return;
                }
                None => {
                    probes.stop();
                    t.stop().await;
                    return;
                }
            },
            Some((cidr, ok)) = probe_rx.recv() => t.reporter.handle_probe(cidr, ok, Instant::now()),
            Some(answer) = call_rx.recv() => t.reporter.handle_answer(answer, Instant::now()),
            () = tokio::time::sleep_until(wake) => {}
        }
    }
}

impl Task {
    fn on_op(&mut self, op: RoutesOp) {
        match op {
            RoutesOp::Config(c) => {
                self.reporter
                    .handle_config(&c, self.setup.mesh, Instant::now());
                self.setup.config = c;
            }
            RoutesOp::Peers(p) => self.peers = p,
            RoutesOp::State { served, relays } => {
                self.served = served;
                self.relays = relays;
            }
        }
        self.replan();
    }

    fn replan(&mut self) {
        let Some(host) = &self.host else { return };
        let c = &self.setup.config;
        let plan = plan::plan(&self.peers, self.setup.mesh, c, &self.served);
        for p in &plan.ignored {
            tracing::debug!(prefix = %p, "a peer's prefix {p} is too short for a subnet route and the peer is not this node's exit: not routed");
        }
        let exempt = plan::exempt(&self.api_addrs, &self.relays);
        let next = (plan, exempt);
        if self.plan.as_ref() != Some(&next) {
            let _ = host.send(HostMsg::Apply(next.0.clone(), next.1.clone()));
            self.plan = Some(next);
        }
    }

    async fn stop(&mut self) {
        if let Some(report) = self.reporter.withdrawal() {
            let api = self.setup.api.clone();
            match tokio::time::timeout(STOP_REPORT, api.routes(&report)).await {
                Ok(Ok(_)) => tracing::info!("routes withdrawn"),
                Ok(Err(e)) => tracing::info!(
                    "the routes' withdrawal failed ({e}); the control plane drops them when their lease ends"
                ),
                Err(_) => tracing::info!(
                    "the routes' withdrawal was not answered in time; the control plane drops them when their lease ends"
                ),
            }
        }
        if let Some(host) = self.host.take() {
            let (done, wait) = std::sync::mpsc::channel();
            if host.send(HostMsg::Clear(done)).is_ok() {
                let _ = tokio::task::spawn_blocking(move || wait.recv_timeout(STOP_HOST)).await;
            }
        }
        self.plan = None;
    }

    fn publish(&self, status: &Mutex<RoutesStatus>) {
        let r = &self.reporter;
        let report = r.report();
        let ack = r.last_ack.as_ref();
        let advertise = report
            .advertise
            .iter()
            .map(|a| {
                let s = ack.and_then(|k| k.routes.iter().find(|s| s.cidr == a.cidr));
                AdvertisedStatus {
                    cidr: a.cidr.to_string(),
                    probe: a.probe.map(|p| p.to_string()),
                    healthy: a.healthy,
                    approval: s.map(|s| s.approval),
                    role: s.map(|s| s.role),
                    reason: s.map(|s| s.reason.clone()).unwrap_or_default(),
                }
            })
            .collect();
        let plan = self.plan.as_ref().map(|(p, _)| p);
        let snapshot = RoutesStatus {
            advertise,
            refused: r.refused.clone(),
            exit: report.exit,
            use_exit: report.use_exit,
            use_exit_error: ack.and_then(|a| a.use_exit_error.clone()),
            exit_in_use: plan.and_then(|p| p.exit_peer),
            serving: self.served.clone(),
            forwarding: plan.is_some_and(|p| p.forward),
            via_mesh: plan
                .map(|p| {
                    p.routes
                        .iter()
                        .map(|k| {
                            if k.table == TABLE_MAIN {
                                k.prefix.to_string()
                            } else {
                                format!("{}:{}", k.table, k.prefix)
                            }
                        })
                        .collect()
                })
                .unwrap_or_default(),
            last_report_age_secs: r.last_ok.map(|t| t.elapsed().as_secs()),
            last_error: r.last_error.clone(),
            host_errors: self
                .host_errors
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        };
        *status.lock().unwrap_or_else(PoisonError::into_inner) = snapshot;
    }
}
