//! The host bridge the machines sit on. It carries the gateway address (by default
//! `plexbr0` with 172.30.231.1/24): machines reach the control plane listening there, and each
//! other across the bridge. Nothing is routed or NATed beyond it.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use ipnet::Ipv4Net;

use crate::cmd::{Tool, run_ok};
use crate::error::{Error, Result};

pub const DEFAULT_BRIDGE: &str = "plexbr0";
pub const DEFAULT_BRIDGE_ADDRESS: &str = "172.30.231.1/24";

const IP_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bridge {
    name: String,
    address: Ipv4Net,
}

impl Bridge {
    /// Makes sure the bridge `name` exists, is up and carries `address` (the host's address
    /// with the machines' prefix, e.g. 172.30.231.1/24). Idempotent; other addresses already
    /// on the bridge are left alone.
    pub fn ensure(name: &str, address: Ipv4Net) -> Result<Bridge> {
        validate_bridge_name(name)?;
        if !exists(name) {
            let mut cmd = Tool::Ip.command()?;
            cmd.args(["link", "add", "name", name, "type", "bridge"]);
            // Another process may have created it in between: that is success.
            if let Err(e) = run_ok(cmd, &format!("creating bridge {name}"), IP_TIMEOUT)
                && !exists(name)
            {
                return Err(e);
            }
            tracing::info!(bridge = name, "bridge created");
        }
        if !is_bridge(name) {
            return Err(Error::NotABridge(name.to_string()));
        }
        if !has_address(&addresses_json(name)?, address) {
            let mut cmd = Tool::Ip.command()?;
            cmd.args(["addr", "add", &address.to_string(), "dev", name]);
            if let Err(e) = run_ok(
                cmd,
                &format!("adding {address} to bridge {name}"),
                IP_TIMEOUT,
            ) && !has_address(&addresses_json(name)?, address)
            {
                return Err(e);
            }
        }
        let mut cmd = Tool::Ip.command()?;
        cmd.args(["link", "set", "dev", name, "up"]);
        run_ok(cmd, &format!("bringing bridge {name} up"), IP_TIMEOUT)?;
        Ok(Bridge {
            name: name.to_string(),
            address,
        })
    }

    /// Deletes the bridge `name` if it exists (ports attached to it are detached by the
    /// kernel). Refuses an interface that is not a bridge.
    pub fn remove(name: &str) -> Result<()> {
        validate_bridge_name(name)?;
        if !exists(name) {
            return Ok(());
        }
        if !is_bridge(name) {
            return Err(Error::NotABridge(name.to_string()));
        }
        let mut cmd = Tool::Ip.command()?;
        cmd.args(["link", "del", "dev", name]);
        if let Err(e) = run_ok(cmd, &format!("deleting bridge {name}"), IP_TIMEOUT)
            && exists(name)
        {
            return Err(e);
        }
        tracing::info!(bridge = name, "bridge removed");
        Ok(())
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host's address on the bridge: the machines' gateway, where the control plane listens.
    pub fn host_address(&self) -> Ipv4Addr {
        self.address.addr()
    }

    /// The host address with its prefix, as given to [`Bridge::ensure`].
    pub fn address(&self) -> Ipv4Net {
        self.address
    }

    /// The machine address `host` in the bridge's network (e.g. host 10 of 172.30.231.0/24 is
    /// 172.30.231.10/24); `None` when that is outside the network, its network or broadcast
    /// address, or the bridge's own.
    pub fn machine_address(&self, host: u32) -> Option<Ipv4Net> {
        machine_address(self.address, host)
    }
}

/// True when the bridge `name` exists.
pub fn exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

fn is_bridge(name: &str) -> bool {
    Path::new("/sys/class/net")
        .join(name)
        .join("bridge")
        .is_dir()
}

pub fn validate_bridge_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 15
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidBridgeName(name.to_string()))
    }
}

fn addresses_json(name: &str) -> Result<String> {
    let mut cmd = Tool::Ip.command()?;
    cmd.args(["-j", "-4", "addr", "show", "dev", name]);
    let out = run_ok(
        cmd,
        &format!("reading the addresses of bridge {name}"),
        IP_TIMEOUT,
    )?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether `ip -j -4 addr show` output lists `address` with its prefix length.
pub fn has_address(ip_json: &str, address: Ipv4Net) -> bool {
    let Ok(links) = serde_json::from_str::<serde_json::Value>(ip_json) else {
        return false;
    };
    links
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l.get("addr_info")?.as_array())
        .flatten()
        .any(|a| {
            a.get("local").and_then(|v| v.as_str()) == Some(&address.addr().to_string())
                && a.get("prefixlen").and_then(|v| v.as_u64())
                    == Some(u64::from(address.prefix_len()))
        })
}

/// See [`Bridge::machine_address`].
pub fn machine_address(bridge: Ipv4Net, host: u32) -> Option<Ipv4Net> {
    let net = bridge.network();
    let hosts = 1u64 << (32 - u32::from(bridge.prefix_len()));
    if u64::from(host) == 0 || u64::from(host) >= hosts.saturating_sub(1) {
        return None;
    }
    let addr = Ipv4Addr::from(u32::from(net).checked_add(host)?);
    if addr == bridge.addr() {
        return None;
    }
    Ipv4Net::new(addr, bridge.prefix_len()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bridge_names() {
        for ok in ["plexbr0", "br_test-1", "a23456789012345"] {
            assert!(validate_bridge_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a234567890123456", "br 0", "br/0", "br.0"] {
            assert!(validate_bridge_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn address_presence_from_ip_json() {
        let json = r#"[{"ifindex":9,"ifname":"plexbr0","flags":["BROADCAST"],"addr_info":[
            {"family":"inet","local":"172.30.231.1","prefixlen":24,"scope":"global"}]}]"#;
        let a: Ipv4Net = "172.30.231.1/24".parse().unwrap();
        assert!(has_address(json, a));
        assert!(!has_address(json, "172.30.231.1/16".parse().unwrap()));
        assert!(!has_address(json, "172.30.231.2/24".parse().unwrap()));
        assert!(!has_address("[]", a));
        assert!(!has_address("[{}]", a));
        assert!(!has_address("not json", a));
    }

    #[test]
    fn machine_addresses_stay_inside_the_network() {
        let b: Ipv4Net = "172.30.231.1/24".parse().unwrap();
        assert_eq!(
            machine_address(b, 10),
            Some("172.30.231.10/24".parse().unwrap())
        );
        assert_eq!(
            machine_address(b, 254),
            Some("172.30.231.254/24".parse().unwrap())
        );
        assert_eq!(machine_address(b, 0), None);
        assert_eq!(machine_address(b, 1), None, "the bridge's own address");
        assert_eq!(machine_address(b, 255), None, "broadcast");
        assert_eq!(machine_address(b, 300), None);
    }
}
