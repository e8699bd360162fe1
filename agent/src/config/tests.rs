use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("/etc/plexd/config.yaml"))
}

fn err(text: &str) -> String {
    parse(text).unwrap_err().to_string()
}

#[test]
fn full_example_parses() {
    let text = r#"
api_url: https://plexsphere.example
token_file: /etc/plexd/bootstrap-token
state_dir: /var/lib/plexd
tls:
  ca_file: /path/extra-ca.pem
  ca_sha256: "AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89"
registration:
  project_id: 019a0816-0000-7000-8000-000000000002
  resource_handle: web-1
log:
  level: info
"#;
    let c = parse(text).unwrap();
    assert_eq!(c.api_url.unwrap().as_str(), "https://plexsphere.example");
    assert_eq!(c.tls.ca_file.unwrap(), Path::new("/path/extra-ca.pem"));
    assert_eq!(c.tls.ca_sha256.unwrap().0[0], 0xAB);
    assert_eq!(
        c.registration.project_id.unwrap().to_string(),
        "019a0816-0000-7000-8000-000000000002"
    );
    assert_eq!(c.registration.resource_handle.unwrap().as_str(), "web-1");
    assert_eq!(c.log.level.unwrap().as_str(), "info");
}

#[test]
fn unknown_key_names_key_file_and_line() {
    let e = err("api_url: https://a.example\nregistration:\n  projectid: x\n");
    assert!(e.starts_with("/etc/plexd/config.yaml:3:"), "{e}");
    assert!(e.contains("unknown field `projectid`"), "{e}");
    assert!(e.contains("registration"), "{e}");
    let top = err("api_url: https://a.example\napi-url: x\n");
    assert!(top.starts_with("/etc/plexd/config.yaml:2:1:"), "{top}");
    assert!(top.contains("unknown field `api-url`"), "{top}");
}

#[test]
fn bad_uuid_names_the_key_and_line() {
    let e = err("api_url: https://a.example\nregistration:\n  project_id: not-a-uuid\n");
    assert!(e.starts_with("/etc/plexd/config.yaml:3:"), "{e}");
    assert!(e.contains("registration.project_id"), "{e}");
}

#[test]
fn bad_handle_and_pin_and_level_are_refused() {
    let e = err("registration:\n  resource_handle: Web_1!\n");
    assert!(e.contains("registration.resource_handle"), "{e}");
    assert!(e.contains("/etc/plexd/config.yaml:2:"), "{e}");
    let e = err("tls:\n  ca_sha256: abc\n");
    assert!(e.contains("tls.ca_sha256") && e.contains("SHA-256"), "{e}");
    let e = err("log:\n  level: \"x=[\"\n");
    assert!(e.contains("log.level"), "{e}");
}

#[test]
fn http_url_is_refused_unless_allowed() {
    let e = err("# hi\napi_url: http://a.example\n");
    assert!(e.starts_with("/etc/plexd/config.yaml:2:1: api_url:"), "{e}");
    assert!(e.contains("allow_insecure_http"), "{e}");
    let c = parse("api_url: http://a.example\nallow_insecure_http: true\n").unwrap();
    assert!(!c.api_url.unwrap().is_https());
    let e = err("api_url: ftp://a.example\n");
    assert!(e.contains("api_url") && e.contains("ftp"), "{e}");
    let e = err("api_url: 42\n");
    assert!(e.contains("api_url"), "{e}");
}

#[test]
fn empty_file_is_an_error() {
    for text in ["", "\n\n", "# only a comment\n", "---\n"] {
        let e = parse(text).unwrap_err();
        assert!(matches!(e, ConfigError::Empty { .. }), "{text:?}: {e}");
        assert!(e.to_string().contains("is empty"), "{e}");
    }
}

#[test]
fn not_a_mapping_is_an_error() {
    let e = err("- a\n- b\n");
    assert!(e.contains("must be a YAML mapping"), "{e}");
    assert!(e.starts_with("/etc/plexd/config.yaml:1:1:"), "{e}");
    let e = err("just a string\n");
    assert!(e.contains("must be a YAML mapping"), "{e}");
}

#[test]
fn syntax_error_has_a_location() {
    let e = err("api_url: https://a.example\ntls:\n  ca_file: [\n");
    assert!(e.starts_with("/etc/plexd/config.yaml:"), "{e}");
    assert!(
        e.split(':')
            .nth(1)
            .is_some_and(|l| l.parse::<usize>().is_ok()),
        "{e}"
    );
}

#[test]
fn missing_api_url_is_reported_when_required() {
    let c = parse("state_dir: /x\n").unwrap();
    let e = c
        .require_api_url(Path::new("/c.yaml"))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("/c.yaml: `api_url` is not set"), "{e}");
}

#[test]
fn serialization_round_trips() {
    let text = "api_url: https://a.example\ntls:\n  ca_file: /x.pem\nregistration:\n  resource_handle: web-1\n";
    let c = parse(text).unwrap();
    let out = serde_yaml::to_string(&c).unwrap();
    assert_eq!(parse(&out).unwrap(), c);
    assert!(!out.contains("allow_insecure_http"), "{out}");
    assert!(!out.contains("log"), "{out}");
}

#[test]
fn read_error_names_the_file() {
    let e = Config::load(Path::new("/nonexistent/plexd/config.yaml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent/plexd/config.yaml"), "{e}");
    assert!(e.contains("plexd install"), "{e}");
}

#[test]
fn wireguard_and_daemon_sections_default_and_parse() {
    let c = parse("api_url: https://a.example\n").unwrap();
    assert_eq!(c.wireguard.backend, Backend::Auto);
    assert_eq!(c.wireguard.interface, "plexd0");
    assert_eq!(c.wireguard.listen_port, 51820);
    assert_eq!(c.wireguard.mtu, 1420);
    assert_eq!(c.daemon.stall_timeout_secs, 30);
    assert_eq!(c.daemon.ingest_capacity, 1024);
    let out = serde_yaml::to_string(&c).unwrap();
    assert!(
        !out.contains("wireguard") && !out.contains("daemon"),
        "{out}"
    );

    let text = "api_url: https://a.example\nwireguard:\n  backend: none\n  interface: wg-mesh\n  listen_port: 51999\n  mtu: 1380\ndaemon:\n  stall_timeout_secs: 3\n  min_interval_secs: 1\n  intervals:\n    heartbeat_secs: 2\n  backoff_initial_ms: 100\n  backoff_cap_secs: 2\n";
    let c = parse(text).unwrap();
    assert_eq!(c.wireguard.backend, Backend::None);
    assert_eq!(c.wireguard.interface, "wg-mesh");
    assert_eq!(c.wireguard.listen_port, 51999);
    assert_eq!(c.daemon.stall_timeout_secs, 3);
    let merged = c
        .daemon
        .intervals
        .apply(plexsphere_wire::Intervals::default());
    assert_eq!(merged.heartbeat_secs, 2);
    assert_eq!(merged.state_poll_secs, 300);
    assert_eq!(parse(&serde_yaml::to_string(&c).unwrap()).unwrap(), c);
}

#[test]
fn bad_wireguard_and_daemon_values_name_the_key() {
    let e = err("wireguard:\n  backend: fast\n");
    assert!(
        e.contains("wireguard.backend") && e.contains("unknown variant"),
        "{e}"
    );
    let e = err("wireguard:\n  interface: \"way-too-long-interface\"\n");
    assert!(
        e.starts_with("/etc/plexd/config.yaml:2:3: wireguard.interface"),
        "{e}"
    );
    let e = err("wireguard:\n  mtu: 100\n");
    assert!(e.contains("wireguard.mtu"), "{e}");
    let e = err("wireguard:\n  crypto_workers: 65\n");
    assert!(
        e.starts_with("/etc/plexd/config.yaml:2:3: wireguard.crypto_workers: 65 is over 64"),
        "{e}"
    );
    let e = err("wireguard:\n  crypto_workers: -1\n");
    assert!(e.contains("wireguard.crypto_workers"), "{e}");
    let e = err("daemon:\n  stall_timeout_secs: 0\n");
    assert!(
        e.starts_with("/etc/plexd/config.yaml:2:3: daemon.stall_timeout_secs"),
        "{e}"
    );
    let e = err("daemon:\n  stall_timeout: 5\n");
    assert!(e.contains("unknown field `stall_timeout`"), "{e}");
    let e = err("daemon:\n  backoff_initial_ms: 5000\n  backoff_cap_secs: 1\n");
    assert!(e.contains("daemon.backoff_initial_ms"), "{e}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// Arbitrary text never panics the parser: it is a config or a one-line error.
    #[test]
    fn config_parser_never_panics(text in "\\PC{0,200}") {
        if let Err(e) = parse(&text) {
            proptest::prop_assert!(!e.to_string().is_empty());
        }
    }

    /// YAML-ish text built from real keys never panics either.
    #[test]
    fn config_parser_never_panics_on_keyish_text(
        parts in proptest::collection::vec(
            proptest::sample::select(vec!["api_url: ", "wireguard:\n", "  backend: ", "daemon:\n",
                "  stall_timeout_secs: ", "none", "0", "-1", "https://a.example", "\n", "  ", "[", "{", "\"", "tls:\n", "  mtu: ", "99999999999999999999"]),
            0..24)
    ) {
        let text: String = parts.concat();
        let _ = parse(&text);
    }
}

#[test]
fn the_reach_section_defaults_on_and_still_reads_the_old_kernel_port() {
    let c = Config::parse("api_url: https://a.example\n", Path::new("c.yaml")).unwrap();
    assert!(c.wireguard.reach.enabled);
    let text = "api_url: https://a.example\nwireguard:\n  reach:\n    enabled: false\n";
    let c = Config::parse(text, Path::new("c.yaml")).unwrap();
    assert!(!c.wireguard.reach.enabled);
    // A config of an earlier plexd (the kernel on a port of its own) still starts, even with
    // the kernel port equal to listen_port or past the last port.
    for text in [
        "api_url: https://a.example\nwireguard:\n  reach:\n    kernel_port: 40000\n",
        "api_url: https://a.example\nwireguard:\n  listen_port: 51820\n  reach:\n    kernel_port: 51820\n",
        "api_url: https://a.example\nwireguard:\n  listen_port: 65535\n",
    ] {
        Config::parse(text, Path::new("c.yaml")).unwrap_or_else(|e| panic!("{text}: {e}"));
    }
    let text = "api_url: https://a.example\nwireguard:\n  reach:\n    relay: x\n";
    assert!(Config::parse(text, Path::new("c.yaml")).is_err());
}

#[test]
fn metrics_listen_is_off_by_default_loopback_only_unless_allowed() {
    let c = parse("api_url: https://a.example\n").unwrap();
    assert_eq!(c.metrics.listen, None);
    let c = parse("api_url: https://a.example\nmetrics:\n  listen: 127.0.0.1:9586\n").unwrap();
    assert_eq!(c.metrics.listen, Some("127.0.0.1:9586".parse().unwrap()));
    let e = err("api_url: https://a.example\nmetrics:\n  listen: 0.0.0.0:9586\n");
    assert!(
        e.starts_with(
            "/etc/plexd/config.yaml:3:3: metrics.listen: 0.0.0.0:9586 is not a loopback address"
        ),
        "{e}"
    );
    let c = parse(
        "api_url: https://a.example\nmetrics:\n  listen: 0.0.0.0:9586\n  allow_non_loopback: true\n",
    )
    .unwrap();
    assert!(c.metrics.allow_non_loopback);
    let e = err("api_url: https://a.example\nmetrics:\n  listen: localhost:9586\n");
    assert!(e.contains("metrics.listen"), "{e}");
}
