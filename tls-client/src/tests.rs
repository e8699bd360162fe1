use rustls::client::danger::ServerCertVerifier as _;
use rustls_pki_types::{ServerName, UnixTime};

use super::*;

fn test_ca() -> (rcgen::Certificate, rcgen::Issuer<'static, rcgen::KeyPair>) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert, rcgen::Issuer::new(params, key))
}

#[test]
fn ca_file_problems_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let e = load_pem_certs(&missing).unwrap_err();
    assert!(matches!(
        e,
        TrustError::CaFile {
            problem: CaFileProblem::Unreadable(_),
            ..
        }
    ));
    assert!(e.to_string().contains("missing.pem"), "{e}");

    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "hello, not a certificate\n").unwrap();
    let e = load_pem_certs(&junk).unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "cannot use the CA file {}: it holds no PEM certificate (no CERTIFICATE block)",
            junk.display()
        )
    );

    let broken = dir.path().join("broken.pem");
    std::fs::write(
        &broken,
        "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let e = load_pem_certs(&broken).unwrap_err().to_string();
    assert!(e.contains("broken.pem") && e.contains("not PEM"), "{e}");
}

#[test]
fn a_ca_file_becomes_a_root_and_alpn_is_the_callers() {
    let (ca, _) = test_ca();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ca.pem");
    std::fs::write(&p, ca.pem()).unwrap();
    let trust = Trust {
        system_store: false,
        ca_files: vec![p],
        pin: None,
    };
    assert_eq!(root_store(&trust).unwrap().len(), 1);
    let config = client_config(&trust, ALPN_H2_HTTP1).unwrap();
    assert_eq!(
        config.alpn_protocols,
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    );
    let config = client_config(&Trust::default(), ALPN_HTTP1).unwrap();
    assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
}

#[test]
fn a_pin_trusts_its_ca_alone_and_no_roots_trust_nothing() {
    let (ca, issuer) = test_ca();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let (leaf, ca) = (leaf.der().clone(), ca.der().clone());
    let name = ServerName::try_from("localhost").unwrap();
    let verify = |pin: Option<[u8; 32]>| {
        PinnedVerifier::new(pin, None, provider()).verify_server_cert(
            &leaf,
            std::slice::from_ref(&ca),
            &name,
            &[],
            UnixTime::now(),
        )
    };
    assert!(verify(Some(fingerprint(&ca))).is_ok());
    let unknown = Err(rustls::Error::InvalidCertificate(
        rustls::CertificateError::UnknownIssuer,
    ));
    assert_eq!(verify(Some([0; 32])).map(|_| ()), unknown);
    assert_eq!(verify(None).map(|_| ()), unknown);
    let other = ServerName::try_from("elsewhere").unwrap();
    let wrong_name = PinnedVerifier::new(Some(fingerprint(&ca)), None, provider())
        .verify_server_cert(
            &leaf,
            std::slice::from_ref(&ca),
            &other,
            &[],
            UnixTime::now(),
        );
    assert!(wrong_name.is_err(), "a pin never skips the name check");
}
