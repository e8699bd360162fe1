//! What a machine gets on top of the base image: its name, an empty machine-id (systemd makes
//! a unique one at boot), its static address for systemd-networkd, and the NoCloud seed. Pure
//! rendering; `machine.rs` writes the result into the machine's upper layer.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::error::{Error, Result};

/// Where cloud-init's NoCloud datasource reads its seed inside the machine.
pub const SEED_DIR: &str = "/var/lib/cloud/seed/nocloud";

/// The NoCloud seed: `meta-data` carries the instance id (a new one makes cloud-init run
/// again) and `user-data` is the cloud-init document, verbatim.
#[derive(Clone, PartialEq, Eq)]
pub struct NoCloudSeed {
    pub instance_id: String,
    pub user_data: String,
}

impl std::fmt::Debug for NoCloudSeed {
    // The user-data carries the bootstrap token: never print it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NoCloudSeed")
            .field("instance_id", &self.instance_id)
            .field(
                "user_data",
                &format_args!("<{} bytes>", self.user_data.len()),
            )
            .finish()
    }
}

/// A file placed in the machine before it boots.
#[derive(Clone, PartialEq, Eq)]
pub struct ExtraFile {
    /// Absolute path inside the machine.
    pub path: String,
    pub contents: Vec<u8>,
    pub mode: u32,
}

impl std::fmt::Debug for ExtraFile {
    // Contents may be secrets (tokens, keys): only their size is shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtraFile")
            .field("path", &self.path)
            .field("contents", &format_args!("<{} bytes>", self.contents.len()))
            .field("mode", &format_args!("{:o}", self.mode))
            .finish()
    }
}

impl ExtraFile {
    pub fn new(path: impl Into<String>, contents: impl Into<Vec<u8>>, mode: u32) -> ExtraFile {
        ExtraFile {
            path: path.into(),
            contents: contents.into(),
            mode,
        }
    }
}

/// Machine names double as hostnames and as systemd-nspawn machine names: 1-63 characters of
/// `a-z`, `0-9` and `-`, not starting or ending with `-`.
pub fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidMachineName(name.to_string()))
    }
}

/// The files every machine gets, in the order they are written.
pub fn machine_files(
    name: &str,
    address: Ipv4Net,
    gateway: Ipv4Addr,
    seed: &NoCloudSeed,
) -> Vec<ExtraFile> {
    vec![
        ExtraFile::new("/etc/hostname", format!("{name}\n"), 0o644),
        ExtraFile::new("/etc/hosts", hosts(name), 0o644),
        ExtraFile::new("/etc/machine-id", Vec::new(), 0o444),
        ExtraFile::new(
            "/etc/systemd/network/host0.network",
            host0_network(address, gateway),
            0o644,
        ),
        ExtraFile::new(
            format!("{SEED_DIR}/meta-data"),
            meta_data(name, &seed.instance_id),
            0o600,
        ),
        ExtraFile::new(
            format!("{SEED_DIR}/user-data"),
            seed.user_data.clone(),
            0o600,
        ),
    ]
}

pub fn hosts(name: &str) -> String {
    format!(
        "127.0.0.1\tlocalhost\n127.0.1.1\t{name}\n::1\tlocalhost ip6-localhost ip6-loopback\n\
         ff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n"
    )
}

/// systemd-networkd's file for the machine's end of the veth pair (`host0`). No router
/// advertisements come on the bridge: without `IPv6AcceptRA=no` networkd keeps host0
/// "configuring" through its router solicitations and wait-online holds the boot ~12 s.
pub fn host0_network(address: Ipv4Net, gateway: Ipv4Addr) -> String {
    format!(
        "# Written by plexsphere-nspawn: the machine's address on the host bridge.\n\
         [Match]\nName=host0\n\n[Network]\nAddress={address}\nGateway={gateway}\nIPv6AcceptRA=no\n"
    )
}

/// NoCloud `meta-data`. Values are JSON strings, which YAML reads as plain strings whatever
/// characters they hold.
pub fn meta_data(name: &str, instance_id: &str) -> String {
    let q = |s: &str| serde_json::Value::String(s.to_string()).to_string();
    format!(
        "instance-id: {}\nlocal-hostname: {}\n",
        q(instance_id),
        q(name)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "node-1", "pr-0b8e", &"x".repeat(63)] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", "a b", &"x".repeat(64)] {
            let err = validate_name(bad).unwrap_err();
            assert!(err.to_string().contains("invalid machine name"), "{bad}");
        }
    }

    #[test]
    fn the_machine_gets_its_name_address_and_seed() {
        let seed = NoCloudSeed {
            instance_id: "i-1: \"x\"".into(),
            user_data: "#cloud-config\nruncmd: [true]\n".into(),
        };
        let files = machine_files(
            "node-a",
            "172.30.231.10/24".parse().unwrap(),
            "172.30.231.1".parse().unwrap(),
            &seed,
        );
        let get = |p: &str| files.iter().find(|f| f.path == p).unwrap();
        assert_eq!(get("/etc/hostname").contents, b"node-a\n");
        assert!(
            String::from_utf8_lossy(&get("/etc/hosts").contents).contains("127.0.1.1\tnode-a\n")
        );
        assert!(get("/etc/machine-id").contents.is_empty());
        let net = String::from_utf8_lossy(&get("/etc/systemd/network/host0.network").contents)
            .into_owned();
        assert!(net.contains("[Match]\nName=host0\n"));
        assert!(net.contains("Address=172.30.231.10/24\nGateway=172.30.231.1\n"));
        assert!(net.contains("IPv6AcceptRA=no\n"));
        let md = get("/var/lib/cloud/seed/nocloud/meta-data");
        assert_eq!(
            String::from_utf8_lossy(&md.contents),
            "instance-id: \"i-1: \\\"x\\\"\"\nlocal-hostname: \"node-a\"\n"
        );
        assert_eq!(md.mode, 0o600);
        let ud = get("/var/lib/cloud/seed/nocloud/user-data");
        assert_eq!(ud.contents, seed.user_data.as_bytes());
        assert_eq!(ud.mode, 0o600);
    }

    #[test]
    fn debug_never_shows_contents() {
        let seed = NoCloudSeed {
            instance_id: "i".into(),
            user_data: "pxbt_secret".into(),
        };
        assert!(!format!("{seed:?}").contains("pxbt_secret"));
        let f = ExtraFile::new("/etc/plexd/bootstrap-token", "pxbt_secret", 0o600);
        let dbg = format!("{f:?}");
        assert!(!dbg.contains("pxbt_secret") && dbg.contains("600"), "{dbg}");
    }
}
