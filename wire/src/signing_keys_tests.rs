use super::*;

fn signer(n: u8) -> DomainSigner {
    DomainSigner::from_seed(&[n; 32]).unwrap()
}

fn domain() -> Uuid {
    Uuid::parse_str("019a0816-0000-7000-8000-000000000001").unwrap()
}

/// Keys 1..=n of one Domain and the transitions between them.
fn chain(n: u8) -> (Vec<DomainSigner>, SigningKeyChain) {
    let signers: Vec<_> = (1..=n).map(signer).collect();
    let transitions = (1..signers.len())
        .map(|i| {
            let key = SigningKey {
                generation: u64::try_from(i + 1).unwrap(),
                public_key: signers[i].public_key_b64(),
                active_from: 1_000 * i64::try_from(i).unwrap(),
            };
            KeyTransition::sign(&signers[i - 1], domain(), key)
        })
        .collect();
    (signers, SigningKeyChain { transitions })
}

#[test]
fn a_node_follows_the_chain_from_its_pinned_key() {
    let (signers, chain) = chain(4);
    let from_first = follow(domain(), &signers[0].public_key_b64(), &chain).unwrap();
    assert_eq!(
        from_first.iter().map(|k| k.generation).collect::<Vec<_>>(),
        vec![2, 3, 4]
    );
    let from_third = follow(domain(), &signers[2].public_key_b64(), &chain).unwrap();
    assert_eq!(from_third.len(), 1);
    assert_eq!(from_third[0].public_key, signers[3].public_key_b64());
    assert!(
        follow(domain(), &signers[3].public_key_b64(), &chain)
            .unwrap()
            .is_empty()
    );
    assert!(
        follow(
            domain(),
            &signers[0].public_key_b64(),
            &SigningKeyChain {
                transitions: vec![]
            }
        )
        .unwrap()
        .is_empty()
    );
}

#[test]
fn a_key_the_pinned_key_never_vouched_for_is_refused() {
    let (_, chain) = chain(3);
    let stranger = signer(99).public_key_b64();
    assert_eq!(
        follow(domain(), &stranger, &chain),
        Err(ChainError::NotFromPinned)
    );
}

#[test]
fn a_forged_link_after_a_good_one_breaks_the_chain() {
    let (signers, mut chain) = chain(3);
    // Generation 3 "signed" by an attacker's key instead of generation 2.
    let forged = KeyTransition::sign(
        &signer(66),
        domain(),
        SigningKey {
            generation: 3,
            public_key: signer(67).public_key_b64(),
            active_from: 5,
        },
    );
    chain.transitions[1] = forged;
    assert_eq!(
        follow(domain(), &signers[0].public_key_b64(), &chain),
        Err(ChainError::Broken {
            generation: 3,
            previous: 2
        })
    );
}

#[test]
fn a_changed_statement_fails_its_signature() {
    let (signers, mut chain) = chain(2);
    chain.transitions[0].key.active_from += 1;
    assert_eq!(
        follow(domain(), &signers[0].public_key_b64(), &chain),
        Err(ChainError::NotFromPinned)
    );
    let t = &chain.transitions[0];
    assert!(
        t.verify(&DomainVerifier::from_b64(&signers[0].public_key_b64()).unwrap())
            .is_err()
    );
}

#[test]
fn another_domains_transition_and_an_overlong_chain_are_refused() {
    let (signers, mut chain) = chain(2);
    let other = Uuid::parse_str("019a0816-0000-7000-8000-0000000000ff").unwrap();
    chain.transitions[0].domain_id = other;
    assert_eq!(
        follow(domain(), &signers[0].public_key_b64(), &chain),
        Err(ChainError::OtherDomain(other))
    );
    let long = SigningKeyChain {
        transitions: vec![chain.transitions[0].clone(); MAX_KEY_CHAIN + 1],
    };
    assert_eq!(
        follow(domain(), &signers[0].public_key_b64(), &long),
        Err(ChainError::TooLong(MAX_KEY_CHAIN + 1))
    );
}

#[test]
fn the_json_is_pinned() {
    let t = KeyTransition {
        domain_id: domain(),
        key: SigningKey {
            generation: 2,
            public_key: "AAAA".into(),
            active_from: 1_800_000_000,
        },
        signature: "c2ln".into(),
    };
    let json = r#"{"domain_id":"019a0816-0000-7000-8000-000000000001","key":{"generation":2,"public_key":"AAAA","active_from":1800000000},"signature":"c2ln"}"#;
    assert_eq!(serde_json::to_string(&t).unwrap(), json);
    assert_eq!(serde_json::from_str::<KeyTransition>(json).unwrap(), t);
}
