//! Validated config values. Each checks itself while the YAML is parsed, so a bad value is
//! reported with the key, the file and the line by the parser's own location.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

/// The control plane's origin, e.g. `https://plexsphere.example`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiUrl(reqwest::Url);

impl ApiUrl {
    pub fn parse(text: &str) -> Result<Self, String> {
        let url = reqwest::Url::parse(text.trim())
            .map_err(|e| format!("`{text}` is not a URL ({e}); write it as https://<host>"))?;
        match url.scheme() {
            "https" | "http" => {}
            other => {
                return Err(format!(
                    "`{text}` has the scheme `{other}`; plexd talks to the API over https://"
                ));
            }
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(format!("`{text}` has no host"));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(format!("`{text}` must not carry a query or fragment"));
        }
        Ok(Self(url))
    }

    pub(crate) fn is_https(&self) -> bool {
        self.0.scheme() == "https"
    }

    pub fn url(&self) -> &reqwest::Url {
        &self.0
    }

    /// The URL of an API path (`/v1/register`) under this origin, keeping any base path.
    pub fn join(&self, path: &str) -> reqwest::Url {
        let mut url = self.0.clone();
        let base = url.path().trim_end_matches('/').to_owned();
        url.set_path(&format!("{base}{path}"));
        url
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str().trim_end_matches('/')
    }
}

impl fmt::Display for ApiUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A SHA-256 fingerprint of a certificate's DER: 64 hex digits, colons optional, any case.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Sha256Pin(pub [u8; 32]);

impl Sha256Pin {
    pub fn parse(text: &str) -> Result<Self, String> {
        let digits: String = text.chars().filter(|c| *c != ':').collect();
        let bytes = hex_decode(&digits)
            .filter(|b| b.len() == 32)
            .ok_or_else(|| {
                format!("`{text}` is not a SHA-256 fingerprint (64 hex digits, colons optional)")
            })?;
        let mut out = [0u8; 32];
        out.copy_from_slice(&bytes);
        Ok(Self(out))
    }

    /// The colon-separated upper-case form, as `openssl x509 -fingerprint -sha256` prints it.
    pub fn to_colon_hex(&self) -> String {
        self.0
            .iter()
            .map(|b| format!("{b:02X}"))
            .collect::<Vec<_>>()
            .join(":")
    }
}

impl fmt::Debug for Sha256Pin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sha256Pin({})", self.to_colon_hex())
    }
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|p| u8::from_str_radix(p, 16).ok()))
        .collect()
}

/// `registration.resource_handle`: 1-63 characters of `a-z 0-9 - . _`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceHandle(String);

impl ResourceHandle {
    pub fn parse(text: &str) -> Result<Self, String> {
        let ok = (1..=63).contains(&text.len())
            && text.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.' | b'_')
            });
        if ok {
            Ok(Self(text.to_owned()))
        } else {
            Err(format!(
                "`{text}` is not a resource handle (1-63 characters of a-z, 0-9, `-`, `.`, `_`)"
            ))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `log.level`: a tracing filter such as `info` or `plexd=debug,warn`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLevel(String);

impl LogLevel {
    pub fn parse(text: &str) -> Result<Self, String> {
        crate::logging::filter(text)
            .map(|_| Self(text.to_owned()))
            .map_err(|e| format!("`{text}` is not a log level or filter ({e}); use error, warn, info, debug or trace"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

macro_rules! string_serde {
    ($ty:ty, $to:expr) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                // A visitor, so that the error is raised while the parser still stands on the
                // value: serde_norway then names the full key path (`tls.ca_sha256`).
                struct V;
                impl de::Visitor<'_> for V {
                    type Value = $ty;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str("a string")
                    }
                    fn visit_str<E: de::Error>(self, s: &str) -> Result<$ty, E> {
                        <$ty>::parse(s).map_err(E::custom)
                    }
                }
                d.deserialize_str(V)
            }
        }
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let f: fn(&$ty) -> String = $to;
                s.serialize_str(&f(self))
            }
        }
    };
}

string_serde!(ApiUrl, |v| v.as_str().to_owned());
string_serde!(Sha256Pin, |v| v.to_colon_hex());
string_serde!(ResourceHandle, |v| v.0.clone());
string_serde!(LogLevel, |v| v.0.clone());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_url_checks() {
        assert!(ApiUrl::parse("https://a.example").unwrap().is_https());
        assert!(!ApiUrl::parse("http://a.example").unwrap().is_https());
        assert!(
            ApiUrl::parse("ftp://a.example")
                .unwrap_err()
                .contains("ftp")
        );
        assert!(ApiUrl::parse("not a url").is_err());
        assert!(ApiUrl::parse("https://a.example/?x=1").is_err());
        let u = ApiUrl::parse("https://a.example/base/").unwrap();
        assert_eq!(
            u.join("/v1/register").as_str(),
            "https://a.example/base/v1/register"
        );
        assert_eq!(u.to_string(), "https://a.example/base");
        let plain = ApiUrl::parse("https://a.example").unwrap();
        assert_eq!(plain.to_string(), "https://a.example");
        assert_eq!(
            plain.join("/v1/register").as_str(),
            "https://a.example/v1/register"
        );
    }

    #[test]
    fn pin_accepts_colons_and_case() {
        let hex = "ab".repeat(32);
        let a = Sha256Pin::parse(&hex).unwrap();
        let colon = a.to_colon_hex();
        assert_eq!(colon.len(), 32 * 3 - 1);
        assert_eq!(Sha256Pin::parse(&colon).unwrap(), a);
        assert_eq!(Sha256Pin::parse(&colon.to_lowercase()).unwrap(), a);
        assert!(Sha256Pin::parse("abcd").is_err());
        assert!(Sha256Pin::parse(&"zz".repeat(32)).is_err());
    }

    #[test]
    fn handle_charset() {
        assert!(ResourceHandle::parse("web-1.a_b").is_ok());
        assert!(ResourceHandle::parse("Web").is_err());
        assert!(ResourceHandle::parse("").is_err());
        assert!(ResourceHandle::parse(&"a".repeat(64)).is_err());
        assert!(ResourceHandle::parse("a b").is_err());
    }

    #[test]
    fn log_level() {
        assert!(LogLevel::parse("info").is_ok());
        assert!(LogLevel::parse("plexd=debug,warn").is_ok());
        assert!(LogLevel::parse("loud=[").is_err());
        // The config fuzz target's finding: tracing-subscriber's directive parser panicked on
        // this (a slice inside a 4-byte character); it is a clear refusal now.
        let e = LogLevel::parse("\t\ttps:/\ttps:/[prtps://api_u\u{8b414}enf\u{8b414} {{{{")
            .unwrap_err();
        assert!(e.contains("ASCII"), "{e}");
    }
}
