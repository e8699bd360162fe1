//! One gauge as a replica reports it on `GET {base}/metrics` (docs/metrics.md): what the HA
//! tests (`plexsphere_event_bus_connected`) and the lease tests (`plexsphere_broker_leader`)
//! read to see what an operator's monitoring sees.

use anyhow::{Context, Result, bail};

/// The value of the unlabelled sample `name` on `GET {base}/metrics`, asked with `bearer`.
/// The line must be `name value`, the value an integer (a gauge such as `0` or `1`); the
/// error names the metric and shows the whole text when the answer is not a success, the
/// sample is missing or its value does not parse.
pub async fn gauge(http: &reqwest::Client, base: &str, bearer: &str, name: &str) -> Result<i64> {
    let url = format!("{base}/metrics");
    let r = http
        .get(&url)
        .bearer_auth(bearer)
        .send()
        .await
        .with_context(|| format!("GET {url} for {name}"))?;
    let status = r.status();
    let text = r
        .text()
        .await
        .with_context(|| format!("the body of GET {url} for {name}"))?;
    if !status.is_success() {
        bail!("GET {url} for {name} answered {status}:\n{text}");
    }
    sample(&text, name).with_context(|| format!("{name} on GET {url}:\n{text}"))
}

/// The integer value of the unlabelled sample `name` in a Prometheus text exposition.
fn sample(text: &str, name: &str) -> Result<i64> {
    let value = text
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .context("no such sample")?;
    value
        .trim()
        .parse()
        .with_context(|| format!("the value {value:?} is not an integer"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    const TEXT: &str = "# TYPE plexsphere_broker_leader gauge\n\
        plexsphere_broker_leader_total 7\n\
        plexsphere_broker_leader 1\n\
        plexsphere_event_bus_connected 0\n\
        plexsphere_odd nan\n";

    #[test]
    fn a_sample_is_read_by_its_whole_name() {
        assert_eq!(sample(TEXT, "plexsphere_broker_leader").unwrap(), 1);
        assert_eq!(sample(TEXT, "plexsphere_event_bus_connected").unwrap(), 0);
        assert_eq!(sample(TEXT, "plexsphere_broker_leader_total").unwrap(), 7);
    }

    #[test]
    fn a_missing_or_odd_sample_is_an_error() {
        let missing = sample(TEXT, "plexsphere_broker").unwrap_err();
        assert_eq!(missing.to_string(), "no such sample");
        let odd = format!("{:#}", sample(TEXT, "plexsphere_odd").unwrap_err());
        assert!(odd.contains("\"nan\" is not an integer"), "{odd}");
    }

    /// Serves one HTTP/1.1 answer with `status` and `body`; hands back the request it read.
    async fn serve_once(
        status: &'static str,
        body: &'static str,
    ) -> (String, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut buf).await.unwrap();
                assert!(n > 0, "the client closed before its request ended");
                head.extend_from_slice(&buf[..n]);
            }
            let reply = format!(
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            conn.write_all(reply.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&head).into_owned()
        });
        (base, task)
    }

    fn client() -> reqwest::Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        reqwest::Client::new()
    }

    #[tokio::test]
    async fn the_gauge_is_asked_with_the_bearer() {
        let (base, server) = serve_once("200 OK", TEXT).await;
        let value = gauge(&client(), &base, "tok", "plexsphere_broker_leader")
            .await
            .unwrap();
        assert_eq!(value, 1);
        let request = server.await.unwrap();
        assert!(
            request.starts_with("GET /metrics HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(
            request
                .to_ascii_lowercase()
                .contains("authorization: bearer tok\r\n"),
            "{request}"
        );
    }

    /// The error `gauge` gives for `name` when the server answers `status` and `body`.
    async fn error_of(status: &'static str, body: &'static str, name: &str) -> String {
        let (base, server) = serve_once(status, body).await;
        let err = gauge(&client(), &base, "tok", name).await.unwrap_err();
        server.await.unwrap();
        format!("{err:#}")
    }

    #[tokio::test]
    async fn the_error_names_the_metric_and_shows_the_text() {
        let err = error_of("200 OK", TEXT, "plexsphere_nope").await;
        assert!(err.contains("plexsphere_nope on GET"), "{err}");
        assert!(err.contains("plexsphere_broker_leader 1"), "{err}");

        let err = error_of("401 Unauthorized", "no token\n", "plexsphere_broker_leader").await;
        assert!(
            err.contains("plexsphere_broker_leader answered 401") && err.contains("no token"),
            "{err}"
        );
    }
}
