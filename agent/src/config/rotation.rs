//! `rotation:` how often the node replaces its WireGuard key and its credential by itself
//! (docs/operations.md, "Key rotation"). An interval is a duration in the one syntax of
//! `plexsphere_wire::duration` (`30d`, `12h`, `1d12h`, `90m`); `0` or `never` turns the
//! schedule off (on-demand rotation still works).

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The default of both intervals: 30 days.
pub(crate) const DEFAULT_ROTATION: Duration = Duration::from_secs(30 * 24 * 3600);
/// The shortest scheduled interval accepted: the control plane refuses faster rotations.
pub(crate) const MIN_ROTATION: Duration = Duration::from_secs(60);

/// A rotation interval; `None` is off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval(pub Option<Duration>);

impl Default for Interval {
    fn default() -> Self {
        Self(Some(DEFAULT_ROTATION))
    }
}

impl Interval {
    pub fn parse(text: &str) -> Result<Self, String> {
        use plexsphere_wire::duration::{Rules, parse_with};
        let t = text.trim();
        if t == "never" {
            return Ok(Self(None));
        }
        // A bare number is seconds (a YAML integer arrives as one); zero is off.
        let rules = Rules {
            bare_seconds: true,
            zero: true,
        };
        let secs = parse_with(t, rules).map_err(|e| {
            format!("{e} (a rotation interval is e.g. 30d, 12h, 90m, 600s, or never)")
        })?;
        if secs == 0 {
            return Ok(Self(None));
        }
        let d = Duration::from_secs(secs);
        if d < MIN_ROTATION {
            return Err(format!(
                "{t:?} is shorter than the shortest rotation interval, {} s (the control plane refuses faster rotations)",
                MIN_ROTATION.as_secs()
            ));
        }
        Ok(Self(Some(d)))
    }

    fn text(self) -> String {
        match self.0 {
            None => "never".to_owned(),
            Some(d) => plexsphere_wire::duration::format(d.as_secs()),
        }
    }
}

impl Serialize for Interval {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text())
    }
}

impl<'de> Deserialize<'de> for Interval {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        let text = match Raw::deserialize(d)? {
            Raw::N(n) => format!("{n}s"),
            Raw::S(s) => s,
        };
        Interval::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// `rotation:` the schedules.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RotationConfig {
    /// How old the WireGuard key may get (counted from when `wireguard.key` was written).
    #[serde(default)]
    pub key_interval: Interval,
    /// How old the node credential may get (counted from registration or the last rotation).
    #[serde(default)]
    pub credential_interval: Interval,
}

impl RotationConfig {
    pub(crate) fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_parse_and_print() {
        assert_eq!(Interval::parse("30d").unwrap().0, Some(DEFAULT_ROTATION));
        assert_eq!(
            Interval::parse("12h").unwrap().0,
            Some(Duration::from_secs(43_200))
        );
        assert_eq!(Interval::parse("never").unwrap().0, None);
        assert_eq!(Interval::parse("0").unwrap().0, None);
        assert_eq!(Interval::parse("0d").unwrap().0, None);
        assert!(Interval::parse("10s").unwrap_err().contains("shortest"));
        assert!(Interval::parse("5w").unwrap_err().contains("30d"));
        assert!(Interval::parse("d").is_err());
        // The one duration syntax: combined units too, and they print back the same way.
        let i = Interval::parse("1d12h").unwrap();
        assert_eq!(i.0, Some(Duration::from_secs(129_600)));
        assert_eq!(i.text(), "1d12h");
        assert_eq!(
            Interval::parse("600").unwrap().0,
            Some(Duration::from_secs(600))
        );
        assert!(
            Interval::parse("30m1h")
                .unwrap_err()
                .contains("from d to s")
        );
        let c: RotationConfig =
            serde_yaml::from_str("key_interval: 7d\ncredential_interval: never\n").unwrap();
        assert_eq!(c.key_interval.0, Some(Duration::from_secs(7 * 86_400)));
        assert_eq!(c.credential_interval.0, None);
        assert_eq!(
            serde_yaml::to_string(&c).unwrap(),
            "key_interval: 7d\ncredential_interval: never\n"
        );
        let e = serde_yaml::from_str::<RotationConfig>("key_interval: 5s\n").unwrap_err();
        assert!(e.to_string().contains("shortest"), "{e}");
    }
}
