use serde_yaml::Value;

use super::*;

const CA: &str = include_str!("../tests/golden/lab-ca.pem");

fn token() -> BootstrapToken {
    BootstrapToken::parse(&format!(
        "pxbt_lab_node_0123456789abcdef_{}",
        "A".repeat(43)
    ))
    .unwrap()
}

fn input(t: &BootstrapToken) -> MachineBootstrap<'_> {
    MachineBootstrap {
        api_url: "https://plexsphere.10-0-0-1.nip.io/",
        ca_pem: CA,
        bootstrap_token: t,
        project_id: Uuid::from_u128(0x019a0816_0000_7000_8000_000000000001),
        resource_handle: "pr-019fb9d7-fb6c-7681-a082-07407e041cc0",
        domain_signing_public_key: Some([7; 32]),
    }
}

fn parsed(doc: &CloudInitDocument) -> Value {
    serde_yaml::from_str(doc.as_str()).unwrap()
}

fn files(v: &Value) -> Vec<(String, String, String)> {
    v["write_files"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_owned(),
                f["permissions"].as_str().unwrap().to_owned(),
                f["content"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn the_document_has_every_piece_in_order() {
    let t = token();
    let doc = render(&input(&t)).unwrap();
    assert!(doc.as_str().starts_with("#cloud-config\n"));
    let v = parsed(&doc);
    assert_eq!(v["ca_certs"]["trusted"][0].as_str(), Some(CA));
    let f = files(&v);
    let paths: Vec<(&str, &str)> = f.iter().map(|(p, m, _)| (p.as_str(), m.as_str())).collect();
    assert_eq!(
        paths,
        [
            ("/etc/plexd/ca.crt", "0644"),
            ("/etc/plexd/bootstrap-token", "0600"),
            ("/etc/plexd/config.yaml", "0600"),
            ("/etc/plexd/domain-signing.pub.pem", "0644"),
            ("/etc/plexd/install-plexd.sh", "0755"),
        ]
    );
    assert_eq!(f[0].2, CA);
    assert_eq!(f[1].2, format!("{}\n", t.expose()));
    let config: Value = serde_yaml::from_str(&f[2].2).unwrap();
    assert_eq!(
        config["api_url"].as_str(),
        Some("https://plexsphere.10-0-0-1.nip.io")
    );
    assert_eq!(
        config["token_file"].as_str(),
        Some("/etc/plexd/bootstrap-token")
    );
    assert_eq!(
        config["registration"]["project_id"].as_str(),
        Some("019a0816-0000-7000-8000-000000000001")
    );
    assert_eq!(
        config["registration"]["resource_handle"].as_str(),
        Some("pr-019fb9d7-fb6c-7681-a082-07407e041cc0")
    );
    assert!(
        f[3].2
            .starts_with("-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA")
    );
    assert!(
        f[4].2
            .contains("api_url=${1:-'https://plexsphere.10-0-0-1.nip.io'}")
    );
    assert!(!f[4].2.contains("@PLEXD_API_URL@"));
    // Readable in the console and in the golden file: the script is a literal block, which
    // the YAML emitter only chooses for text without tabs.
    assert!(!INSTALL_SCRIPT_TEMPLATE.contains('\t'));
    assert!(doc.as_str().contains("  content: |\n    #!/bin/sh\n"));

    let runcmd: Vec<String> = v["runcmd"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|c| match c {
            Value::String(s) => s.clone(),
            Value::Sequence(a) => a
                .iter()
                .map(|x| x.as_str().unwrap())
                .collect::<Vec<_>>()
                .join(" "),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        runcmd,
        [
            "set -e",
            "/etc/plexd/install-plexd.sh",
            "plexd install --api-url https://plexsphere.10-0-0-1.nip.io --token-file /etc/plexd/bootstrap-token",
            "systemctl enable plexd",
            "sh -c rc=0; plexd join --result-file /run/plexd/join-result.json || rc=$?; case $rc in 0|12|13|14) systemctl start --no-block plexd; exit 0;; esac; exit $rc",
        ]
    );
    assert_eq!(
        v["bootcmd"][0],
        serde_yaml::from_str::<Value>("[install, -d, -m, '0700', /etc/plexd]").unwrap()
    );
}

#[test]
fn without_a_signing_key_no_key_file_is_written() {
    let t = token();
    let mut i = input(&t);
    i.domain_signing_public_key = None;
    let doc = render(&i).unwrap();
    let paths: Vec<String> = files(&parsed(&doc)).into_iter().map(|f| f.0).collect();
    assert!(!paths.iter().any(|p| p.ends_with("domain-signing.pub.pem")));
    assert_eq!(paths.len(), 4);
}

#[test]
fn debug_never_shows_the_token() {
    let t = token();
    let doc = render(&input(&t)).unwrap();
    assert!(doc.as_str().contains(&t.expose()));
    let dbg = format!("{doc:?}");
    assert!(!dbg.contains("AAAAAAAA"), "{dbg}");
    assert!(dbg.contains("holds a bootstrap token"));
}

#[test]
fn the_redacted_copy_holds_the_marker_and_not_the_token() {
    let t = token();
    let doc = render(&input(&t)).unwrap();
    assert!(doc.as_str().contains(&t.expose()));
    let stored = doc.redacted(&t);
    assert!(
        !stored.as_str().contains(&t.expose()),
        "{}",
        stored.as_str()
    );
    assert!(!stored.as_str().contains(t.secret.expose()));
    // Still a document, with the marker where the token file's content was.
    let v = parsed(&stored);
    let token_file = files(&v)
        .into_iter()
        .find(|(path, _, _)| path == TOKEN_PATH)
        .unwrap();
    assert_eq!(token_file.2, format!("{REDACTED_TOKEN}\n"));
    // Everything else is unchanged.
    assert_eq!(
        stored.as_str().replace(REDACTED_TOKEN, &t.expose()),
        doc.as_str()
    );
}

#[test]
fn bad_api_urls_are_refused() {
    let t = token();
    for url in [
        "http://plexsphere.example",
        "plexsphere.example",
        "https://",
        "https://a.example/x?y=1",
        "https://a.example'; rm -rf /; '",
        "https://a.example\nruncmd: [evil]",
        "https://a b.example",
        "https://a.example//x",
    ] {
        let mut i = input(&t);
        i.api_url = url;
        let e = render(&i).unwrap_err();
        assert_eq!(e, CloudInitError::ApiUrl(url.to_owned()), "{url}");
    }
    let mut i = input(&t);
    i.api_url = "https://[fd00::1]:8443/base";
    assert!(render(&i).is_ok());
}

#[test]
fn the_ca_is_normalised_and_garbage_is_refused() {
    let t = token();
    let mut i = input(&t);
    let wrapped = format!("subject=CN = lab\n{CA}\n# trailing\n");
    i.ca_pem = &wrapped;
    let v = parsed(&render(&i).unwrap());
    assert_eq!(v["ca_certs"]["trusted"][0].as_str(), Some(CA));
    for bad in [
        "",
        "not a pem",
        "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n",
    ] {
        i.ca_pem = bad;
        assert!(
            matches!(render(&i), Err(CloudInitError::CaPem(_))),
            "{bad:?}"
        );
    }
}

#[test]
fn resource_handles_follow_plexd_rules() {
    let t = token();
    let mut i = input(&t);
    for bad in ["", "PR-1", "pr 1", &"a".repeat(64)] {
        i.resource_handle = bad;
        assert_eq!(
            render(&i).unwrap_err(),
            CloudInitError::ResourceHandle(bad.to_owned())
        );
    }
}

#[test]
fn spki_pem_has_the_ed25519_prefix() {
    let pem = ed25519_spki_pem(&[0; 32]);
    assert_eq!(
        pem,
        "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n-----END PUBLIC KEY-----\n"
    );
}
