//! The worker's periodic policy restore (`Control::restore_policy`), with a fake interface.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use plexsphere_wire::node::PolicyState;

use super::contract::Mesh;
use super::diff::{LiveConfig, MeshUpdate};
use super::nft_tests::view;
use super::worker::{Control, Plane, RECONCILE_EVERY, WgMesh, WorkerError};

#[derive(Default)]
struct Shared {
    /// The filter is gone (someone flushed it).
    gone: AtomicBool,
    restored: AtomicUsize,
    /// Reads of the peers: one per reconcile.
    lives: AtomicUsize,
}

struct FakeCtl(Arc<Shared>);

impl Control for FakeCtl {
    fn live(&self) -> std::io::Result<Vec<LiveConfig>> {
        self.0.lives.fetch_add(1, Ordering::SeqCst);
        Ok(vec![])
    }
    fn apply(&self, _update: &MeshUpdate) -> std::io::Result<()> {
        Ok(())
    }
    fn set_private_key(&self, _key: [u8; 32]) -> std::io::Result<()> {
        Ok(())
    }
    fn set_policy(&self, policy: Option<&PolicyState>) -> std::io::Result<()> {
        match policy {
            Some(p) if p.version == 666 => Err(std::io::Error::other("refused")),
            _ => Ok(()),
        }
    }
    fn restore_policy(&self, _policy: &PolicyState) -> std::io::Result<bool> {
        if self.0.gone.swap(false, Ordering::SeqCst) {
            self.0.restored.fetch_add(1, Ordering::SeqCst);
            return Ok(true);
        }
        Ok(false)
    }
}

struct FakePlane;

impl Plane for FakePlane {
    fn check(&mut self) -> Result<(), WorkerError> {
        Ok(())
    }
    fn teardown(&mut self) -> Result<(), WorkerError> {
        Ok(())
    }
}

fn state(version: u64) -> PolicyState {
    PolicyState {
        version,
        view: view(&["10.64.0.2"], vec![], vec![]),
    }
}

#[test]
fn the_worker_restores_a_filter_removed_behind_its_back() {
    let shared = Arc::new(Shared::default());
    let mut mesh =
        WgMesh::start("kernel", "fake0", FakeCtl(shared.clone()), FakePlane, None).unwrap();
    mesh.apply(Arc::new(vec![])).unwrap();
    mesh.set_policy(Some(&state(1))).unwrap();
    shared.gone.store(true, Ordering::SeqCst);
    wait(|| shared.restored.load(Ordering::SeqCst) == 1);
    // A refused policy is not restored (the daemon configures no peers instead): a periodic
    // pass (a read of the peers, which comes after the restore check) leaves it gone.
    assert!(mesh.set_policy(Some(&state(666))).is_err());
    shared.gone.store(true, Ordering::SeqCst);
    let reads = shared.lives.load(Ordering::SeqCst);
    wait(|| shared.lives.load(Ordering::SeqCst) > reads);
    assert_eq!(shared.restored.load(Ordering::SeqCst), 1);
    assert!(shared.gone.load(Ordering::SeqCst));
}

/// Waits for `done` for at most 3 reconcile periods.
fn wait(done: impl Fn() -> bool) {
    let deadline = Instant::now() + RECONCILE_EVERY * 3;
    while !done() {
        assert!(Instant::now() < deadline, "not within 3 reconcile periods");
        std::thread::park_timeout(Duration::from_millis(50));
    }
}

/// The typed errors read as the texts a person saw when they were strings: through
/// [`super::contract::MeshError`] for a refused call, and each variant's own Display.
#[test]
fn worker_errors_read_as_before() {
    let shared = Arc::new(Shared::default());
    let mut mesh = WgMesh::start("kernel", "fake0", FakeCtl(shared), FakePlane, None).unwrap();
    let refused = mesh.set_policy(Some(&state(666))).unwrap_err();
    assert_eq!(
        refused.to_string(),
        "the kernel data plane on fake0: cannot install the policy filter: refused"
    );
    let gone = WorkerError::DeleteInterface {
        iface: "plexd0".to_owned(),
        source: std::io::Error::other("busy"),
    };
    assert_eq!(
        gone.to_string(),
        "cannot delete the interface (busy); run `ip link del plexd0`"
    );
    let stopped = WorkerError::PlaneStopped {
        why: "it stopped".to_owned(),
    };
    assert_eq!(
        stopped.to_string(),
        "the embedded data plane stopped (it stopped); restart plexd"
    );
    assert_eq!(
        WorkerError::ApplyPeers {
            ops: 2,
            source: std::io::Error::other("EINVAL"),
        }
        .to_string(),
        "cannot apply 2 peer operation(s): EINVAL"
    );
    assert_eq!(
        WorkerError::NoAnswer.to_string(),
        "no answer from the wireguard control thread within 15 s; the interface may be wedged"
    );
}
