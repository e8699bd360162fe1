//! One HTTP/1.1 `GET` from inside a network namespace (std's TcpStream on a thread that
//! entered it): how the tests scrape plexd's loopback-only metrics listener.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// The longest answer a scrape reads.
const MAX_ANSWER: u64 = 4 << 20;

/// `GET <path>` on `addr` from inside `ns`: the status code and the body. A connection
/// refused is an error whose chain says so (`io::ErrorKind::ConnectionRefused`).
pub fn get_in(ns: &str, addr: SocketAddr, path: &str, bound: Duration) -> Result<(u16, String)> {
    let path = path.to_owned();
    crate::netns::on_thread_in(ns, move || get(addr, &path, bound))
        .join()
        .map_err(|_| anyhow::anyhow!("the scrape thread panicked"))?
}

/// `GET <path>` on `addr` from this thread's namespace.
pub fn get(addr: SocketAddr, path: &str, bound: Duration) -> Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, bound)?;
    s.set_read_timeout(Some(bound))?;
    s.set_write_timeout(Some(bound))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/plain\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.take(MAX_ANSWER)
        .read_to_end(&mut raw)
        .context("reading the answer")?;
    let text = String::from_utf8(raw).context("the answer is not UTF-8")?;
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("no end of the answer's head: {text:?}");
    };
    let status_line = head.lines().next().unwrap_or_default();
    let mut parts = status_line.split(' ');
    let (Some(version), Some(code)) = (parts.next(), parts.next()) else {
        bail!("not a status line: {status_line:?}");
    };
    if !version.starts_with("HTTP/1.") {
        bail!("not HTTP/1: {status_line:?}");
    }
    let code: u16 = code
        .parse()
        .with_context(|| format!("status line {status_line:?}"))?;
    let length = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.trim().parse::<usize>())
        .transpose()
        .context("Content-Length")?;
    if let Some(n) = length
        && n != body.len()
    {
        bail!("Content-Length {n} but {} bytes of body", body.len());
    }
    Ok((code, body.to_owned()))
}
