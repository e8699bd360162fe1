//! The OpenStack credential's parsing: each sign-in form, and errors that name the field.

use super::*;

fn err(json: &str) -> String {
    parse(json.as_bytes()).unwrap_err()
}

#[test]
fn an_application_credential_by_id_takes_the_defaults() {
    let c = parse(
        br#"{"auth_url":"http://127.0.0.1:5000/v3","application_credential_id":"abc","application_credential_secret":"s3cret"}"#,
    )
    .unwrap();
    assert_eq!(c.auth_url, "http://127.0.0.1:5000/v3");
    assert_eq!(c.region, None);
    assert_eq!(c.interface, "public");
    assert_eq!(c.ca_pem, None);
    assert_eq!(
        c.auth,
        Auth::ApplicationCredentialId {
            id: "abc".into(),
            secret: Secret("s3cret".into())
        }
    );
    assert_eq!(c.who(), "abc");
    let debug = format!("{c:?}");
    assert!(!debug.contains("s3cret"), "{debug}");
}

#[test]
fn a_password_sign_in_defaults_its_domains_and_never_shows_the_password() {
    let c = parse(
        br#"{"auth_url":"https://k.example/v3","region":"r2","interface":"internal","username":"u","password":"hunter2","project_name":"p"}"#,
    )
    .unwrap();
    assert_eq!(c.region.as_deref(), Some("r2"));
    assert_eq!(c.interface, "internal");
    assert_eq!(
        c.auth,
        Auth::Password {
            username: "u".into(),
            user_domain_name: "Default".into(),
            password: Secret("hunter2".into()),
            project: Project::Name {
                name: "p".into(),
                domain_name: "Default".into()
            },
        }
    );
    assert_eq!(c.who(), "user u");
    assert!(!format!("{c:?}").contains("hunter2"));
    let by_id = parse(
        br#"{"auth_url":"https://k.example/v3","username":"u","password":"x","user_domain_name":"D","project_id":"pid"}"#,
    )
    .unwrap();
    assert!(matches!(
        by_id.auth,
        Auth::Password { project: Project::Id(ref id), ref user_domain_name, .. } if id == "pid" && user_domain_name == "D"
    ));
}

#[test]
fn an_application_credential_by_name_needs_its_user() {
    let c = parse(
        br#"{"auth_url":"https://k.example/v3","application_credential_name":"broker","username":"u","user_domain_name":"Default","application_credential_secret":"s"}"#,
    )
    .unwrap();
    assert_eq!(c.who(), "broker (user u)");
    let e = err(
        r#"{"auth_url":"https://k.example/v3","application_credential_name":"broker","application_credential_secret":"s"}"#,
    );
    assert!(e.contains("needs username"), "{e}");
}

#[test]
fn errors_name_the_field() {
    let cases = [
        (
            r#"{"application_credential_id":"a","application_credential_secret":"s"}"#,
            "needs auth_url",
        ),
        (
            r#"{"auth_url":"k.example","application_credential_id":"a","application_credential_secret":"s"}"#,
            "auth_url is not a URL",
        ),
        (
            r#"{"auth_url":"ftp://k.example/v3","application_credential_id":"a","application_credential_secret":"s"}"#,
            "must be an http(s) URL",
        ),
        (
            r#"{"auth_url":"https://k/v3","application_credential_id":"a"}"#,
            "needs application_credential_secret",
        ),
        (
            r#"{"auth_url":"https://k/v3","application_credential_id":"a","application_credential_secret":"s","password":"p"}"#,
            "drop password",
        ),
        (
            r#"{"auth_url":"https://k/v3","username":"u","password":"p"}"#,
            "needs project_name or project_id",
        ),
        (
            r#"{"auth_url":"https://k/v3","username":"u","project_name":"p"}"#,
            "needs password",
        ),
        (r#"{"auth_url":"https://k/v3"}"#, "or username and password"),
        (
            r#"{"auth_url":"https://k/v3","application_credential_id":"a","application_credential_secret":"s","interface":"private"}"#,
            "use public, internal or admin",
        ),
        (
            r#"{"auth_url":"https://k/v3","application_credential_id":"a","application_credential_secret":"s","region":" "}"#,
            "field region is empty",
        ),
        (
            r#"{"auth_url":"https://k/v3","application_credential_id":"a","application_credential_secret":"s","ca_pem":"not pem"}"#,
            "ca_pem holds no PEM certificate",
        ),
        (
            r#"{"auth_url":"https://k/v3","application_credential_id":"a","application_credential_secret":"s","tenant":"x"}"#,
            "unknown field `tenant`",
        ),
        (r#"["auth_url"]"#, "must be a JSON object"),
        (
            r#"{"auth_url":"https://k/v3","username":"u","password":"p","project_id":"i","project_name":"n"}"#,
            "keep one",
        ),
    ];
    for (json, want) in cases {
        let e = err(json);
        assert!(e.contains(want), "{json}: {e}");
        assert!(e.starts_with("the OpenStack credential"), "{e}");
    }
    let e = err(
        r#"{"auth_url":"https://k/v3","application_credential_id":"a","application_credential_secret":"topsecret","bogus":1}"#,
    );
    assert!(!e.contains("topsecret"), "{e}");
    assert!(e.contains("it accepts auth_url"), "{e}");
}
