//! The web console end to end (root): the real control plane, two real plexd nodes in their
//! own network namespaces, a third node of another Project, and Debian's chromium driven over
//! WebDriver. A person signs in, sees the nodes and their path on the map, issues a token and
//! sees it once, revokes a node and watches it go, reads the audit rows; a Project member sees
//! only their Project; a name with HTML is refused by the API and HTML in what is shown stays
//! text. The screenshots of docs/console.md are taken here (`docs/console/*.png`).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::time::Duration;

use plexsphere_e2e::browser::{Browser, PAGE_BOUND, WINDOW};
use plexsphere_e2e::netns::{self, Lab};
use plexsphere_e2e::oidc::{
    Auth, CLI_CLIENT_ID, CONSOLE_CLIENT_ID, Issuer, RoleBinding, bind_role, call, password,
};
use plexsphere_e2e::{
    ControlPlane, Host, LAB_NODES_PROJECT, OPENSTACK_PROJECT, Proc, ha_client, wait_until,
};
use serde_json::{Value, json};

const BOUND: Duration = Duration::from_secs(60);
/// A name no console may turn into markup: the test fails if the image's handler ran.
const HTML_NAME: &str = "<img src=x onerror=\"window.__xss=1\">";

fn config_extra(iface: &str) -> String {
    format!(
        "wireguard:\n  backend: userspace\n  interface: {iface}\ndaemon:\n  backoff_initial_ms: 200\n  backoff_cap_secs: 2\n  intervals:\n    heartbeat_secs: 1\n    endpoint_report_secs: 1\n    state_poll_secs: 2\n    ingest_secs: 1\n"
    )
}

struct Node {
    ns: String,
    host: Host,
    _proc: Proc,
}

/// A plexd node of the lab's node Project in its own namespace, reaching the control plane
/// at `api_url`, started and enrolled with its event stream up.
fn start_node(lab: &mut Lab, api_url: &str, ca: &Path, token: &str, root: &Path) -> Node {
    let i = lab.nodes_len();
    let ns = lab.add_node().unwrap();
    let host = Host::new(&root.join(format!("node{i}"))).unwrap();
    host.write_config(
        api_url,
        ca,
        LAB_NODES_PROJECT,
        &format!("node{i}"),
        &config_extra(&lab.wg_iface(i)),
    )
    .unwrap();
    host.write_token(token).unwrap();
    let proc = netns::start_daemon(&ns, &host).unwrap();
    wait_until(BOUND, "the daemon's event stream connects", || {
        Ok(host
            .status()?
            .filter(|s| s["event_stream_connected"] == true && !s["state_version"].is_null()))
    })
    .unwrap_or_else(|e| panic!("{e}\n--- plexd output:\n{}", proc.output()));
    Node {
        ns,
        host,
        _proc: proc,
    }
}

fn shots() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/console")
}

struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        call(&self.http, method, &url, Auth::Bearer(token), body)
            .await
            .unwrap()
    }

    async fn bind(
        &self,
        admin: &str,
        role: &str,
        scope: &str,
        scope_id: Option<&str>,
        kind: &str,
        who: &str,
    ) {
        let binding = RoleBinding {
            role,
            scope,
            scope_id,
            kind,
            who,
        };
        bind_role(&self.http, &self.base, admin, binding)
            .await
            .unwrap();
    }
}

/// Signs `user` in through the console's "Sign in with" link, at the issuer's own pages.
async fn sign_in_at_issuer(b: &Browser, base: &str, user: &str) {
    b.goto(&format!("{base}/sign-in")).await.unwrap();
    b.click("#sign-in-issuer").await.unwrap();
    b.fill("input[name=login]", user).await.unwrap();
    b.fill("input[name=password]", &password(user))
        .await
        .unwrap();
    b.click("button[type=submit]").await.unwrap();
    // The consent page, then back to the console signed in.
    b.wait_js("the issuer's consent page or the console",
        "return !!document.querySelector('#who button') || /Allow/.test(document.body.textContent);", PAGE_BOUND)
        .await
        .unwrap();
    if b.js("return !document.querySelector('#who button');", vec![])
        .await
        .unwrap()
        == json!(true)
    {
        b.click("button[type=submit]").await.unwrap();
    }
    b.wait_for("#who button").await.unwrap();
}

/// Signs the browser in with an operator token through the console's sign-in page.
async fn sign_in_with_token(b: &Browser, base: &str, token: &str) {
    b.goto(&format!("{base}/sign-in")).await.unwrap();
    // The token form is folded away where sign-in through an issuer is offered.
    b.wait_for("details summary").await.unwrap();
    if b.js("return !document.querySelector('details').open;", vec![])
        .await
        .unwrap()
        == json!(true)
    {
        b.click("details summary").await.unwrap();
    }
    b.fill("details input[type=password]", token).await.unwrap();
    b.click("details button[type=submit]").await.unwrap();
    b.wait_for("#who button").await.unwrap();
}

/// The session and CSRF cookies the browser holds for the console.
async fn cookies(b: &Browser) -> (String, String) {
    let all = b.client.get_all_cookies().await.unwrap();
    let find = |n: &str| {
        all.iter()
            .find(|c| c.name() == n)
            .map(|c| c.value().to_owned())
            .unwrap()
    };
    (
        find("__Host-plexsphere-session"),
        find("__Host-plexsphere-csrf"),
    )
}

async fn token_count(api: &Api, admin: &str) -> usize {
    let path = format!("/v1/projects/{LAB_NODES_PROJECT}/bootstrap-tokens");
    let (_, v) = api.call(reqwest::Method::GET, &path, admin, None).await;
    v["items"].as_array().unwrap().len()
}

#[test]
fn a_person_sees_the_mesh_in_the_console() {
    let tmp = tempfile::tempdir().unwrap();
    let issuer = Issuer::start().unwrap();
    let mut lab = Lab::new().unwrap();
    let host = lab.host_addr().to_string();
    // The console's origin is loopback (the issuer's test client redirects only there); the
    // nodes reach the same listener at the lab bridge's address.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base = format!("https://127.0.0.1:{port}");
    let secret = issuer.secret_file.to_string_lossy().into_owned();
    let cp = ControlPlane::start_dev_on(
        &tmp.path().join("cp"),
        &format!("0.0.0.0:{port}"),
        &[
            "--san",
            &host,
            "--public-url",
            &base,
            "--oidc-issuer",
            &issuer.url,
            "--oidc-client-id",
            CONSOLE_CLIENT_ID,
            "--oidc-client-secret-file",
            &secret,
            "--oidc-cli-client-id",
            CLI_CLIENT_ID,
        ],
    )
    .unwrap();
    let node_url = format!("https://{host}:{port}");
    let admin = std::fs::read_to_string(cp.data_dir.join("operator-token"))
        .unwrap()
        .trim()
        .to_owned();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let api = Api {
        http: ha_client::client(&cp.ca_file()).unwrap(),
        base: base.clone(),
    };
    let op = ha_client::Operator {
        http: api.http.clone(),
        base: base.clone(),
        token: admin.clone(),
    };
    let tokens: Vec<String> = (0..2)
        .map(|_| rt.block_on(op.issue_token(LAB_NODES_PROJECT)).unwrap())
        .collect();
    let nodes: Vec<Node> = tokens
        .iter()
        .map(|t| start_node(&mut lab, &node_url, &cp.ca_file(), t, tmp.path()))
        .collect();
    let ids: Vec<String> = nodes.iter().map(|n| n.host.identity().unwrap().0).collect();
    // Traffic between the two, so WireGuard handshakes and each plexd reports a path.
    let ip1 = nodes[1].host.identity().unwrap().1;
    wait_until(BOUND, "node0 pings node1 over the mesh", || {
        let out = netns::exec(&nodes[0].ns, "ping", &["-c", "1", "-W", "1", &ip1])?;
        Ok(out.status.success().then_some(()))
    })
    .unwrap();
    rt.block_on(async {
        // A node of the other Project: registered through the API, never started.
        let other_token = op.issue_token(OPENSTACK_PROJECT).await.unwrap();
        let other = ha_client::register(&api.http, &base, &other_token, "other-project-node").await.unwrap();
        let other_id = other.reg.node_id.to_string();
        // alice is a platform admin, bob's group a member of the lab's node Project.
        api.bind(&admin, "admin", "platform", None, "email", "alice@example.test").await;
        api.bind(&admin, "member", "project", Some(LAB_NODES_PROJECT), "group", "dev").await;

        let b = Browser::start(&cp.ca_file()).await.unwrap();

        // Sign in at the issuer, in the browser.
        sign_in_at_issuer(&b, &base, "alice").await;
        b.wait_text("#who .me", "alice@example.test").await.unwrap();

        // Nodes: both plexd nodes appear, online.
        b.goto(&format!("{base}/nodes")).await.unwrap();
        for id in &ids {
            b.wait_for(&format!("#nodes a[href='/nodes/{id}']")).await.unwrap();
        }
        b.wait_js("both nodes online",
            &format!("return [{}].every(id => {{ const a = document.querySelector(`#nodes a[href='/nodes/${{id}}']`); return !!a && a.closest('tr').textContent.includes('online'); }});",
                ids.iter().map(|i| format!("'{i}'")).collect::<Vec<_>>().join(",")),
            BOUND).await.unwrap();
        b.screenshot(&shots().join("nodes.png")).await.unwrap();

        // The node page: its peer and the path to it.
        b.click(&format!("#nodes a[href='/nodes/{}']", ids[0])).await.unwrap();
        b.wait_for("#node-status").await.unwrap();
        b.wait_js("the peer's path on the node page",
            &format!("const t = document.querySelector('#peers'); return !!t && /direct|relay/.test(t.textContent) && !!t.querySelector(\"a[href='/nodes/{}']\");", ids[1]),
            BOUND).await.unwrap();
        b.screenshot(&shots().join("node.png")).await.unwrap();

        // The map: the pair and its path, in the picture and in the table.
        b.goto(&format!("{base}/map")).await.unwrap();
        b.wait_js("the pair's line on the map",
            &format!("return !!document.querySelector(\"svg.map line.link:not(.link-none)[data-a='{a}'][data-b='{z}'], svg.map line.link:not(.link-none)[data-a='{z}'][data-b='{a}']\");", a = ids[0], z = ids[1]),
            BOUND).await.unwrap();
        b.wait_js("the pair's path in the table", "const t = document.querySelector('#links'); return !!t && /direct|relay/.test(t.textContent);", PAGE_BOUND).await.unwrap();
        b.screenshot(&shots().join("map.png")).await.unwrap();

        // Tokens: issued, shown once; a reload forgets it.
        b.goto(&format!("{base}/tokens?project={LAB_NODES_PROJECT}")).await.unwrap();
        b.fill("form.inline input[name=env]", "console").await.unwrap();
        b.click("form.inline button[type=submit]").await.unwrap();
        b.wait_for("#issued-token").await.unwrap();
        let token = b.text("#issued-token").await.unwrap();
        assert!(token.starts_with("pxbt_console_"), "{token}");
        b.screenshot(&shots().join("tokens.png")).await.unwrap();
        b.client.refresh().await.unwrap();
        b.wait_for("#tokens").await.unwrap();
        assert_eq!(b.js("return document.querySelector('#issued-token') === null && !document.body.textContent.includes(arguments[0]);", vec![json!(token)]).await.unwrap(), json!(true), "the token is shown once");

        // A cookie-authenticated write without the CSRF header is refused and changes nothing;
        // the same write with it goes through.
        let (session, csrf) = cookies(&b).await;
        let before = token_count(&api, &admin).await;
        let cookie = format!("__Host-plexsphere-session={session}; __Host-plexsphere-csrf={csrf}");
        let issue = |with_header: bool| {
            let mut r = api.http.post(format!("{base}/v1/projects/{LAB_NODES_PROJECT}/bootstrap-tokens"))
                .header("Cookie", &cookie)
                .json(&json!({"kind": "node", "env_prefix": "csrf", "ttl_secs": 3600}));
            if with_header {
                r = r.header("X-Plexsphere-CSRF", &csrf);
            }
            r.send()
        };
        let r = issue(false).await.unwrap();
        assert_eq!(r.status().as_u16(), 403);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["code"], "csrf_required", "{v}");
        assert_eq!(token_count(&api, &admin).await, before, "nothing changed");
        assert_eq!(issue(true).await.unwrap().status().as_u16(), 201);

        // Revoke a node (through the API) and watch it go on the open nodes page, live.
        b.goto(&format!("{base}/nodes")).await.unwrap();
        b.wait_for(&format!("#nodes a[href='/nodes/{}']", ids[1])).await.unwrap();
        let (s, v) = api.call(reqwest::Method::POST, &format!("/v1/nodes/{}/revoke", ids[1]), &admin, None).await;
        assert_eq!(s, 200, "{v}");
        b.wait_js("the revoked node shown revoked without a reload",
            &format!("const a = document.querySelector(\"#nodes a[href='/nodes/{}']\"); return !a || a.closest('tr').textContent.includes('revoked');", ids[1]),
            BOUND).await.unwrap();

        // The policy page.
        b.goto(&format!("{base}/policy")).await.unwrap();
        b.wait_for("textarea").await.unwrap();
        b.screenshot(&shots().join("policy.png")).await.unwrap();

        // A phone's width: the nodes page fits (no horizontal scroll of the page).
        b.set_width(375).await.unwrap();
        b.goto(&format!("{base}/nodes")).await.unwrap();
        b.wait_for("#nodes").await.unwrap();
        assert_eq!(b.js("return document.documentElement.scrollWidth <= window.innerWidth + 1;", vec![]).await.unwrap(), json!(true), "the page fits 375 px");
        b.screenshot(&shots().join("nodes-phone.png")).await.unwrap();
        b.set_width(WINDOW.0).await.unwrap();

        // bob, a member of the lab's node Project, sees only that Project's nodes: in the page
        // (his own browser) and in the API (his bearer session is the same check; a token
        // limited to the Project shows the API side).
        let bob = Browser::start(&cp.ca_file()).await.unwrap();
        sign_in_at_issuer(&bob, &base, "bob").await;
        bob.goto(&format!("{base}/nodes")).await.unwrap();
        bob.wait_for(&format!("#nodes a[href='/nodes/{}']", ids[0])).await.unwrap();
        assert_eq!(bob.js("return document.querySelector('#nodes').textContent.includes(arguments[0]) || !!document.querySelector(\"a[href='/nodes/\" + arguments[1] + \"']\");",
            vec![json!("other-project-node"), json!(other_id)]).await.unwrap(), json!(false), "the page shows the other Project's node");
        assert_eq!(bob.js("return [...document.querySelectorAll('#nav a')].some(a => a.textContent === 'Audit log');", vec![]).await.unwrap(), json!(false), "a member is not offered the audit log");
        bob.goto(&format!("{base}/nodes/{other_id}")).await.unwrap();
        bob.wait_for("main .error").await.unwrap();
        assert!(!bob.text("main").await.unwrap().contains("other-project-node"));
        let (bob_session, _) = cookies(&bob).await;
        let r = api.http.get(format!("{base}/v1/nodes")).header("Cookie", format!("__Host-plexsphere-session={bob_session}")).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let v: Value = r.json().await.unwrap();
        assert!(!v.to_string().contains(&other_id), "the API shows bob the other Project's node: {v}");
        assert!(v.to_string().contains(&ids[0]), "{v}");
        let r = api.http.get(format!("{base}/v1/nodes/{other_id}")).header("Cookie", format!("__Host-plexsphere-session={bob_session}")).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 404, "the other Project's node is not found for bob");
        bob.close().await.unwrap();

        // A name with HTML: the API refuses it and nothing changes...
        let (s, v) = api.call(reqwest::Method::PUT, &format!("/v1/nodes/{}/name", ids[0]), &admin, Some(json!({"name": HTML_NAME}))).await;
        assert_eq!(s, 422, "{v}");
        assert_eq!(v["code"], "invalid_request", "{v}");
        let (_, n) = api.call(reqwest::Method::GET, &format!("/v1/nodes/{}", ids[0]), &admin, None).await;
        assert!(!n.to_string().contains("<img"), "{n}");
        // ...and where the API does keep HTML (an operator token's name), the console shows it
        // as text: no element is made and no handler runs.
        let (s, v) = api.call(reqwest::Method::POST, "/v1/operator-tokens", &admin,
            Some(json!({"name": HTML_NAME, "scope": "read-only"}))).await;
        assert_eq!(s, 201, "{v}");
        let html_token = v["token"].as_str().unwrap().to_owned();
        let t = Browser::start(&cp.ca_file()).await.unwrap();
        sign_in_with_token(&t, &base, &html_token).await;
        t.goto(&format!("{base}/nodes")).await.unwrap();
        t.wait_text("#who .me", HTML_NAME).await.unwrap();
        assert_eq!(t.js("return document.querySelectorAll('img').length === 0 && window.__xss === undefined;", vec![]).await.unwrap(), json!(true));
        t.close().await.unwrap();

        // The audit log: the token issued and the node revoked, in the API and on the page.
        // ou builds the log in parallel; this part runs once the lead has merged it.
        let domain = {
            let (s, v) = api.call(reqwest::Method::GET, "/v1/domains", &admin, None).await;
            assert_eq!(s, 200, "{v}");
            v["items"][0]["id"].as_str().unwrap().to_owned()
        };
        let (s, v) = api.call(reqwest::Method::GET, &format!("/v1/audit?domain={domain}&limit=100"), &admin, None).await;
        assert_eq!(s, 200, "{v}");
        let text = v.to_string();
        assert!(text.contains("token.issue") && text.contains("node.revoke"), "{v}");
        b.goto(&format!("{base}/audit")).await.unwrap();
        b.wait_text("#audit", "token.issue").await.unwrap();
        b.wait_text("#audit", "node.revoke").await.unwrap();
        b.screenshot(&shots().join("audit.png")).await.unwrap();
        b.close().await.unwrap();
    });
}
