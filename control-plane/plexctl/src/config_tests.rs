use super::*;

fn layer(server: &str, token_file: &str) -> Layer {
    Layer {
        server: Some(server.to_owned()),
        token: None,
        token_file: Some(PathBuf::from(token_file)),
        ca_file: None,
    }
}

fn valid_token() -> String {
    plexsphere_wire::secret::OperatorToken::generate()
        .map(|t| t.expose())
        .unwrap_or_default()
}

#[test]
fn location_prefers_flag_then_env_then_xdg_then_home() {
    let flag = Path::new("/flag.yaml");
    let env = Path::new("/env.yaml");
    let xdg = Path::new("/xdg");
    let home = Path::new("/home/op");
    let at = |p: &str, explicit| {
        Some(ConfigLocation {
            path: PathBuf::from(p),
            explicit,
        })
    };
    assert_eq!(
        config_location(Some(flag), Some(env), Some(xdg), Some(home)),
        at("/flag.yaml", true)
    );
    assert_eq!(
        config_location(None, Some(env), Some(xdg), Some(home)),
        at("/env.yaml", true)
    );
    assert_eq!(
        config_location(None, None, Some(xdg), Some(home)),
        at("/xdg/plexctl/config.yaml", false)
    );
    // A relative XDG_CONFIG_HOME is ignored, as the XDG spec says; empty values are unset.
    assert_eq!(
        config_location(
            Some(Path::new("")),
            None,
            Some(Path::new("rel")),
            Some(home)
        ),
        at("/home/op/.config/plexctl/config.yaml", false)
    );
    assert_eq!(config_location(None, None, None, None), None);
}

#[test]
fn flag_beats_env_beats_file() {
    let file = (
        PathBuf::from("/etc/x/config.yaml"),
        layer("https://file", "/file.tok"),
    );
    let s = resolve(
        layer("https://flag", "/flag.tok"),
        layer("https://env", "/env.tok"),
        Some(file.clone()),
        String::new(),
    )
    .map_err(|e| e.to_string());
    let s = s.as_ref().ok();
    assert_eq!(
        s.and_then(|s| s.server.clone()),
        Some(("https://flag".into(), Origin::Flag("--server")))
    );

    let s = resolve(
        Layer::default(),
        layer("https://env", "/env.tok"),
        Some(file.clone()),
        String::new(),
    )
    .ok();
    assert_eq!(
        s.as_ref().and_then(|s| s.server.clone()),
        Some(("https://env".into(), Origin::Env(ENV_SERVER)))
    );
    assert!(matches!(
        s.as_ref().and_then(|s| s.token.clone()),
        Some((TokenSource::File(p), Origin::Env(ENV_TOKEN_FILE))) if p == Path::new("/env.tok")
    ));

    let s = resolve(
        Layer::default(),
        Layer::default(),
        Some(file),
        String::new(),
    )
    .ok();
    let origin = Origin::File {
        key: "server",
        path: PathBuf::from("/etc/x/config.yaml"),
    };
    assert_eq!(
        s.as_ref().and_then(|s| s.server.clone()),
        Some(("https://file".into(), origin.clone()))
    );
    assert_eq!(origin.to_string(), "`server` in /etc/x/config.yaml");
}

#[test]
fn settings_are_picked_one_by_one() {
    // The flag gives only the server; the token and CA still come from the file.
    let flags = Layer {
        server: Some("https://flag".into()),
        ..Layer::default()
    };
    let mut file = layer("https://file", "/file.tok");
    file.ca_file = Some(PathBuf::from("/ca.crt"));
    let s = resolve(
        flags,
        Layer::default(),
        Some(("/c.yaml".into(), file)),
        String::new(),
    )
    .ok();
    assert_eq!(
        s.as_ref()
            .and_then(|s| s.server.as_ref().map(|v| v.0.clone())),
        Some("https://flag".into())
    );
    assert_eq!(
        s.as_ref()
            .and_then(|s| s.ca_file.as_ref().map(|v| v.0.clone())),
        Some("/ca.crt".into())
    );
    assert!(matches!(
        s.and_then(|s| s.token),
        Some((
            TokenSource::File(_),
            Origin::File {
                key: "token_file",
                ..
            }
        ))
    ));
}

#[test]
fn an_inline_token_flag_beats_a_token_file_from_env() {
    let flags = Layer {
        token: Some(Secret::new("pxop_x")),
        ..Layer::default()
    };
    let s = resolve(flags, layer("https://env", "/env.tok"), None, String::new()).ok();
    assert!(matches!(
        s.and_then(|s| s.token),
        Some((TokenSource::Inline(_), Origin::Flag("--token")))
    ));
}

#[test]
fn both_token_forms_in_one_layer_are_refused() {
    let env = Layer {
        token: Some(Secret::new("pxop_x")),
        token_file: Some("/t".into()),
        ..Layer::default()
    };
    let err = resolve(Layer::default(), env, None, String::new())
        .err()
        .map(|e| e.to_string());
    assert_eq!(
        err.as_deref(),
        Some("PLEXCTL_TOKEN sets both a token and a token file; keep only one of them")
    );
}

#[test]
fn missing_server_and_token_say_what_to_set() {
    let s = resolve(
        Layer::default(),
        Layer::default(),
        None,
        "~/.config/plexctl/config.yaml".into(),
    );
    let Ok(s) = s else { panic!("resolve failed") };
    assert_eq!(
        s.server_url().err().map(|e| e.to_string()).as_deref(),
        Some(
            "no server is set; pass --server URL, set PLEXCTL_SERVER, or add `server: https://...` to ~/.config/plexctl/config.yaml"
        )
    );
    assert_eq!(
        s.operator_token().err().map(|e| e.to_string()).as_deref(),
        Some(
            "no operator token is set; pass --token-file PATH (or --token), set PLEXCTL_TOKEN_FILE (or PLEXCTL_TOKEN), or add `token_file:` to ~/.config/plexctl/config.yaml"
        )
    );
}

#[test]
fn server_urls_are_checked() {
    let with = |url: &str| Settings {
        server: Some((url.to_owned(), Origin::Env(ENV_SERVER))),
        token: None,
        ca_file: None,
        config_hint: String::new(),
        session_file: None,
    };
    assert!(with("https://127.0.0.1:8443").server_url().is_ok());
    assert!(with("http://localhost:8080/base/").server_url().is_ok());
    let err = with("ftp://x")
        .server_url()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.starts_with(
            "the server URL `ftp://x` from PLEXCTL_SERVER is not usable: the scheme must be https"
        ),
        "{err}"
    );
    assert!(with("plexsphere.example.com").server_url().is_err());
    assert!(with("https://x/?a=b").server_url().is_err());
}

#[test]
fn the_file_resolves_relative_paths_against_its_directory() {
    let text = "server: https://127.0.0.1:8443\ntoken_file: operator.token\nca_file: /abs/ca.crt\n";
    let l = parse_file(Path::new("/var/lib/plexsphere/plexctl.yaml"), text).ok();
    assert_eq!(
        l.as_ref().and_then(|l| l.server.clone()).as_deref(),
        Some("https://127.0.0.1:8443")
    );
    assert_eq!(
        l.as_ref().and_then(|l| l.token_file.clone()),
        Some(PathBuf::from("/var/lib/plexsphere/operator.token"))
    );
    assert_eq!(
        l.and_then(|l| l.ca_file),
        Some(PathBuf::from("/abs/ca.crt"))
    );
}

#[test]
fn an_empty_or_comment_only_file_sets_nothing() {
    for text in ["", "# nothing yet\n", "---\n"] {
        let l = parse_file(Path::new("/c.yaml"), text).map_err(|e| e.to_string());
        assert!(
            matches!(
                l,
                Ok(Layer {
                    server: None,
                    token: None,
                    token_file: None,
                    ca_file: None
                })
            ),
            "{text:?}: {l:?}"
        );
    }
}

#[test]
fn an_unknown_key_names_the_file_and_line() {
    let text = "server: https://x\n# a comment\ntokn_file: /t\n";
    let err = parse_file(Path::new("/home/op/.config/plexctl/config.yaml"), text)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.starts_with("the config file /home/op/.config/plexctl/config.yaml is invalid at line 3: unknown field `tokn_file`, expected one of"),
        "{err}"
    );
}

#[test]
fn a_type_error_names_the_file_and_line() {
    let err = parse_file(Path::new("/c.yaml"), "server:\n  - a\n  - b\n")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.starts_with(
            "the config file /c.yaml is invalid at line 2: server: invalid type: sequence"
        ),
        "{err}"
    );
    let err = parse_file(Path::new("/c.yaml"), "server: [unclosed\n")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.starts_with("the config file /c.yaml is invalid at line "),
        "{err}"
    );
}

#[test]
fn a_named_config_file_must_exist_a_default_one_need_not() {
    let dir = tempfile::tempdir().ok();
    let missing = dir
        .as_ref()
        .map(|d| d.path().join("nope.yaml"))
        .unwrap_or_default();
    let default = ConfigLocation {
        path: missing.clone(),
        explicit: false,
    };
    assert!(matches!(load_file(&default), Ok(None)));
    let named = ConfigLocation {
        path: missing,
        explicit: true,
    };
    let err = load_file(&named)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.starts_with("cannot read the config file "), "{err}");
    assert!(err.contains("nope.yaml"), "{err}");
}

#[test]
fn the_token_file_is_read_trimmed_and_checked() {
    let Ok(dir) = tempfile::tempdir() else {
        panic!("tempdir")
    };
    let good = valid_token();
    let path = dir.path().join("operator.token");
    assert!(std::fs::write(&path, format!("{good}\n")).is_ok());
    let settings = |p: &Path| Settings {
        server: None,
        token: Some((
            TokenSource::File(p.to_path_buf()),
            Origin::Flag("--token-file"),
        )),
        ca_file: None,
        config_hint: String::new(),
        session_file: None,
    };
    assert_eq!(
        settings(&path)
            .operator_token()
            .ok()
            .map(|s| s.expose().to_owned()),
        Some(good)
    );

    let bad = dir.path().join("bad.token");
    assert!(std::fs::write(&bad, "pxbt_lab_node_notanoperatortoken").is_ok());
    let err = settings(&bad)
        .operator_token()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert_eq!(
        err,
        "the operator token from --token-file is not a plexsphere operator token (it does not start with `pxop_`); create one on the server with `plexsphere operator-token create`"
    );
    // The message never echoes the token text.
    assert!(!err.contains("notanoperatortoken"));

    let err = settings(&dir.path().join("absent"))
        .operator_token()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.starts_with("cannot read the operator token file "),
        "{err}"
    );
}

#[test]
fn a_lower_layer_with_both_token_forms_does_not_matter_when_a_higher_one_wins() {
    let flags = Layer {
        token_file: Some("/flag.tok".into()),
        ..Layer::default()
    };
    let env = Layer {
        token: Some(Secret::new("pxop_x")),
        token_file: Some("/t".into()),
        ..Layer::default()
    };
    let s = resolve(flags, env, None, String::new()).ok();
    assert!(matches!(
        s.and_then(|s| s.token),
        Some((TokenSource::File(_), Origin::Flag("--token-file")))
    ));
}
