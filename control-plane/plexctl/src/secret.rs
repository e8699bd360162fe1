//! A string that must never reach a log, a Debug print or an error message.

use serde::Deserialize;

/// An operator token (or any other secret text). `Debug` prints `<redacted>`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// The secret text, for the one place that sends it (the Authorization header).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_text() {
        let s = Secret::new("pxop_0123456789abcdef_supersecret");
        let printed = format!("{s:?}");
        assert_eq!(printed, "Secret(<redacted>)");
        assert!(!printed.contains("supersecret"));
    }
}
