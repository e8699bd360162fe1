//! Boots one local machine, prints what the substrate observes, then destroys it:
//! `sudo cargo run -p plexsphere-nspawn --example machine -- [user-data file]`.

use std::path::Path;
use std::time::Duration;

use plexsphere_nspawn::{
    BaseImage, Bridge, DEFAULT_IMAGE_CACHE, Machine, MachineSpec, NoCloudSeed,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter("plexsphere_nspawn=info")
        .init();
    let user_data = match std::env::args().nth(1) {
        Some(path) => std::fs::read_to_string(path)?,
        None => "#cloud-config\nruncmd:\n  - echo hello from the example machine\n".to_string(),
    };
    plexsphere_nspawn::preflight()?;
    let image = BaseImage::ensure(Path::new(DEFAULT_IMAGE_CACHE))?;
    let bridge = Bridge::ensure("plexbrx0", "172.30.234.1/24".parse()?)?;
    let state = tempfile::tempdir_in("/var/tmp")?;
    let spec = MachineSpec {
        name: "example".into(),
        image,
        bridge: bridge.name().into(),
        address: bridge.machine_address(10).ok_or("no address")?,
        gateway: bridge.host_address(),
        seed: NoCloudSeed {
            instance_id: format!("example-{}", std::process::id()),
            user_data,
        },
        files: Vec::new(),
    };
    let machine = Machine::create(state.path(), spec)?;
    let result = (|| -> Result<(), plexsphere_nspawn::Error> {
        machine.wait_booted(Duration::from_secs(180))?;
        println!("system: {}", machine.system_state()?);
        println!(
            "cloud-init: {}",
            machine.wait_cloud_init(Duration::from_secs(300))?
        );
        println!(
            "--- journal of cloud-final.service\n{}",
            machine.journal("cloud-final.service")?
        );
        println!("--- console.log\n{}", machine.console_log()?);
        Ok(())
    })();
    machine.destroy()?;
    Bridge::remove(bridge.name())?;
    Ok(result?)
}
