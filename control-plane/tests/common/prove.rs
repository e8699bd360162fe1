//! Registrations need a proof of the WireGuard private key: the tests' keys are made from
//! secrets remembered here, and [`prove_body`] asks for the challenge and adds the proof.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use plexsphere_wire::proof::{Challenge, REGISTER_CHALLENGE_PATH, prove_register};
use plexsphere_wire::secret::BootstrapToken;
use serde_json::Value;

fn known() -> &'static Mutex<HashMap<String, [u8; 32]>> {
    static KNOWN: OnceLock<Mutex<HashMap<String, [u8; 32]>>> = OnceLock::new();
    KNOWN.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The public key (standard base64) of `secret`, remembered so a registration can prove it.
pub fn remember(secret: [u8; 32]) -> String {
    let public = plexsphere_wire::reach::public_key(&secret).to_base64();
    known().lock().unwrap().insert(public.clone(), secret);
    public
}

/// The secret of a public key made by [`remember`].
pub fn secret_of(public: &str) -> Option<[u8; 32]> {
    known().lock().unwrap().get(public).copied()
}

/// The secret of key number `n`.
pub fn wg_secret(n: u32) -> [u8; 32] {
    let mut k = [0u8; 32];
    k[..4].copy_from_slice(&n.to_be_bytes());
    k[31] = 0x5a;
    k
}

/// `body` with `nonce` and `proof` added (a challenge from `base`) when it has none, its key is
/// one of [`remember`]'s and the challenge is answered; otherwise `body` as it is (a refused
/// challenge: the registration is refused for the same reason).
pub async fn prove_body(client: &reqwest::Client, base: &str, body: &Value) -> Value {
    if body.get("nonce").is_some() {
        return body.clone();
    }
    let (Some(token), Some(key)) = (
        body["bootstrap_token"].as_str(),
        body["wireguard_public_key"].as_str(),
    ) else {
        return body.clone();
    };
    let Some(secret) = secret_of(key) else {
        return body.clone();
    };
    let Ok(parsed) = BootstrapToken::parse(token) else {
        return body.clone();
    };
    // A server that does not answer (killed by a crash test) fails the registration too.
    let Ok(r) = client
        .post(format!("{base}{REGISTER_CHALLENGE_PATH}"))
        .json(&serde_json::json!({ "bootstrap_token": token }))
        .send()
        .await
    else {
        return body.clone();
    };
    if r.status() != reqwest::StatusCode::OK {
        return body.clone();
    }
    let Ok(c) = r.json::<Challenge>().await else {
        return body.clone();
    };
    let server = plexsphere_wire::key::PublicKey::from_base64(&c.server_public_key).unwrap();
    let mut out = body.clone();
    out["proof"] = prove_register(&secret, &server, &parsed.id, &c.nonce).into();
    out["nonce"] = c.nonce.into();
    out
}
