//! Operators sign in (issue 28): against the real OpenID Provider of tests/oidc (the npm
//! `oidc-provider`), signed in headlessly by tests/src/oidc.rs.

use anyhow::{Context, Result};
use base64::Engine as _;
use plexsphere_e2e::oidc::{
    Auth, Browser, CLI_CLIENT_ID, CONSOLE_CLIENT_ID, Issuer, RoleBinding, bind_role, call,
    http_client, post_form,
};
use serde_json::Value;

fn claims_of(jwt: &str) -> Result<Value> {
    let payload = jwt.split('.').nth(1).context("a JWT has three parts")?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload)?;
    Ok(serde_json::from_slice(&bytes)?)
}

fn pkce() -> (String, String) {
    let verifier = format!(
        "verifier-{}-0123456789abcdefghijklmnopqrstuvwxyz",
        std::process::id()
    );
    let digest = ring::digest::digest(&ring::digest::SHA256, verifier.as_bytes());
    let challenge = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest.as_ref());
    (verifier, challenge)
}

/// The harness itself: the provider signs alice in through its forms (code + PKCE) and her ID
/// token carries her groups; a device code is approved through the provider's pages.
#[tokio::test]
async fn the_test_issuer_signs_people_in_headlessly() -> Result<()> {
    let issuer = Issuer::start()?;
    let http = http_client(None, true)?;
    let discovery: Value = http
        .get(format!("{}/.well-known/openid-configuration", issuer.url))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(discovery["issuer"], issuer.url.as_str());
    let redirect = "https://127.0.0.1:1/v1/auth/callback";
    let (verifier, challenge) = pkce();
    let start = format!(
        "{}/auth?client_id={CONSOLE_CLIENT_ID}&response_type=code&scope=openid+email+profile+groups\
         &redirect_uri={redirect}&state=s1&nonce=n1&code_challenge={challenge}&code_challenge_method=S256",
        issuer.url
    );
    let mut browser = Browser::new(None)?;
    let callback = browser.sign_in(&issuer.url, &start, "alice").await?;
    assert!(callback.as_str().starts_with(redirect), "{callback}");
    let code = callback
        .query_pairs()
        .find(|(k, _)| k == "code")
        .map(|(_, v)| v.into_owned())
        .context("the callback has a code")?;
    let tokens: Value = post_form(
        &http,
        &format!("{}/token", issuer.url),
        Some((CONSOLE_CLIENT_ID, &issuer.console_client_secret)),
        &[
            ("grant_type", "authorization_code"),
            ("code", &code),
            ("redirect_uri", redirect),
            ("code_verifier", &verifier),
        ],
    )
    .await?
    .json()
    .await?;
    let id = claims_of(tokens["id_token"].as_str().context("an ID token")?)?;
    assert_eq!(id["sub"], "alice");
    assert_eq!(id["email"], "alice@example.test");
    assert_eq!(id["groups"], serde_json::json!(["ops"]));
    assert_eq!(id["nonce"], "n1");

    let device: Value = post_form(
        &http,
        &format!("{}/device/auth", issuer.url),
        None,
        &[
            ("client_id", CLI_CLIENT_ID),
            ("scope", "openid email groups"),
        ],
    )
    .await?
    .json()
    .await?;
    let complete = device["verification_uri_complete"]
        .as_str()
        .context("a verification URI")?;
    Browser::new(None)?.approve_device(complete, "bob").await?;
    let tokens: Value = post_form(
        &http,
        &format!("{}/token", issuer.url),
        None,
        &[
            ("grant_type", "urn:ietf:params:oauth:grant-type:device_code"),
            (
                "device_code",
                device["device_code"].as_str().context("a device code")?,
            ),
            ("client_id", CLI_CLIENT_ID),
        ],
    )
    .await?
    .json()
    .await?;
    let id = claims_of(
        tokens["id_token"]
            .as_str()
            .context("an ID token after approval")?,
    )?;
    assert_eq!(id["sub"], "bob");
    assert_eq!(id["groups"], serde_json::json!(["dev"]));

    let before = issuer.rotate_keys().await?;
    let jwks: Value = http
        .get(format!("{}/jwks", issuer.url))
        .send()
        .await?
        .json()
        .await?;
    let kids: Vec<&str> = jwks["keys"]
        .as_array()
        .context("keys")?
        .iter()
        .filter_map(|k| k["kid"].as_str())
        .collect();
    assert_eq!(kids, before.iter().map(String::as_str).collect::<Vec<_>>());
    Ok(())
}

// ---- The control plane's sign-in against the real provider ----

use plexsphere_e2e::{ControlPlane, LAB_NODES_PROJECT, OPENSTACK_PROJECT};
use reqwest::Method;
use serde_json::json;

struct Lab {
    issuer: Issuer,
    cp: ControlPlane,
    admin: String,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Lab {
    fn start(extra: &[&str]) -> Result<Self> {
        let issuer = Issuer::start()?;
        let dir = tempfile::tempdir()?;
        let secret = issuer.secret_file.to_string_lossy().into_owned();
        let mut args = vec![
            "--oidc-issuer",
            issuer.url.as_str(),
            "--oidc-client-id",
            CONSOLE_CLIENT_ID,
            "--oidc-client-secret-file",
            secret.as_str(),
            "--oidc-cli-client-id",
            CLI_CLIENT_ID,
        ];
        args.extend_from_slice(extra);
        let cp = ControlPlane::start_dev_with(dir.path(), &args)?;
        let admin = std::fs::read_to_string(dir.path().join("operator-token"))?
            .trim()
            .to_owned();
        let http = http_client(Some(&cp.ca_file()), false)?;
        Ok(Self {
            issuer,
            cp,
            admin,
            http,
            _dir: dir,
        })
    }

    fn browser(&self) -> Result<Browser> {
        Browser::new(Some(&self.cp.ca_file()))
    }

    /// A call with the admin token.
    async fn admin(&self, method: Method, path: &str, body: Option<Value>) -> Result<(u16, Value)> {
        call(
            &self.http,
            method,
            &format!("{}{path}", self.cp.url),
            Auth::Bearer(&self.admin),
            body,
        )
        .await
    }

    async fn bind(
        &self,
        role: &str,
        scope: &str,
        id: Option<&str>,
        kind: &str,
        who: &str,
    ) -> Result<String> {
        let binding = RoleBinding {
            role,
            scope,
            scope_id: id,
            kind,
            who,
        };
        bind_role(&self.http, &self.cp.url, &self.admin, binding).await
    }

    /// Signs `user` in through the console's flow; the browser then holds the cookies.
    async fn sign_in(&self, browser: &mut Browser, user: &str) -> Result<reqwest::Url> {
        let start = format!("{}/v1/auth/sign-in?return_to=/nodes", self.cp.url);
        let callback = browser.sign_in(&self.issuer.url, &start, user).await?;
        let page = browser.get(callback.as_str()).await?;
        assert_eq!(page.status, 302, "{}", page.body);
        assert_eq!(
            page.location.as_ref().map(|l| l.path()),
            Some("/nodes"),
            "{page:?}"
        );
        Ok(callback)
    }

    async fn cookie_call(
        &self,
        b: &Browser,
        method: Method,
        path: &str,
        csrf: Option<&str>,
        body: Option<Value>,
    ) -> Result<(u16, Value)> {
        let url = format!("{}{path}", self.cp.url);
        call(
            &self.http,
            method,
            &url,
            Auth::Cookie {
                jar: &b.cookie_header(),
                csrf,
            },
            body,
        )
        .await
    }
}

fn token_body() -> Value {
    json!({"env_prefix": "lab", "kind": "node", "ttl_secs": 600})
}

async fn token_count(lab: &Lab, project: &str) -> Result<usize> {
    let (s, v) = lab
        .admin(
            Method::GET,
            &format!("/v1/projects/{project}/bootstrap-tokens"),
            None,
        )
        .await?;
    assert_eq!(s, 200, "{v}");
    Ok(v["items"].as_array().context("items")?.len())
}

/// The whole console flow: sign in at the real issuer, whoami, CSRF on every cookie write
/// (missing, wrong, foreign Origin: 403 and nothing changed), a member of one project sees
/// nothing of another, sign-out ends the session, a replayed callback, a wrong state and a
/// callback in another browser are refused, removing the last role ends a session, and a
/// sign-in still works after the issuer rotated its keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn people_sign_in_at_the_issuer_and_their_roles_decide() -> Result<()> {
    let lab = Lab::start(&[])?;
    let (s, cfg) = call(
        &lab.http,
        Method::GET,
        &format!("{}/v1/auth/config", lab.cp.url),
        Auth::Bearer(""),
        None,
    )
    .await?;
    assert_eq!((s, cfg["enabled"].clone()), (200, json!(true)), "{cfg}");

    // mallory has no role: the issuer signs her in, the control plane does not.
    let mut m = lab.browser()?;
    let cb = m
        .sign_in(
            &lab.issuer.url,
            &format!("{}/v1/auth/sign-in", lab.cp.url),
            "mallory",
        )
        .await?;
    let page = m.get(cb.as_str()).await?;
    assert_eq!(page.status, 403, "{}", page.body);
    assert!(m.cookie("__Host-plexsphere-session").is_none());

    let alice_binding = lab
        .bind(
            "member",
            "project",
            Some(LAB_NODES_PROJECT),
            "email",
            "alice@example.test",
        )
        .await?;
    let mut a = lab.browser()?;
    let callback = lab.sign_in(&mut a, "alice").await?;
    let csrf = a
        .cookie("__Host-plexsphere-csrf")
        .context("the CSRF cookie")?
        .to_owned();
    let (s, me) = lab
        .cookie_call(&a, Method::GET, "/v1/auth/whoami", None, None)
        .await?;
    assert_eq!(s, 200, "{me}");
    assert_eq!(me["via"], "session");
    assert_eq!(me["person"]["subject"], "alice");
    assert_eq!(me["csrf"], true);
    assert_eq!(me["roles"][0]["role"], "member");
    assert_eq!(me["roles"][0]["scope"]["id"], LAB_NODES_PROJECT);

    // CSRF: missing, wrong, another origin -> 403 csrf_required, no token issued.
    let before = token_count(&lab, LAB_NODES_PROJECT).await?;
    let path = format!("/v1/projects/{LAB_NODES_PROJECT}/bootstrap-tokens");
    for csrf_value in [None, Some("wrong")] {
        let (s, v) = lab
            .cookie_call(&a, Method::POST, &path, csrf_value, Some(token_body()))
            .await?;
        assert_eq!((s, v["code"].clone()), (403, json!("csrf_required")), "{v}");
    }
    let url = format!("{}{path}", lab.cp.url);
    let jar = a.cookie_header();
    let (s, v) = call(
        &lab.http,
        Method::POST,
        &url,
        Auth::Origin {
            jar: &jar,
            csrf: &csrf,
            origin: "https://evil.example",
        },
        Some(token_body()),
    )
    .await?;
    assert_eq!((s, v["code"].clone()), (403, json!("csrf_required")), "{v}");
    assert_eq!(
        token_count(&lab, LAB_NODES_PROJECT).await?,
        before,
        "a refused write changed nothing"
    );
    let (s, v) = lab
        .cookie_call(&a, Method::POST, &path, Some(&csrf), Some(token_body()))
        .await?;
    assert_eq!(s, 201, "{v}");
    assert_eq!(token_count(&lab, LAB_NODES_PROJECT).await?, before + 1);

    // A member of one project sees nothing of another.
    let (s, v) = lab
        .cookie_call(
            &a,
            Method::GET,
            &format!("/v1/projects/{OPENSTACK_PROJECT}/bootstrap-tokens"),
            None,
            None,
        )
        .await?;
    assert_eq!(s, 404, "{v}");
    let (s, v) = lab
        .cookie_call(
            &a,
            Method::GET,
            &format!("/v1/nodes?project_id={OPENSTACK_PROJECT}"),
            None,
            None,
        )
        .await?;
    assert_eq!((s, v["items"].clone()), (200, json!([])), "{v}");
    let (s, v) = lab
        .cookie_call(&a, Method::GET, "/v1/projects", None, None)
        .await?;
    assert_eq!(s, 200);
    let ids: Vec<&str> = v["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter_map(|p| p["id"].as_str())
        .collect();
    assert_eq!(ids, vec![LAB_NODES_PROJECT]);
    // ...and may not bind roles.
    let (s, v) = lab.cookie_call(&a, Method::POST, "/v1/role-bindings", Some(&csrf), Some(json!({"role": "admin", "scope": "platform", "principal_kind": "email", "principal": "alice@example.test"}))).await?;
    assert_eq!(s, 403, "{v}");

    // The callback again (a replayed code and state): refused, nothing signed in.
    let mut replay = lab.browser()?;
    let page = replay.get(callback.as_str()).await?;
    assert_eq!(page.status, 400, "{}", page.body);
    assert!(page.body.contains("sign_in_failed"), "{}", page.body);
    // A state the server never handed out.
    let page = replay
        .get(&format!(
            "{}/v1/auth/callback?code=x&state=forged",
            lab.cp.url
        ))
        .await?;
    assert_eq!(page.status, 400, "{}", page.body);
    // A callback delivered to another browser than the one that started the sign-in.
    let mut starter = lab.browser()?;
    let cb = starter
        .sign_in(
            &lab.issuer.url,
            &format!("{}/v1/auth/sign-in", lab.cp.url),
            "alice",
        )
        .await?;
    let page = replay.get(cb.as_str()).await?;
    assert_eq!(page.status, 400, "{}", page.body);
    assert!(page.body.contains("another browser"), "{}", page.body);

    // Sign-out: needs CSRF, then the cookie is refused.
    let (s, v) = lab
        .cookie_call(&a, Method::POST, "/v1/auth/sign-out", None, None)
        .await?;
    assert_eq!(s, 403, "{v}");
    let (s, v) = lab
        .cookie_call(&a, Method::POST, "/v1/auth/sign-out", Some(&csrf), None)
        .await?;
    assert_eq!(s, 200, "{v}");
    let (s, v) = lab
        .cookie_call(&a, Method::GET, "/v1/auth/whoami", None, None)
        .await?;
    assert_eq!(
        (s, v["code"].clone()),
        (401, json!("session_expired")),
        "{v}"
    );

    // Removing the last role ends a live session at its next request.
    let mut a2 = lab.browser()?;
    lab.sign_in(&mut a2, "alice").await?;
    let (s, _) = lab
        .cookie_call(&a2, Method::GET, "/v1/auth/whoami", None, None)
        .await?;
    assert_eq!(s, 200);
    let (s, v) = lab
        .admin(
            Method::POST,
            &format!("/v1/role-bindings/{alice_binding}/delete"),
            None,
        )
        .await?;
    assert_eq!(s, 200, "{v}");
    let (s, v) = lab
        .cookie_call(&a2, Method::GET, "/v1/auth/whoami", None, None)
        .await?;
    assert_eq!(
        (s, v["code"].clone()),
        (401, json!("session_expired")),
        "{v}"
    );

    // bob (by group) signs in after the issuer rotated its keys: the new kid is fetched.
    lab.bind("auditor", "platform", None, "group", "dev")
        .await?;
    lab.issuer.rotate_keys().await?;
    let mut b = lab.browser()?;
    lab.sign_in(&mut b, "bob").await?;
    let (s, me) = lab
        .cookie_call(&b, Method::GET, "/v1/auth/whoami", None, None)
        .await?;
    assert_eq!(
        (s, me["roles"][0]["role"].clone()),
        (200, json!("auditor")),
        "{me}"
    );
    let (s, v) = lab
        .cookie_call(
            &b,
            Method::POST,
            &path,
            b.cookie("__Host-plexsphere-csrf"),
            Some(token_body()),
        )
        .await?;
    assert_eq!(
        (s, v["code"].clone()),
        (403, json!("insufficient_scope")),
        "an auditor does not operate: {v}"
    );

    // Every step above is in the platform's audit chain, which bob (a platform auditor) reads:
    // who signed in and out, the bindings, the session ended for want of a role; people only
    // keyed, never their e-mail in clear; and the chain verifies.
    let (s, log) = lab
        .cookie_call(&b, Method::GET, "/v1/audit?limit=1000", None, None)
        .await?;
    assert_eq!(s, 200, "{log}");
    let actions: Vec<&str> = log["entries"]
        .as_array()
        .context("audit entries")?
        .iter()
        .filter_map(|e| e["action"].as_str())
        .collect();
    let count = |a: &str| actions.iter().filter(|x| **x == a).count();
    assert!(
        count("auth.sign_in") >= 3,
        "alice twice and bob: {actions:?}"
    );
    assert_eq!(count("auth.sign_out"), 1, "{actions:?}");
    assert_eq!(
        count("role.bind"),
        1,
        "bob's group, on the platform: {actions:?}"
    );
    assert_eq!(count("auth.session_revoked"), 1, "{actions:?}");
    // alice's binding was on a Project: its rows are in that Project's Domain's chain.
    let (s, domains) = lab.admin(Method::GET, "/v1/domains", None).await?;
    assert_eq!(s, 200, "{domains}");
    let domain = domains["items"][0]["id"].as_str().context("a Domain")?;
    let (s, dlog) = lab
        .cookie_call(
            &b,
            Method::GET,
            &format!("/v1/audit?domain={domain}&limit=1000"),
            None,
            None,
        )
        .await?;
    assert_eq!(s, 200, "{dlog}");
    let text = dlog.to_string();
    assert!(
        text.contains("role.bind") && text.contains("role.unbind"),
        "{dlog}"
    );
    assert!(
        !text.contains("alice@example.test"),
        "no e-mail in clear: {dlog}"
    );
    let sign_in = log["entries"]
        .as_array()
        .context("audit entries")?
        .iter()
        .find(|e| e["action"] == "auth.sign_in")
        .context("a sign-in row")?;
    assert_eq!(sign_in["actor"]["kind"], "session", "{sign_in}");
    assert!(
        sign_in["actor"]["email_key"]
            .as_str()
            .is_some_and(|k| k.len() == 64),
        "the person is keyed: {sign_in}"
    );
    assert!(
        !log.to_string().contains("alice@example.test"),
        "no e-mail in clear: {log}"
    );
    let (s, v) = lab
        .admin(
            Method::POST,
            "/v1/audit/verify",
            Some(json!({"domain": null})),
        )
        .await?;
    assert_eq!((s, v["ok"].clone()), (200, json!(true)), "{v}");
    Ok(())
}

/// plexctl's exchange refuses every bad ID token with 400 and accepts a good one once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_id_token_exchange_refuses_forged_foreign_stale_and_replayed_tokens() -> Result<()> {
    let lab = Lab::start(&[])?;
    lab.bind(
        "member",
        "project",
        Some(LAB_NODES_PROJECT),
        "subject",
        "alice",
    )
    .await?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs() as i64;
    let claims = |f: &dyn Fn(&mut Value)| {
        let mut c = json!({"iss": lab.issuer.url, "aud": CLI_CLIENT_ID, "sub": "alice", "iat": now, "exp": now + 600});
        f(&mut c);
        c
    };
    let exchange = |token: String| {
        let http = lab.http.clone();
        let url = format!("{}/v1/auth/session", lab.cp.url);
        async move {
            call(
                &http,
                Method::POST,
                &url,
                Auth::Bearer(""),
                Some(json!({"id_token": token})),
            )
            .await
        }
    };
    let sign = |key: &'static str, f: &dyn Fn(&mut Value)| {
        lab.issuer.sign(json!({"alg": "ES256"}), claims(f), key)
    };
    let cases = [
        (
            "forged (another key, the issuer's kid)",
            sign("foreign", &|_| {}).await?,
        ),
        ("alg none", sign("none", &|_| {}).await?),
        (
            "the console's audience",
            sign("current", &|c| c["aud"] = json!(CONSOLE_CLIENT_ID)).await?,
        ),
        (
            "another issuer",
            sign("current", &|c| c["iss"] = json!("http://127.0.0.1:1")).await?,
        ),
        (
            "expired",
            sign("current", &|c| {
                c["iat"] = json!(now - 4000);
                c["exp"] = json!(now - 3000);
            })
            .await?,
        ),
        (
            "stale (iat 20 min ago)",
            sign("current", &|c| c["iat"] = json!(now - 1200)).await?,
        ),
    ];
    for (what, token) in cases {
        let (s, v) = exchange(token).await?;
        assert_eq!(
            (s, v["code"].clone()),
            (400, json!("sign_in_failed")),
            "{what}: {v}"
        );
    }
    let good = sign("current", &|_| {}).await?;
    let (s, v) = exchange(good.clone()).await?;
    assert_eq!(s, 201, "{v}");
    let session = v["session"].as_str().context("a session")?.to_owned();
    assert!(session.starts_with("pxss_"));
    let (s, v) = exchange(good).await?;
    assert_eq!(
        (s, v["code"].clone()),
        (400, json!("sign_in_failed")),
        "a replayed ID token: {v}"
    );
    let (s, me) = call(
        &lab.http,
        Method::GET,
        &format!("{}/v1/auth/whoami", lab.cp.url),
        Auth::Bearer(&session),
        None,
    )
    .await?;
    assert_eq!(
        (s, me["via"].clone(), me["csrf"].clone()),
        (200, json!("session"), json!(false)),
        "{me}"
    );
    // A bearer session writes without CSRF.
    let (s, v) = call(
        &lab.http,
        Method::POST,
        &format!(
            "{}/v1/projects/{LAB_NODES_PROJECT}/bootstrap-tokens",
            lab.cp.url
        ),
        Auth::Bearer(&session),
        Some(token_body()),
    )
    .await?;
    assert_eq!(s, 201, "{v}");
    Ok(())
}

/// `plexctl login` with the device grant (the test approves the code at the issuer's pages
/// as alice), then plexctl works with the session alone (no operator token in its config),
/// sees only alice's project, and `plexctl logout` revokes the session at the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plexctl_logs_in_with_the_device_grant_and_logs_out() -> Result<()> {
    use plexsphere_e2e::{Proc, STARTUP_BOUND};
    let lab = Lab::start(&[])?;
    lab.bind(
        "member",
        "project",
        Some(LAB_NODES_PROJECT),
        "email",
        "alice@example.test",
    )
    .await?;
    let cli = Cli::new(&lab)?;
    // Without a session or a token plexctl has nothing to call with.
    assert_eq!(cli.run(&["node", "list"])?.status.code(), Some(64));

    let mut login = Proc::spawn(cli.command(&["login"])?)?;
    let line = login.wait_for_line(STARTUP_BOUND, |l| l.starts_with("or open: "))?;
    let complete = line.trim_start_matches("or open: ").trim().to_owned();
    Browser::new(None)?
        .approve_device(&complete, "alice")
        .await?;
    let session_file = cli.finish_login(&mut login)?;
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&session_file)?)?;
    let session = saved["session"]
        .as_str()
        .context("the saved session")?
        .to_owned();

    cli.assert_projects(&[LAB_NODES_PROJECT])?;
    let out = cli.run(&["node", "list"])?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = cli.run(&["logout"])?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("revoked"));
    assert!(!session_file.exists());
    let (s, v) = call(
        &lab.http,
        Method::GET,
        &format!("{}/v1/auth/whoami", lab.cp.url),
        Auth::Bearer(&session),
        None,
    )
    .await?;
    assert_eq!(
        (s, v["code"].clone()),
        (401, json!("session_expired")),
        "{v}"
    );
    assert_eq!(cli.run(&["node", "list"])?.status.code(), Some(64));
    Ok(())
}

/// `plexctl login --no-device`: the loopback redirect of RFC 8252. A request to plexctl's
/// loopback listener with another state (a page or process on this host guessing at it) is
/// answered as not this sign-in and changes nothing; alice then signs in at the issuer, the
/// issuer's redirect reaches plexctl, and plexctl works with the session alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plexctl_logs_in_with_a_loopback_redirect_and_ignores_a_foreign_callback() -> Result<()> {
    use plexsphere_e2e::{Proc, STARTUP_BOUND};
    let lab = Lab::start(&[])?;
    lab.bind(
        "member",
        "project",
        Some(LAB_NODES_PROJECT),
        "email",
        "alice@example.test",
    )
    .await?;
    let cli = Cli::new(&lab)?;
    let mut login = Proc::spawn(cli.command(&["login", "--no-device"])?)?;
    let line = login.wait_for_line(STARTUP_BOUND, |l| l.starts_with("To sign in, open: "))?;
    let url = line
        .trim_start_matches("To sign in, open: ")
        .trim()
        .to_owned();
    let auth = reqwest::Url::parse(&url)?;
    let redirect = auth
        .query_pairs()
        .find(|(k, _)| k == "redirect_uri")
        .map(|(_, v)| v.into_owned())
        .context("the authorization URL names its redirect")?;
    assert!(
        redirect.starts_with("http://127.0.0.1:"),
        "a loopback redirect: {redirect}"
    );
    assert!(
        auth.query_pairs()
            .any(|(k, v)| k == "code_challenge_method" && v == "S256"),
        "PKCE S256: {url}"
    );

    // A callback with a code but not this sign-in's state.
    let plain = http_client(None, false)?;
    let forged = plain
        .get(format!("{redirect}?code=forged&state=guessed"))
        .send()
        .await?
        .text()
        .await?;
    assert!(
        forged.contains("not the sign-in plexctl started"),
        "{forged}"
    );
    assert!(login.try_exit()?.is_none(), "plexctl still waits");

    let callback = lab
        .browser()?
        .sign_in(&lab.issuer.url, &url, "alice")
        .await?;
    assert!(
        callback.as_str().starts_with(&redirect),
        "the issuer sends alice back to plexctl: {callback}"
    );
    let answer = plain.get(callback.as_str()).send().await?.text().await?;
    assert!(answer.contains("Signed in"), "{answer}");
    cli.finish_login(&mut login)?;
    cli.assert_projects(&[LAB_NODES_PROJECT])?;
    Ok(())
}

/// plexctl with a config of its own naming the lab's server and CA, and no token in its
/// environment: it calls with the session `plexctl login` saves, or not at all.
struct Cli {
    dir: tempfile::TempDir,
}

impl Cli {
    fn new(lab: &Lab) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        std::fs::write(
            dir.path().join("config.yaml"),
            format!(
                "server: {}\nca_file: {}\n",
                lab.cp.url,
                lab.cp.ca_file().display()
            ),
        )?;
        Ok(Self { dir })
    }

    fn command(&self, args: &[&str]) -> Result<std::process::Command> {
        let mut cmd = std::process::Command::new(plexsphere_e2e::bin("plexctl")?);
        cmd.env("PLEXCTL_CONFIG", self.dir.path().join("config.yaml"))
            .env_remove("PLEXCTL_SERVER")
            .env_remove("PLEXCTL_TOKEN")
            .env_remove("PLEXCTL_TOKEN_FILE")
            .args(args);
        Ok(cmd)
    }

    fn run(&self, args: &[&str]) -> Result<std::process::Output> {
        Ok(self.command(args)?.output()?)
    }

    /// Waits for a running `plexctl login` to succeed; answers its session file (mode 0600).
    fn finish_login(&self, login: &mut plexsphere_e2e::Proc) -> Result<std::path::PathBuf> {
        let status = plexsphere_e2e::wait_until(
            plexsphere_e2e::STARTUP_BOUND,
            "plexctl login to finish",
            || login.try_exit(),
        )?;
        assert!(status.success(), "{}", login.output());
        assert!(
            login.output().contains("signed in: session"),
            "{}",
            login.output()
        );
        let session_file = self.dir.path().join("session.json");
        assert_eq!(plexsphere_e2e::mode(&session_file)?, 0o600);
        Ok(session_file)
    }

    /// `plexctl project list` succeeds and lists exactly `want`.
    fn assert_projects(&self, want: &[&str]) -> Result<()> {
        let out = self.run(&["project", "list", "--output", "json"])?;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let projects: Value = serde_json::from_slice(&out.stdout)?;
        let ids: Vec<&str> = projects
            .as_array()
            .context("a list")?
            .iter()
            .filter_map(|p| p["id"].as_str())
            .collect();
        assert_eq!(ids, want);
        Ok(())
    }
}

/// `plexctl role bind|list|unbind` with the admin token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plexctl_binds_lists_and_unbinds_roles() -> Result<()> {
    let lab = Lab::start(&[])?;
    let out = lab.cp.plexctl_ok(&[
        "role",
        "bind",
        "--role",
        "auditor",
        "--project",
        LAB_NODES_PROJECT,
        "--group",
        "ops",
        "--output",
        "json",
    ])?;
    let b: Value = serde_json::from_str(&out)?;
    let id = b["id"].as_str().context("an id")?;
    let list = lab.cp.plexctl_ok(&["role", "list"])?;
    assert!(list.contains(id) && list.contains("group:ops"), "{list}");
    let twice = lab.cp.plexctl(&[
        "role",
        "bind",
        "--role",
        "auditor",
        "--project",
        LAB_NODES_PROJECT,
        "--group",
        "ops",
    ])?;
    assert_eq!(
        twice.status.code(),
        Some(1),
        "the same binding twice is a conflict"
    );
    lab.cp.plexctl_ok(&["role", "unbind", id])?;
    assert!(!lab.cp.plexctl_ok(&["role", "list"])?.contains(id));
    Ok(())
}

/// Sign-ins in progress are bounded per client: past the limit, 429 with `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_abandoned_sign_ins_is_refused() -> Result<()> {
    let lab = Lab::start(&[])?;
    let url = format!("{}/v1/auth/sign-in", lab.cp.url);
    for i in 0..20 {
        let r = lab.http.get(&url).send().await?;
        assert_eq!(r.status().as_u16(), 302, "sign-in {i}");
    }
    let r = lab.http.get(&url).send().await?;
    assert_eq!(r.status().as_u16(), 429);
    assert!(r.headers().contains_key("retry-after"));
    Ok(())
}
