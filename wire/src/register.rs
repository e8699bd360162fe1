//! `POST /v1/register`: a node trades a single-use bootstrap token for its identity.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The largest body `/v1/register` accepts, in bytes.
pub const MAX_REGISTER_BODY: usize = 16 * 1024;

/// The node's registration request. Unknown fields are refused, so a typo never passes silently.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    /// The bootstrap token's full text (`pxbt_...`).
    pub bootstrap_token: String,
    /// The node's WireGuard public key, standard base64 of 32 bytes (as `wg pubkey` prints it).
    pub wireguard_public_key: String,
    pub hostname: String,
    /// `amd64` or `arm64` (Debian names).
    pub arch: String,
    pub plexd_version: String,
    /// `registration.project_id` from the node's config, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<Uuid>,
    /// `registration.resource_handle` from the node's config, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_handle: Option<String>,
    /// The nonce of `POST /v1/register/challenge` (bound to the token, expiring). Required by
    /// this control plane; absent only from a plexd too old to prove its key (refused with
    /// `proof_required`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    /// The proof of possession of the WireGuard private key
    /// ([`crate::proof::prove_register`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<String>,
}

/// How often the node should do each periodic task, in seconds. The node adds jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intervals {
    pub heartbeat_secs: u32,
    pub endpoint_report_secs: u32,
    pub state_poll_secs: u32,
    pub ingest_secs: u32,
}

impl Default for Intervals {
    fn default() -> Self {
        Self {
            heartbeat_secs: 30,
            endpoint_report_secs: 60,
            state_poll_secs: 300,
            ingest_secs: 60,
        }
    }
}

/// The answer to a successful registration (HTTP 201, or 200 for a replay by the same key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterResponse {
    pub node_id: Uuid,
    pub domain_id: Uuid,
    pub project_id: Uuid,
    /// The node's address inside the mesh.
    pub mesh_ip: IpAddr,
    /// The Domain's whole mesh range; the node's interface carries `mesh_ip` with this prefix.
    pub mesh_cidr: IpNet,
    /// The credential the node authenticates every later call with (`pxnk_...`).
    pub node_credential: String,
    /// The Domain's Ed25519 public key (standard base64, 32 bytes) that signs state and events.
    pub domain_signing_public_key: String,
    pub intervals: Intervals,
    /// The Domain's next signing key when a rotation's overlap is under way (as in the signed
    /// state); absent otherwise, so the answer to an older node stays the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_signing_key: Option<crate::signing_keys::SigningKey>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_json_is_pinned_and_strict() {
        let json = r#"{"bootstrap_token":"pxbt_lab_node_x","wireguard_public_key":"k","hostname":"h","arch":"amd64","plexd_version":"0.1.0","project_id":"019a0816-0000-7000-8000-000000000002","resource_handle":"web-1"}"#;
        let r: RegisterRequest = serde_json::from_str(json).unwrap();
        assert_eq!(serde_json::to_string(&r).unwrap(), json);
        let minimal = r#"{"bootstrap_token":"t","wireguard_public_key":"k","hostname":"h","arch":"arm64","plexd_version":"1"}"#;
        let r: RegisterRequest = serde_json::from_str(minimal).unwrap();
        assert_eq!(r.project_id, None);
        assert_eq!((r.nonce, r.proof), (None, None));
        let proved = r#"{"bootstrap_token":"t","wireguard_public_key":"k","hostname":"h","arch":"arm64","plexd_version":"1","nonce":"n","proof":"p"}"#;
        let r: RegisterRequest = serde_json::from_str(proved).unwrap();
        assert_eq!(serde_json::to_string(&r).unwrap(), proved);
        let typo = r#"{"bootstrap_token":"t","wireguard_public_key":"k","hostname":"h","arch":"arm64","plexd_version":"1","projectid":"x"}"#;
        let err = serde_json::from_str::<RegisterRequest>(typo).unwrap_err();
        assert!(
            err.to_string().contains("unknown field `projectid`"),
            "{err}"
        );
    }

    #[test]
    fn response_json_is_pinned() {
        let json = r#"{"node_id":"019a0816-0000-7000-8000-0000000000aa","domain_id":"019a0816-0000-7000-8000-000000000001","project_id":"019a0816-0000-7000-8000-000000000002","mesh_ip":"10.64.1.2","mesh_cidr":"10.64.0.0/16","node_credential":"pxnk_x","domain_signing_public_key":"AAAA","intervals":{"heartbeat_secs":30,"endpoint_report_secs":60,"state_poll_secs":300,"ingest_secs":60}}"#;
        let r: RegisterResponse = serde_json::from_str(json).unwrap();
        assert_eq!(r.mesh_ip.to_string(), "10.64.1.2");
        assert_eq!(r.intervals, Intervals::default());
        assert_eq!(serde_json::to_string(&r).unwrap(), json);
    }
}
