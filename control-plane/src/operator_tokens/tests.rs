use super::*;

fn row(scope: Option<&str>, expires_at: Option<i64>, revoked_at: Option<i64>) -> OperatorRow {
    OperatorRow {
        id: "0123456789abcdef".into(),
        name: "t".into(),
        secret_sha256: String::new(),
        created_at: 1_000,
        revoked_at,
        scope: scope.map(str::to_owned),
        project_id: None,
        expires_at,
        last_used_at: None,
    }
}

#[test]
fn expires_in_reads_units_and_never_and_refuses_the_rest() {
    assert_eq!(
        parse_expires_in("90d").unwrap(),
        Expiry::AfterSecs(90 * 86_400)
    );
    assert_eq!(
        parse_expires_in("1d12h").unwrap(),
        Expiry::AfterSecs(36 * 3600)
    );
    assert_eq!(parse_expires_in("30m").unwrap(), Expiry::AfterSecs(1800));
    assert_eq!(parse_expires_in("never").unwrap(), Expiry::Never);
    for bad in ["", "90", "d", "9x", "1.5d", "-1d", "never!", "30m1h", "0s"] {
        assert!(
            matches!(
                parse_expires_in(bad),
                Err(OperatorTokenError::BadExpiresIn(_))
            ),
            "{bad:?}"
        );
    }
    for out in ["59s", "367d", "99999999999999999999d"] {
        assert!(
            matches!(
                parse_expires_in(out),
                Err(OperatorTokenError::ExpiresInOutOfRange | OperatorTokenError::BadExpiresIn(_))
            ),
            "{out:?}"
        );
    }
    assert!(matches!(
        parse_expires_in("367d"),
        Err(OperatorTokenError::ExpiresInOutOfRange)
    ));
}

#[test]
fn only_admin_may_never_expire_and_admin_is_never_project_bound() {
    let spec = |scope, project_id, expiry| TokenSpec {
        name: "ci".into(),
        scope,
        project_id,
        expiry,
    };
    let p = Some(Uuid::from_u128(7));
    assert!(
        spec(OperatorScope::Admin, None, Expiry::Never)
            .check()
            .is_ok()
    );
    assert!(matches!(
        spec(OperatorScope::Operator, None, Expiry::Never).check(),
        Err(OperatorTokenError::NeverNeedsAdmin)
    ));
    assert!(matches!(
        spec(OperatorScope::ReadOnly, p, Expiry::Never).check(),
        Err(OperatorTokenError::NeverNeedsAdmin)
    ));
    assert!(matches!(
        spec(OperatorScope::Admin, p, Expiry::AfterSecs(60)).check(),
        Err(OperatorTokenError::AdminWithProject)
    ));
    assert!(
        spec(OperatorScope::ReadOnly, p, Expiry::AfterSecs(60))
            .check()
            .is_ok()
    );
}

#[test]
fn grant_refuses_at_the_expiry_second_and_reads_legacy_as_admin() {
    let r = row(Some("read-only"), Some(2_000), None);
    assert_eq!(
        grant(&r, 1_999).unwrap().unwrap().scope,
        OperatorScope::ReadOnly
    );
    assert_eq!(
        grant(&r, 2_000).unwrap(),
        Err(Refusal::Expired { at: 2_000 })
    );
    let legacy = grant(&row(None, None, None), i64::MAX).unwrap().unwrap();
    assert_eq!(legacy.scope, OperatorScope::Admin);
    assert!(legacy.legacy);
    assert_eq!(
        grant(&row(Some("admin"), None, Some(5)), 6).unwrap(),
        Err(Refusal::Revoked)
    );
    assert!(grant(&row(Some("root"), None, None), 0).is_err());
}

#[test]
fn last_use_is_due_once_a_minute() {
    assert!(last_use_due(None, 0));
    assert!(!last_use_due(
        Some(100),
        100 + LAST_USE_WRITE_EVERY_SECS - 1
    ));
    assert!(last_use_due(Some(100), 100 + LAST_USE_WRITE_EVERY_SECS));
}
