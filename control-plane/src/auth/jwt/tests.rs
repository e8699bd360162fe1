use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
use serde_json::json;

use super::*;

const ISS: &str = "http://127.0.0.1:9";
const NOW: i64 = 1_800_000_000;

fn enc(v: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v)
}

struct Key {
    pair: EcdsaKeyPair,
    kid: String,
}

fn key(kid: &str) -> Key {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let pair =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    Key {
        pair,
        kid: kid.into(),
    }
}

impl Key {
    fn jwk(&self) -> Jwk {
        let p = self.pair.public_key().as_ref();
        Jwk {
            kty: "EC".into(),
            kid: Some(self.kid.clone()),
            alg: Some("ES256".into()),
            use_: Some("sig".into()),
            n: None,
            e: None,
            crv: Some("P-256".into()),
            x: Some(enc(&p[1..33])),
            y: Some(enc(&p[33..65])),
        }
    }

    fn sign(&self, header: Value, claims: Value) -> String {
        let signed = format!(
            "{}.{}",
            enc(header.to_string().as_bytes()),
            enc(claims.to_string().as_bytes())
        );
        let sig = self
            .pair
            .sign(&SystemRandom::new(), signed.as_bytes())
            .unwrap();
        format!("{signed}.{}", enc(sig.as_ref()))
    }
}

fn claims() -> Value {
    json!({"iss": ISS, "aud": "console", "sub": "alice", "email": "alice@example.test",
           "groups": ["ops"], "nonce": "n1", "iat": NOW - 5, "exp": NOW + 3600})
}

fn expect() -> Expect<'static> {
    Expect {
        issuer: ISS,
        client_id: "console",
        nonce: Some("n1"),
        now: NOW,
    }
}

fn jwks(k: &Key) -> Jwks {
    Jwks {
        keys: vec![k.jwk()],
    }
}

#[test]
fn a_good_es256_token_verifies_with_its_claims() {
    let k = key("k1");
    let t = k.sign(json!({"alg": "ES256", "kid": "k1"}), claims());
    let c = verify(&t, &jwks(&k), &expect()).unwrap();
    assert_eq!(c.subject, "alice");
    assert_eq!(c.email.as_deref(), Some("alice@example.test"));
    assert_eq!(c.groups("groups"), vec!["ops".to_owned()]);
}

#[test]
fn alg_none_and_hmac_are_refused_before_any_key() {
    let k = key("k1");
    let none = format!(
        "{}.{}.",
        enc(br#"{"alg":"none"}"#),
        enc(claims().to_string().as_bytes())
    );
    assert_eq!(
        verify(&none, &jwks(&k), &expect()).unwrap_err(),
        TokenError::Algorithm("none".into())
    );
    let hs = k.sign(json!({"alg": "HS256", "kid": "k1"}), claims());
    assert_eq!(
        verify(&hs, &jwks(&k), &expect()).unwrap_err(),
        TokenError::Algorithm("HS256".into())
    );
}

#[test]
fn a_token_signed_by_another_key_with_the_issuers_kid_is_forged() {
    let real = key("k1");
    let forger = key("k1");
    let t = forger.sign(json!({"alg": "ES256", "kid": "k1"}), claims());
    assert_eq!(
        verify(&t, &jwks(&real), &expect()).unwrap_err(),
        TokenError::Signature
    );
}

#[test]
fn an_unknown_kid_is_named() {
    let k = key("k1");
    let t = k.sign(json!({"alg": "ES256", "kid": "k2"}), claims());
    assert_eq!(
        verify(&t, &jwks(&k), &expect()).unwrap_err(),
        TokenError::UnknownKey("k2".into())
    );
}

#[test]
fn issuer_audience_expiry_and_nonce_are_checked() {
    let k = key("k1");
    let sign = |f: &dyn Fn(&mut Value)| {
        let mut c = claims();
        f(&mut c);
        k.sign(json!({"alg": "ES256", "kid": "k1"}), c)
    };
    let j = jwks(&k);
    let e = expect();
    assert!(matches!(
        verify(&sign(&|c| c["iss"] = json!("http://evil")), &j, &e),
        Err(TokenError::Issuer(_))
    ));
    assert!(matches!(
        verify(&sign(&|c| c["aud"] = json!("plexctl")), &j, &e),
        Err(TokenError::Audience(_))
    ));
    assert!(matches!(
        verify(&sign(&|c| c["aud"] = json!(["console", "other"])), &j, &e),
        Err(TokenError::Audience(_))
    ));
    assert!(
        verify(
            &sign(&|c| {
                c["aud"] = json!(["console", "other"]);
                c["azp"] = json!("console");
            }),
            &j,
            &e
        )
        .is_ok()
    );
    assert!(matches!(
        verify(&sign(&|c| c["exp"] = json!(NOW - 61)), &j, &e),
        Err(TokenError::Expired(_))
    ));
    assert!(
        verify(&sign(&|c| c["exp"] = json!(NOW - 59)), &j, &e).is_ok(),
        "60 s of skew"
    );
    assert!(matches!(
        verify(&sign(&|c| c["iat"] = json!(NOW + 120)), &j, &e),
        Err(TokenError::NotYetValid(_))
    ));
    assert!(matches!(
        verify(&sign(&|c| c["nbf"] = json!(NOW + 120)), &j, &e),
        Err(TokenError::NotYetValid(_))
    ));
    assert_eq!(
        verify(&sign(&|c| c["nonce"] = json!("n2")), &j, &e).unwrap_err(),
        TokenError::Nonce
    );
    assert_eq!(
        verify(&sign(&|c| c["sub"] = json!("")), &j, &e).unwrap_err(),
        TokenError::Missing("sub")
    );
    let unverified = verify(&sign(&|c| c["email_verified"] = json!(false)), &j, &e).unwrap();
    assert_eq!(unverified.email, None, "an unverified address is not used");
}

#[test]
fn a_tampered_payload_fails_the_signature() {
    let k = key("k1");
    let t = k.sign(json!({"alg": "ES256", "kid": "k1"}), claims());
    let mut parts: Vec<String> = t.split('.').map(str::to_owned).collect();
    let mut c = claims();
    c["sub"] = json!("mallory");
    parts[1] = enc(c.to_string().as_bytes());
    assert_eq!(
        verify(&parts.join("."), &jwks(&k), &expect()).unwrap_err(),
        TokenError::Signature
    );
}
