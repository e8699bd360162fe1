use super::*;

fn req() -> RegisterRequest {
    RegisterRequest {
        bootstrap_token: String::new(),
        wireguard_public_key: STANDARD.encode([7u8; 32]),
        hostname: "node-1.lab".into(),
        arch: "amd64".into(),
        plexd_version: "0.1.0".into(),
        project_id: None,
        resource_handle: Some("web-1".into()),
        nonce: None,
        proof: None,
    }
}

#[test]
fn validation_names_the_bad_field() {
    assert!(validate(&req()).is_ok());
    let bad = |f: fn(&mut RegisterRequest), word: &str| {
        let mut r = req();
        f(&mut r);
        let e = validate(&r).unwrap_err().to_string();
        assert!(e.contains(word), "{e}");
    };
    bad(
        |r| r.wireguard_public_key = STANDARD.encode([1u8; 31]),
        "wireguard_public_key",
    );
    bad(
        |r| r.wireguard_public_key = "not base64!".into(),
        "wireguard_public_key",
    );
    bad(|r| r.hostname = String::new(), "hostname");
    bad(|r| r.hostname = "a".repeat(254), "hostname");
    bad(|r| r.hostname = "bad host".into(), "hostname");
    bad(|r| r.arch = "x86_64".into(), "arch");
    bad(
        |r| r.resource_handle = Some("Web".into()),
        "resource_handle",
    );
    bad(
        |r| r.resource_handle = Some("a".repeat(64)),
        "resource_handle",
    );
    bad(|r| r.plexd_version = String::new(), "plexd_version");
}

fn row(token: &BootstrapToken) -> TokenRow {
    TokenRow {
        id: token.id.clone(),
        project_id: Uuid::from_u128(1),
        kind: "node".into(),
        env_prefix: "lab".into(),
        secret_sha256: store::secret_digest(&token.secret),
        created_at: 100,
        expires_at: 200,
        consumed_at: None,
        consumed_by_node: None,
        revoked_at: None,
        resource_id: None,
        usage: crate::store::tokens::TokenUsage::default(),
        uses: 0,
        tags: Vec::new(),
    }
}

#[test]
fn judging_a_token() {
    let t = BootstrapToken::generate("lab", TokenKind::Node).unwrap();
    let r = row(&t);
    assert_eq!(judge(&r, &t, None, 150, None).unwrap(), TokenVerdict::Fresh);
    assert_eq!(
        judge(&r, &t, Some(Uuid::from_u128(1)), 150, None).unwrap(),
        TokenVerdict::Fresh
    );
    assert!(matches!(
        judge(&r, &t, Some(Uuid::from_u128(2)), 150, None),
        Err(Error::ProjectMismatch)
    ));
    assert!(matches!(
        judge(&r, &t, None, 200, None),
        Err(Error::TokenExpired)
    ));
    let other = BootstrapToken::generate("lab", TokenKind::Node).unwrap();
    assert!(matches!(
        judge(&r, &other, None, 150, None),
        Err(Error::TokenUnknown)
    ));
    let revoked = TokenRow {
        revoked_at: Some(120),
        ..r.clone()
    };
    assert!(matches!(
        judge(&revoked, &t, None, 150, None),
        Err(Error::TokenRevoked)
    ));
    // A replay by the node's key is refused once the token is revoked.
    assert!(matches!(
        judge(&revoked, &t, None, 150, Some((Uuid::from_u128(9), 120))),
        Err(Error::TokenRevoked)
    ));
    let used = TokenRow {
        consumed_at: Some(120),
        consumed_by_node: Some(Uuid::from_u128(9)),
        uses: 1,
        ..r.clone()
    };
    let made = Some((Uuid::from_u128(9), 120));
    // A used token stays replayable by the key of the node it made after its expiry, within
    // the replay window after that node registered.
    assert_eq!(
        judge(&used, &t, None, 500, made).unwrap(),
        TokenVerdict::Replay(Uuid::from_u128(9))
    );
    assert_eq!(
        judge(&used, &t, None, 120 + REPLAY_WINDOW_SECS - 1, made).unwrap(),
        TokenVerdict::Replay(Uuid::from_u128(9))
    );
    // Another key finds it used up.
    assert!(matches!(
        judge(&used, &t, None, 150, None),
        Err(Error::TokenConsumed)
    ));
    // Past the window, the token and the node's public key (every peer sees it) no longer
    // mint a credential.
    assert!(matches!(
        judge(&used, &t, None, 120 + REPLAY_WINDOW_SECS, made),
        Err(Error::TokenConsumed)
    ));
    assert!(matches!(
        judge(&used, &t, None, i64::MAX, made),
        Err(Error::TokenConsumed)
    ));
    let odd_kind = TokenRow {
        kind: "user".into(),
        ..r
    };
    assert!(matches!(
        judge(&odd_kind, &t, None, 150, None),
        Err(Error::TokenKindMismatch)
    ));
}

#[test]
fn a_reusable_token_serves_until_its_last_use_and_replays_take_none() {
    let t = BootstrapToken::generate("lab", TokenKind::Node).unwrap();
    let r = TokenRow {
        usage: crate::store::tokens::TokenUsage {
            max_uses: 3,
            ephemeral_offline_secs: None,
        },
        uses: 2,
        ..row(&t)
    };
    // Two of three uses taken: a new key gets a fresh use, a key the token made a node for
    // replays (whatever the count).
    assert_eq!(judge(&r, &t, None, 150, None).unwrap(), TokenVerdict::Fresh);
    assert_eq!(
        judge(&r, &t, None, 150, Some((Uuid::from_u128(4), 140))).unwrap(),
        TokenVerdict::Replay(Uuid::from_u128(4))
    );
    let full = TokenRow { uses: 3, ..r };
    assert!(matches!(
        judge(&full, &t, None, 150, None),
        Err(Error::TokenConsumed)
    ));
    assert_eq!(
        judge(&full, &t, None, 150, Some((Uuid::from_u128(4), 140))).unwrap(),
        TokenVerdict::Replay(Uuid::from_u128(4))
    );
}
