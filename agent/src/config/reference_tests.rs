//! docs/configuration.md lists every key plexd accepts, and nothing else.
//!
//! The config below sets every field to a value other than its default, written as struct
//! literals without `..Default::default()`: a new field does not compile here until it is given
//! a value, and then its key must be in the reference table.

use std::collections::BTreeSet;
use std::time::Duration;

use super::daemon::{Backend, DaemonConfig, IntervalOverrides, ReachConfig, WireguardConfig};
use super::rotation::{Interval, RotationConfig};
use super::*;

fn every_key_set() -> Config {
    Config {
        api_url: Some(ApiUrl::parse("https://plexsphere.example").expect("url")),
        allow_insecure_http: true,
        token_file: Some(PathBuf::from("/etc/plexd/token")),
        state_dir: Some(PathBuf::from("/srv/plexd")),
        tls: TlsConfig {
            ca_file: Some(PathBuf::from("/etc/plexd/extra.pem")),
            ca_sha256: Some(Sha256Pin([7; 32])),
        },
        registration: Registration {
            project_id: Some(Uuid::nil()),
            resource_handle: Some(ResourceHandle::parse("web-1").expect("handle")),
        },
        log: LogConfig {
            level: Some(LogLevel::parse("debug").expect("level")),
        },
        wireguard: WireguardConfig {
            backend: Backend::Userspace,
            interface: "mesh0".to_owned(),
            listen_port: 4000,
            mtu: 1380,
            reach: ReachConfig {
                enabled: false,
                kernel_port: Some(4001),
            },
            crypto_workers: 2,
        },
        daemon: DaemonConfig {
            stall_timeout_secs: 9,
            min_interval_secs: 2,
            intervals: IntervalOverrides {
                heartbeat_secs: Some(3),
                endpoint_report_secs: Some(4),
                state_poll_secs: Some(5),
                ingest_secs: Some(6),
            },
            backoff_initial_ms: 7,
            backoff_cap_secs: 8,
            healthy_after_secs: 10,
            ingest_capacity: 11,
        },
        metrics: super::metrics::MetricsConfig {
            listen: Some("127.0.0.1:9586".parse().expect("addr")),
            allow_non_loopback: true,
        },
        dns: super::dns::DnsConfig {
            enabled: false,
            port: 5353,
            resolved: false,
        },
        routes: super::routes::RoutesConfig {
            advertise: vec![super::routes::AdvertiseEntry {
                cidr: "10.1.0.0/24".parse().expect("cidr"),
                probe: Some("10.1.0.5".parse().expect("ip")),
            }],
            snat: false,
            exit: true,
            use_exit: Some("gw-1".to_owned()),
        },
        rotation: RotationConfig {
            key_interval: Interval(Some(Duration::from_secs(3600))),
            credential_interval: Interval(None),
        },
    }
}

/// The dotted paths of every leaf of a YAML mapping.
fn leaf_keys(prefix: &str, value: &serde_yaml::Value, out: &mut BTreeSet<String>) {
    match value {
        serde_yaml::Value::Mapping(m) => {
            for (k, v) in m {
                let k = k.as_str().expect("string keys");
                let path = if prefix.is_empty() {
                    k.to_owned()
                } else {
                    format!("{prefix}.{k}")
                };
                leaf_keys(&path, v, out);
            }
        }
        _ => {
            out.insert(prefix.to_owned());
        }
    }
}

/// The keys in the first column of docs/configuration.md's reference table.
fn documented_keys() -> BTreeSet<String> {
    let doc = include_str!("../../../docs/configuration.md");
    let start = doc
        .find("<!-- config-reference:begin -->")
        .expect("begin marker");
    let end = doc
        .find("<!-- config-reference:end -->")
        .expect("end marker");
    doc[start..end]
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`').map(|(k, _)| k.to_owned()))
        .collect()
}

#[test]
fn the_reference_lists_every_key_and_only_those() {
    let config = every_key_set();
    let yaml = serde_yaml::to_string(&config).expect("serialize");
    // What the reference is checked against is a config plexd itself accepts.
    let back = Config::parse(&yaml, Path::new("every-key.yaml")).expect("the full config parses");
    assert_eq!(back, config);
    let value: serde_yaml::Value = serde_yaml::from_str(&yaml).expect("yaml");
    let mut accepted = BTreeSet::new();
    leaf_keys("", &value, &mut accepted);
    let documented = documented_keys();
    let missing: Vec<_> = accepted.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&accepted).collect();
    assert!(
        missing.is_empty(),
        "keys plexd accepts that docs/configuration.md does not list: {missing:?}"
    );
    assert!(
        unknown.is_empty(),
        "keys docs/configuration.md lists that plexd does not accept: {unknown:?}"
    );
}
