//! The pure decisions of joining: what a refusal means for the operator, and when to retry.

use std::path::Path;
use std::time::Duration;

use plexsphere_wire::{ApiError, codes};

use crate::exit::{self, ExitCode};

/// The wait after a 429 when the server sent no `Retry-After`.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(3);

/// What to do after a 429.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLimitStep {
    /// Sleep this long, then ask again.
    RetryAfter(Duration),
    /// The next attempt would land past `--max-wait`.
    GiveUp,
}

/// The wait after a 429: `Retry-After` (default 3 s) plus full jitter over the same span.
/// `jitter` is a uniform sample in `[0, 1)`.
pub fn rate_limit_delay(retry_after: Option<Duration>, jitter: f64) -> Duration {
    let base = retry_after.unwrap_or(DEFAULT_RETRY_AFTER);
    base + base.mul_f64(jitter.clamp(0.0, 1.0))
}

/// Whether another attempt fits: `elapsed` since the first attempt, `delay` before the next.
pub fn rate_limit_step(elapsed: Duration, delay: Duration, max_wait: Duration) -> RateLimitStep {
    if elapsed.saturating_add(delay) > max_wait {
        RateLimitStep::GiveUp
    } else {
        RateLimitStep::RetryAfter(delay)
    }
}

/// The first wait after a connection failure (refused, DNS, timeout, TLS handshake I/O).
pub const CONNECT_RETRY_INITIAL: Duration = Duration::from_millis(500);
/// The longest wait between two connection attempts (the ceiling stops doubling here).
pub const CONNECT_RETRY_CAP: Duration = Duration::from_secs(30);

/// The wait before connection attempt `failures + 1` after `failures` failed ones:
/// exponential backoff (`CONNECT_RETRY_INITIAL * 2^(failures-1)`, at most
/// [`CONNECT_RETRY_CAP`]) with full jitter (`unit`, a uniform sample in `[0, 1)`, picks
/// anywhere from 0 to that ceiling), so a fleet booting at once does not retry in step.
/// The same formula as the daemon's reconnect backoff ([`crate::backoff`]).
pub fn connect_retry_delay(failures: u32, unit: f64) -> Duration {
    crate::backoff::ceiling(
        CONNECT_RETRY_INITIAL,
        CONNECT_RETRY_CAP,
        failures.saturating_sub(1),
    )
    .mul_f64(unit.clamp(0.0, 1.0))
}

/// The message when the API stayed unreachable until `--max-wait` ran out.
pub fn unreachable_message(last_error: &str, max_wait: Duration, attempts: u32) -> String {
    format!(
        "{last_error} (gave up after {attempts} attempts over {}s, --max-wait); check the network and the control plane, then start plexd again, or raise --max-wait",
        max_wait.as_secs()
    )
}

/// The exit code and the one-line message for a refusal of `POST /v1/register`.
pub fn refusal(
    status: u16,
    err: &ApiError,
    token_file: &Path,
    config_file: &Path,
    api_url: &str,
) -> (ExitCode, String) {
    let code = exit::for_register_refusal(status, &err.code);
    let token = token_file.display();
    let msg = match err.code.as_str() {
        codes::TOKEN_CONSUMED => format!(
            "the bootstrap token in {token} was already used (token_consumed, HTTP {status}); write a fresh token to {token} and start plexd again"
        ),
        codes::TOKEN_UNKNOWN
        | codes::TOKEN_EXPIRED
        | codes::TOKEN_REVOKED
        | codes::TOKEN_KIND_MISMATCH => format!(
            "the bootstrap token in {token} was refused: {} ({}, HTTP {status}); write a fresh token to {token} and start plexd again",
            err.message, err.code
        ),
        codes::PROJECT_MISMATCH => format!(
            "the bootstrap token in {token} belongs to another project than registration.project_id in {}: {} (project_mismatch, HTTP {status}); fix registration.project_id or write a token of that project to {token}, then start plexd again",
            config_file.display(),
            err.message
        ),
        codes::MESH_RANGE_EXHAUSTED => format!(
            "the API at {api_url} has no free mesh address for this node: {} (mesh_range_exhausted, HTTP {status}); ask an operator to free addresses or widen the range, then start plexd again",
            err.message
        ),
        codes::PROOF_REQUIRED | codes::PROOF_INVALID => format!(
            "the API at {api_url} refused this node's proof of its WireGuard key: {} ({}, HTTP {status}); check that this plexd ({}) matches the control plane's version, then start plexd again",
            err.message,
            err.code,
            env!("CARGO_PKG_VERSION")
        ),
        codes::KEY_IN_USE | codes::KEY_PREFIX_IN_USE => format!(
            "the API at {api_url} refused this node's WireGuard key: {} ({}, HTTP {status}); remove the key file in the state dir (a fresh key is made), then start plexd again",
            err.message, err.code
        ),
        _ if status >= 500 => format!(
            "the API at {api_url} failed: {} ({}, HTTP {status}); check the server's log, then start plexd again",
            err.message, err.code
        ),
        _ => format!(
            "the API at {api_url} refused the registration: {} ({}, HTTP {status}); check that this plexd ({}) matches the server's version",
            err.message,
            err.code,
            env!("CARGO_PKG_VERSION")
        ),
    };
    (code, msg)
}

/// The message when 429s outlast `--max-wait`.
pub fn rate_limited_message(api_url: &str, max_wait: Duration, attempts: u32) -> String {
    format!(
        "the API at {api_url} still answered 429 rate_limited after {attempts} attempts over {}s (--max-wait); wait a minute and start plexd again, or raise --max-wait",
        max_wait.as_secs()
    )
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn consumed_message_is_exact() {
        let t = PathBuf::from("/etc/plexd/bootstrap-token");
        let (code, msg) = refusal(
            403,
            &ApiError::new(codes::TOKEN_CONSUMED, "used"),
            &t,
            Path::new("/etc/plexd/config.yaml"),
            "https://a",
        );
        assert_eq!(code.as_i32(), 10);
        assert_eq!(
            msg,
            "the bootstrap token in /etc/plexd/bootstrap-token was already used (token_consumed, HTTP 403); write a fresh token to /etc/plexd/bootstrap-token and start plexd again"
        );
    }

    #[test]
    fn other_refusals_carry_code_message_and_next_step() {
        let t = Path::new("/t");
        let c = Path::new("/c.yaml");
        let (code, msg) = refusal(
            401,
            &ApiError::new(codes::TOKEN_EXPIRED, "expired at X"),
            t,
            c,
            "https://a",
        );
        assert_eq!(code.as_i32(), 11);
        assert!(
            msg.contains("expired at X (token_expired, HTTP 401)")
                && msg.contains("write a fresh token to /t"),
            "{msg}"
        );
        let (code, msg) = refusal(
            403,
            &ApiError::new(codes::PROJECT_MISMATCH, "m"),
            t,
            c,
            "https://a",
        );
        assert_eq!(code.as_i32(), 11);
        assert!(msg.contains("registration.project_id in /c.yaml"), "{msg}");
        let (code, msg) = refusal(
            409,
            &ApiError::new(codes::MESH_RANGE_EXHAUSTED, "full"),
            t,
            c,
            "https://a",
        );
        assert_eq!(code.as_i32(), 14);
        assert!(msg.contains("mesh_range_exhausted, HTTP 409"), "{msg}");
        let (code, msg) = refusal(
            503,
            &ApiError::new(codes::UNAVAILABLE, "db down"),
            t,
            c,
            "https://a",
        );
        assert_eq!(code.as_i32(), 14);
        assert!(msg.contains("server's log"), "{msg}");
        assert!(!msg.contains('\n'));
    }

    #[test]
    fn delay_is_retry_after_plus_full_jitter() {
        assert_eq!(rate_limit_delay(None, 0.0), Duration::from_secs(3));
        assert_eq!(
            rate_limit_delay(Some(Duration::from_secs(4)), 0.5),
            Duration::from_secs(6)
        );
        assert!(rate_limit_delay(Some(Duration::from_secs(4)), 0.999) < Duration::from_secs(8));
        assert_eq!(
            rate_limit_delay(Some(Duration::from_secs(4)), 7.0),
            Duration::from_secs(8)
        );
    }

    #[test]
    fn connect_retries_back_off_exponentially_with_full_jitter_up_to_the_cap() {
        let ceilings: Vec<u128> = (1..=9)
            .map(|n| connect_retry_delay(n, 0.999_999).as_millis())
            .collect();
        assert_eq!(
            ceilings,
            vec![499, 999, 1999, 3999, 7999, 15999, 29999, 29999, 29999]
        );
        // Full jitter: from nothing to the ceiling.
        assert_eq!(connect_retry_delay(5, 0.0), Duration::ZERO);
        assert_eq!(connect_retry_delay(3, 0.5), Duration::from_secs(1));
        assert_eq!(connect_retry_delay(u32::MAX, 0.5), Duration::from_secs(15));
        assert_eq!(connect_retry_delay(0, 7.0), CONNECT_RETRY_INITIAL);
        let m = unreachable_message(
            "the API at https://a is not reachable: refused",
            Duration::from_secs(20),
            6,
        );
        assert!(
            m.contains("6 attempts over 20s") && m.contains("--max-wait"),
            "{m}"
        );
    }

    #[test]
    fn gives_up_when_the_next_attempt_passes_the_bound() {
        let max = Duration::from_secs(300);
        let d = Duration::from_secs(5);
        assert_eq!(
            rate_limit_step(Duration::from_secs(0), d, max),
            RateLimitStep::RetryAfter(d)
        );
        assert_eq!(
            rate_limit_step(Duration::from_secs(295), d, max),
            RateLimitStep::RetryAfter(d)
        );
        assert_eq!(
            rate_limit_step(Duration::from_secs(296), d, max),
            RateLimitStep::GiveUp
        );
        assert_eq!(
            rate_limit_step(Duration::ZERO, d, Duration::ZERO),
            RateLimitStep::GiveUp
        );
    }
}
