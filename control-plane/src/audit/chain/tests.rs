use super::*;

fn key() -> ChainKey {
    ChainKey::derive(&hmac::Key::new(hmac::HMAC_SHA256, &[7; 32]), "platform")
}

/// A chain of `n` rows as an append writes them, and its head.
fn chain(key: &ChainKey, n: i64) -> (Vec<Row>, Head) {
    let mut rows: Vec<Row> = Vec::new();
    let mut prev = GENESIS.to_owned();
    for seq in 1..=n {
        let mut row = Row {
            chain_id: "platform".into(),
            seq,
            at: 1_700_000_000 + seq,
            actor_kind: "token".into(),
            actor_ref: "op1".into(),
            actor_name: "ci".into(),
            actor_subject: String::new(),
            actor_email: String::new(),
            how: "token".into(),
            action: "node.revoke".into(),
            target: format!("node/{seq}"),
            detail: format!("{{\"n\":{seq}}}"),
            prev_hash: prev.clone(),
            hash: String::new(),
            mac: String::new(),
        };
        row.seal(key);
        prev = row.hash.clone();
        rows.push(row);
    }
    let head = Head {
        seq: n,
        hash: prev.clone(),
        mac: key.head_mac(n, &prev),
    };
    (rows, head)
}

fn verify(key: &ChainKey, rows: &[Row], head: Option<&Head>) -> Verdict {
    let mut v = Verifier::new(key);
    for r in rows {
        v.push(r);
    }
    v.finish(head)
}

fn kinds(v: &Verdict) -> Vec<(i64, ProblemKind)> {
    v.problems.iter().map(|p| (p.seq, p.kind)).collect()
}

#[test]
fn the_encoding_is_pinned() {
    let (rows, _) = chain(&key(), 1);
    let text = String::from_utf8(rows[0].encode_at(1)).unwrap();
    assert_eq!(
        text,
        format!(
            "plexsphere-audit-v1\n8:platform\n1:1\n10:1700000001\n5:token\n3:op1\n2:ci\n0:\n0:\n5:token\n11:node.revoke\n6:node/1\n7:{{\"n\":1}}\n64:{GENESIS}\n"
        )
    );
    // An auditor's sha256sum over those bytes gives the stored hash.
    assert_eq!(
        rows[0].hash,
        hex::encode(digest::digest(&digest::SHA256, text.as_bytes()))
    );
}

#[test]
fn length_prefixes_keep_fields_apart() {
    let (rows, _) = chain(&key(), 1);
    let mut a = rows[0].clone();
    let mut b = rows[0].clone();
    a.action = "ab".into();
    a.target = "c".into();
    b.action = "a".into();
    b.target = "bc".into();
    assert_ne!(a.hash_at(1), b.hash_at(1));
}

#[test]
fn a_fresh_chain_and_an_empty_one_verify() {
    let k = key();
    let (rows, head) = chain(&k, 20);
    let v = verify(&k, &rows, Some(&head));
    assert!(v.ok(), "{v:?}");
    assert_eq!(v.rows, 20);
    assert!(verify(&k, &[], None).ok());
}

#[test]
fn another_key_finds_every_row_foreign() {
    let (rows, head) = chain(&key(), 3);
    let other = ChainKey::derive(&hmac::Key::new(hmac::HMAC_SHA256, &[8; 32]), "platform");
    let v = verify(&other, &rows, Some(&head));
    assert_eq!(v.problems.len(), 4, "{v:?}");
}

#[test]
fn a_removed_row_is_named() {
    let k = key();
    let (mut rows, head) = chain(&k, 6);
    rows.remove(2);
    let v = verify(&k, &rows, Some(&head));
    assert_eq!(kinds(&v), vec![(3, ProblemKind::Removed)], "{v:?}");
}

#[test]
fn swapped_rows_are_reordered() {
    let k = key();
    let (mut rows, head) = chain(&k, 6);
    // Swap the contents of seq 3 and 4, each keeping its seq.
    let (a, b) = (rows[2].clone(), rows[3].clone());
    rows[2] = Row { seq: 3, ..b };
    rows[3] = Row { seq: 4, ..a };
    let v = verify(&k, &rows, Some(&head));
    assert_eq!(
        kinds(&v),
        vec![(3, ProblemKind::Reordered), (4, ProblemKind::Reordered)],
        "{v:?}"
    );
    assert!(v.problems[0].detail.contains("written as seq 4"), "{v:?}");
}

#[test]
fn an_altered_detail_is_named() {
    let k = key();
    let (mut rows, head) = chain(&k, 6);
    rows[4].detail = "{\"n\":99}".into();
    let v = verify(&k, &rows, Some(&head));
    assert_eq!(kinds(&v), vec![(5, ProblemKind::Altered)], "{v:?}");
}

#[test]
fn a_rehashed_alteration_fails_its_mac() {
    let k = key();
    let (mut rows, head) = chain(&k, 4);
    rows[1].target = "node/other".into();
    rows[1].hash = rows[1].hash_at(2);
    let v = verify(&k, &rows, Some(&head));
    assert_eq!(kinds(&v)[0], (2, ProblemKind::Inserted), "{v:?}");
}

#[test]
fn an_inserted_row_is_named_even_with_a_good_hash() {
    let k = key();
    let (mut rows, head) = chain(&k, 4);
    let mut forged = rows[3].clone();
    forged.seq = 5;
    forged.prev_hash = rows[3].hash.clone();
    forged.hash = forged.hash_at(5);
    forged.mac = "00".repeat(32);
    rows.push(forged.clone());
    let v = verify(&k, &rows, Some(&head));
    assert_eq!(
        kinds(&v),
        vec![(5, ProblemKind::Inserted), (5, ProblemKind::Inserted)],
        "{v:?}"
    );
    // A forger who moves the head too cannot make its MAC.
    let moved = Head {
        seq: 5,
        hash: forged.hash.clone(),
        mac: head.mac.clone(),
    };
    let v = verify(&k, &rows, Some(&moved));
    assert_eq!(
        kinds(&v),
        vec![(5, ProblemKind::Inserted), (5, ProblemKind::Altered)],
        "{v:?}"
    );
}

#[test]
fn a_cut_tail_is_found_against_the_head() {
    let k = key();
    let (mut rows, head) = chain(&k, 6);
    rows.truncate(4);
    let v = verify(&k, &rows, Some(&head));
    assert_eq!(kinds(&v), vec![(5, ProblemKind::Removed)], "{v:?}");
    assert!(v.problems[0].detail.contains("5..6"), "{v:?}");
}

#[test]
fn people_are_keyed_per_chain_and_email_case_does_not_matter() {
    let pepper = hmac::Key::new(hmac::HMAC_SHA256, &[7; 32]);
    let a = ChainKey::derive(&pepper, "d1");
    let b = ChainKey::derive(&pepper, "d2");
    assert_eq!(
        a.person("email", "Alice@Example.org"),
        a.person("email", "alice@example.org")
    );
    assert_ne!(
        a.person("email", "alice@example.org"),
        b.person("email", "alice@example.org")
    );
    assert!(!a.person("email", "alice@example.org").contains("alice"));
}

#[test]
fn problems_past_the_limit_are_counted() {
    let k = key();
    let (mut rows, head) = chain(&k, (MAX_PROBLEMS + 5) as i64);
    for r in &mut rows {
        r.detail = "{}".into();
    }
    let v = verify(&k, &rows, Some(&head));
    assert_eq!(v.problems.len(), MAX_PROBLEMS);
    assert_eq!(v.unlisted, 5);
    assert!(!v.ok());
}
