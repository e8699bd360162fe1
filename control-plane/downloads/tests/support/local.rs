//! The local artifacts source on a real socket: two fake binaries in a temporary artifacts
//! directory, optionally signed with a fixed Domain key.

use std::sync::Arc;

use plexsphere_downloads::{ChecksumSigner, Downloads, DownloadsConfig, router};
use plexsphere_wire::signed::DomainSigner;

use super::{Server, fake_binary};

pub const VERSION: &str = "0.1.0-test";

pub struct Fixture {
    pub server: Server,
    pub artifacts: tempfile::TempDir,
    pub amd64: Vec<u8>,
    pub arm64: Vec<u8>,
}

pub async fn fixture(signed: bool) -> Fixture {
    let artifacts = tempfile::tempdir().unwrap();
    let amd64 = fake_binary(1, 300_001);
    let arm64 = fake_binary(2, 200_003);
    std::fs::write(artifacts.path().join("plexd-linux-amd64"), &amd64).unwrap();
    std::fs::write(artifacts.path().join("plexd-linux-arm64"), &arm64).unwrap();
    let signer = signed.then(|| {
        ChecksumSigner::from_domain(Arc::new(DomainSigner::from_seed(&[42u8; 32]).unwrap()))
            .unwrap()
    });
    let downloads = Downloads::open(DownloadsConfig::local(VERSION, artifacts.path()), signer)
        .await
        .unwrap();
    let server = Server::start(router(Arc::new(downloads))).await;
    Fixture {
        server,
        artifacts,
        amd64,
        arm64,
    }
}
