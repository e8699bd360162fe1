//! The local-machine substrate's pure decisions: which parameters this host honours, a
//! machine's name, the address it gets on the bridge, and what `plexd join`'s result file in a
//! machine means. No I/O; `mod.rs` does the machines.

use std::collections::BTreeSet;

use ipnet::Ipv4Net;
use plexsphere_broker::{Observation, Resource};
use plexsphere_wire::node::JoinResult;

use crate::broker::substrate::SubstrateError;

/// The host's architecture as plexd names it.
pub(crate) fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "arm64",
        "x86_64" => "amd64",
        other => other,
    }
}

/// Refuses parameters this host cannot honour: an architecture other than the host's, a
/// release other than the base image's (`image_suite`).
pub(crate) fn check_parameters(
    resource: &Resource,
    host_arch: &str,
    image_suite: &str,
) -> Result<(), SubstrateError> {
    let param = |name: &str| resource.parameters.get(name).and_then(|v| v.as_str());
    let arch = param("arch").unwrap_or(host_arch);
    if arch != host_arch {
        return Err(SubstrateError::Failed(format!(
            "a local machine runs the host's architecture ({host_arch}), not {arch}"
        )));
    }
    match param("release") {
        Some(release) if release == image_suite => Ok(()),
        other => Err(SubstrateError::Failed(format!(
            "a local machine boots the Debian {image_suite} base image, not {}; create the resource with release {image_suite}",
            other.unwrap_or("a missing release")
        ))),
    }
}

/// `pr-<last 9 hex digits of the resource id>`. The name must stay short (nspawn names the
/// host side of the machine's veth `vb-<name>`, cut to 15 characters), and it must come from
/// the id's random tail: resource ids are UUIDv7, whose leading digits are a timestamp shared
/// by every resource created within about a minute.
pub(crate) fn machine_name(resource: &Resource) -> String {
    let id = resource.id.simple().to_string();
    format!("pr-{}", &id[id.len().saturating_sub(9)..])
}

/// The most of the join result file read from a machine; plexd writes well under 1 KiB.
pub(crate) const JOIN_RESULT_MAX_BYTES: usize = 8 * 1024;
/// The longest join message carried into a resource's reason (in characters).
pub(crate) const JOIN_MESSAGE_MAX_CHARS: usize = 512;

/// What `plexd join --result-file` left, as the observation it stands for: `None` unless the
/// bytes are its JSON with a non-zero `exit_code` and a `message`. The message is made one line
/// and cut to [`JOIN_MESSAGE_MAX_CHARS`] (marked with `...`), since it lands in the resource's
/// reason and history.
pub(crate) fn parse_join_result(bytes: &[u8]) -> Option<Observation> {
    // An object only: serde would also take a `[code, message]` array for the struct.
    let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    if !value.is_object() {
        return None;
    }
    let file: JoinResult = serde_json::from_value(value).ok()?;
    if file.exit_code == 0 {
        return None;
    }
    let one_line = file
        .message
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let detail = match one_line.char_indices().nth(JOIN_MESSAGE_MAX_CHARS) {
        Some((cut, _)) => format!("{}...", &one_line[..cut]),
        None if one_line.is_empty() => "(plexd printed no message)".to_owned(),
        None => one_line,
    };
    Some(Observation::JoinFailed {
        exit_code: file.exit_code,
        detail,
    })
}

/// The lowest host number from 10 up that no machine uses.
pub(crate) fn free_host(used: &BTreeSet<u32>, bridge: Ipv4Net) -> Option<u32> {
    let hosts = 1u64 << (32 - u32::from(bridge.prefix_len()));
    (10..u32::try_from(hosts.saturating_sub(1)).unwrap_or(u32::MAX))
        .find(|h| !used.contains(h) && plexsphere_nspawn::machine_address(bridge, *h).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_addresses() {
        let r = Resource::new(
            uuid::Uuid::from_u128(0x019fb9d7_fb6c_7681_a082_07407e041cc0),
            uuid::Uuid::from_u128(1),
            "node".into(),
            uuid::Uuid::from_u128(2),
            uuid::Uuid::from_u128(3),
            serde_json::Map::new(),
            time::OffsetDateTime::UNIX_EPOCH,
        );
        assert_eq!(machine_name(&r), "pr-07e041cc0");
        assert!(format!("vb-{}", machine_name(&r)).len() <= 15);
        // Two ids minted in the same millisecond share their leading digits, never the name.
        let mut other = r.clone();
        other.id = uuid::Uuid::from_u128(0x019fb9d7_fb6c_7681_a082_17407e041cc1);
        assert_ne!(machine_name(&r), machine_name(&other));
        let net: Ipv4Net = "172.30.231.1/24".parse().unwrap();
        assert_eq!(free_host(&BTreeSet::new(), net), Some(10));
        assert_eq!(free_host(&BTreeSet::from([10, 11, 13]), net), Some(12));
        let all: BTreeSet<u32> = (10..255).collect();
        assert_eq!(free_host(&all, net), None);
    }

    fn with(params: serde_json::Value) -> Resource {
        let serde_json::Value::Object(map) = params else {
            panic!("parameters must be an object");
        };
        Resource::new(
            uuid::Uuid::from_u128(1),
            uuid::Uuid::from_u128(1),
            "node".into(),
            uuid::Uuid::from_u128(2),
            uuid::Uuid::from_u128(3),
            map,
            time::OffsetDateTime::UNIX_EPOCH,
        )
    }

    #[test]
    fn a_join_result_becomes_join_failed() {
        let obs = parse_join_result(
            br#"{"exit_code": 11, "message": "the bootstrap token in /etc/plexd/bootstrap-token was refused: revoked (token_revoked, HTTP 403); write a fresh token"}"#,
        );
        assert_eq!(
            obs,
            Some(Observation::JoinFailed {
                exit_code: 11,
                detail: "the bootstrap token in /etc/plexd/bootstrap-token was refused: revoked (token_revoked, HTTP 403); write a fresh token".into(),
            })
        );
        // The reason the phase machine records names plexd join and its exit.
        let reason = obs.unwrap().describe();
        assert!(
            reason.starts_with("plexd join exited with 11: the bootstrap token"),
            "{reason}"
        );
        // A trailing newline (plexd writes one) and unknown fields are fine.
        let obs = parse_join_result(b"{\"exit_code\":10,\"message\":\"used\",\"extra\":1}\n");
        assert_eq!(
            obs,
            Some(Observation::JoinFailed {
                exit_code: 10,
                detail: "used".into()
            })
        );
    }

    #[test]
    fn garbage_or_incomplete_join_results_are_ignored() {
        for bad in [
            &b""[..],
            b"not json",
            b"{\"exit_code\": 11",
            b"{\"message\": \"m\"}",
            b"{\"exit_code\": 11}",
            b"{\"exit_code\": \"11\", \"message\": \"m\"}",
            b"{\"exit_code\": 0, \"message\": \"fine\"}",
            b"[11, \"m\"]",
            b"\xff\xfe",
        ] {
            assert_eq!(
                parse_join_result(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn an_overlong_or_multiline_message_is_cut_to_one_line() {
        let long = format!(
            "{}é{}",
            "a".repeat(JOIN_MESSAGE_MAX_CHARS - 1),
            "b".repeat(5000)
        );
        let json = serde_json::json!({"exit_code": 14, "message": long}).to_string();
        let Some(Observation::JoinFailed { exit_code, detail }) =
            parse_join_result(json.as_bytes())
        else {
            panic!("not parsed");
        };
        assert_eq!(exit_code, 14);
        assert_eq!(detail.chars().count(), JOIN_MESSAGE_MAX_CHARS + 3);
        assert!(detail.ends_with("é..."), "cut on a character boundary");
        let json =
            serde_json::json!({"exit_code": 13, "message": "line one\n  line two\r\n"}).to_string();
        assert_eq!(
            parse_join_result(json.as_bytes()),
            Some(Observation::JoinFailed {
                exit_code: 13,
                detail: "line one line two".into()
            })
        );
        let json = serde_json::json!({"exit_code": 13, "message": " "}).to_string();
        assert_eq!(
            parse_join_result(json.as_bytes()),
            Some(Observation::JoinFailed {
                exit_code: 13,
                detail: "(plexd printed no message)".into()
            })
        );
    }

    #[test]
    fn parameters_must_fit_the_host_and_the_image() {
        let ok = with(serde_json::json!({"arch": "amd64", "release": "bookworm"}));
        assert_eq!(check_parameters(&ok, "amd64", "bookworm"), Ok(()));
        let e = check_parameters(&ok, "arm64", "bookworm").unwrap_err();
        assert_eq!(
            e.to_string(),
            "a local machine runs the host's architecture (arm64), not amd64"
        );
        let e = check_parameters(&ok, "amd64", "trixie").unwrap_err();
        assert!(
            e.to_string()
                .contains("boots the Debian trixie base image, not bookworm"),
            "{e}"
        );
        let missing = with(serde_json::json!({"arch": "amd64"}));
        let e = check_parameters(&missing, "amd64", "bookworm").unwrap_err();
        assert!(e.to_string().contains("not a missing release"), "{e}");
        assert_eq!(plexsphere_nspawn::Recipe::bookworm().suite, "bookworm");
    }
}
