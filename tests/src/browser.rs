//! A real browser for the console tests: Debian's `chromium` headless, driven over WebDriver
//! by `chromedriver` (fantoccini). It trusts exactly the control plane's lab CA (by the hash
//! of its public key, `--ignore-certificate-errors-spki-list`), keeps its profile in a
//! temporary directory, takes screenshots to files, and waits on DOM conditions with a bound.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use base64::Engine;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::process::{Proc, STARTUP_BOUND};

/// How long a page condition may take to hold (a page load, a live update).
pub const PAGE_BOUND: Duration = Duration::from_secs(30);
/// How often a condition is checked while waiting.
const POLL: Duration = Duration::from_millis(100);
/// A desktop window; [`Browser::set_width`] narrows it (375 for a phone).
pub const WINDOW: (u32, u32) = (1280, 900);

/// The flags of every run: no GPU, no network of its own, no first-run or sync noise.
const FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
];

/// A chromedriver process and one browser session.
pub struct Browser {
    pub client: Client,
    _driver: Proc,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and chromium trusting the CA in `ca_pem` (a PEM file).
    pub async fn start(ca_pem: &Path) -> Result<Self> {
        let pin = spki_sha256_base64(
            &std::fs::read(ca_pem).with_context(|| format!("reading {}", ca_pem.display()))?,
        )?;
        let mut cmd = Command::new("chromedriver");
        cmd.arg("--port=0");
        let driver = Proc::spawn(cmd).context(
            "starting chromedriver (apt-get install chromium-driver; scripts/deps.sh installs it)",
        )?;
        let line = driver.wait_for_line(STARTUP_BOUND, |l| {
            l.contains("started successfully on port")
        })?;
        let port: u16 = line
            .rsplit("port ")
            .next()
            .map(|p| p.trim().trim_end_matches('.'))
            .context("chromedriver's port")?
            .parse()
            .with_context(|| format!("chromedriver's port in {line:?}"))?;
        let profile = tempfile::tempdir()?;
        let mut args: Vec<String> = FLAGS.iter().map(|s| (*s).to_owned()).collect();
        args.push(format!("--user-data-dir={}", profile.path().display()));
        args.push(format!("--ignore-certificate-errors-spki-list={pin}"));
        args.push(format!("--window-size={},{}", WINDOW.0, WINDOW.1));
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({ "args": args, "binary": "/usr/bin/chromium" }),
        );
        caps.insert("acceptInsecureCerts".into(), json!(false));
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .with_context(|| {
                format!(
                    "a chromium session through chromedriver: {}",
                    driver.output()
                )
            })?;
        Ok(Self {
            client,
            _driver: driver,
            _profile: profile,
        })
    }

    pub async fn goto(&self, url: &str) -> Result<()> {
        self.client
            .goto(url)
            .await
            .with_context(|| format!("opening {url}"))
    }

    /// Resizes the window's viewport width (375: a phone).
    pub async fn set_width(&self, width: u32) -> Result<()> {
        self.client.set_window_size(width, WINDOW.1).await?;
        Ok(())
    }

    /// Runs `script` (a function body; `arguments` are `args`) and returns its value.
    pub async fn js(&self, script: &str, args: Vec<Value>) -> Result<Value> {
        self.client
            .execute(script, args)
            .await
            .with_context(|| format!("running {script}"))
    }

    /// Waits until `script` returns something truthy, for at most `bound`; returns it.
    pub async fn wait_js(&self, what: &str, script: &str, bound: Duration) -> Result<Value> {
        let deadline = Instant::now() + bound;
        loop {
            let last = match self.js(script, vec![]).await {
                Ok(v) if truthy(&v) => return Ok(v),
                Ok(v) => format!("{v}"),
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() > deadline {
                let url = self
                    .client
                    .current_url()
                    .await
                    .map(|u| u.to_string())
                    .unwrap_or_default();
                let text = self.text("body").await.unwrap_or_default();
                bail!(
                    "{what}: not within {bound:?} (last: {last}; at {url}; page: {})",
                    clip(&text, 600)
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits for an element matching `css` and returns it.
    pub async fn wait_for(&self, css: &str) -> Result<fantoccini::elements::Element> {
        self.client
            .wait()
            .at_most(PAGE_BOUND)
            .every(POLL)
            .for_element(Locator::Css(css))
            .await
            .with_context(|| format!("waiting for {css}"))
    }

    /// Waits until the text of the first `css` element contains `needle`.
    pub async fn wait_text(&self, css: &str, needle: &str) -> Result<()> {
        let script = format!(
            "const e = document.querySelector({}); return !!e && e.textContent.includes({});",
            json!(css),
            json!(needle)
        );
        self.wait_js(&format!("{css} showing {needle:?}"), &script, PAGE_BOUND)
            .await?;
        Ok(())
    }

    /// The text of the first element matching `css` (empty when there is none).
    pub async fn text(&self, css: &str) -> Result<String> {
        let script = format!(
            "const e = document.querySelector({}); return e ? e.textContent : '';",
            json!(css)
        );
        Ok(self
            .js(&script, vec![])
            .await?
            .as_str()
            .unwrap_or_default()
            .to_owned())
    }

    pub async fn click(&self, css: &str) -> Result<()> {
        self.wait_for(css)
            .await?
            .click()
            .await
            .with_context(|| format!("clicking {css}"))
    }

    /// Types `text` into the field matching `css` (after clearing it).
    pub async fn fill(&self, css: &str, text: &str) -> Result<()> {
        let e = self.wait_for(css).await?;
        e.clear().await?;
        e.send_keys(text)
            .await
            .with_context(|| format!("typing into {css}"))
    }

    /// A PNG of the window to `path` (its folder is created).
    pub async fn screenshot(&self, path: &Path) -> Result<()> {
        let png = self
            .client
            .screenshot()
            .await
            .context("taking a screenshot")?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, png).with_context(|| format!("writing {}", path.display()))
    }

    /// Ends the browser session (chromedriver ends with this value).
    pub async fn close(self) -> Result<()> {
        self.client.close().await.context("closing the browser")
    }
}

fn truthy(v: &Value) -> bool {
    !matches!(v, Value::Null | Value::Bool(false)) && v != &json!(0) && v != &json!("")
}

fn clip(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// Base64 of the SHA-256 of the first certificate's SubjectPublicKeyInfo in a PEM file: what
/// chromium's `--ignore-certificate-errors-spki-list` takes.
pub fn spki_sha256_base64(pem: &[u8]) -> Result<String> {
    let text = std::str::from_utf8(pem).context("the CA file is not PEM text")?;
    let b64: String = text
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE-----"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .context("the certificate's base64")?;
    let spki = spki_of(&der).context("no SubjectPublicKeyInfo in the certificate")?;
    let digest = ring::digest::digest(&ring::digest::SHA256, spki);
    Ok(base64::engine::general_purpose::STANDARD.encode(digest.as_ref()))
}

/// One DER element: (tag, whole element, contents, what follows it).
type Der<'a> = (u8, &'a [u8], &'a [u8], &'a [u8]);

/// The DER element at the start of `d`.
fn der(d: &[u8]) -> Option<Der<'_>> {
    let tag = *d.first()?;
    let first = *d.get(1)?;
    let (len, hdr) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let mut len = 0usize;
        for b in d.get(2..2 + n)? {
            len = (len << 8) | usize::from(*b);
        }
        (len, 2 + n)
    };
    let end = hdr.checked_add(len)?;
    Some((tag, d.get(..end)?, d.get(hdr..end)?, d.get(end..)?))
}

/// Certificate -> tbsCertificate -> [version], serial, signature, issuer, validity, subject,
/// subjectPublicKeyInfo.
fn spki_of(cert: &[u8]) -> Option<&[u8]> {
    let (_, _, cert, _) = der(cert)?;
    let (_, _, tbs, _) = der(cert)?;
    let mut rest = tbs;
    if rest.first() == Some(&0xa0) {
        rest = der(rest)?.3;
    }
    for _ in 0..5 {
        rest = der(rest)?.3;
    }
    Some(der(rest)?.1)
}
