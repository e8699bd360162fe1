//! The one duration syntax of every flag and config value: `90s`, `30m`, `1h30m`, `2d`.
//!
//! A duration is one or more `<number><unit>` parts with the units `d` (86 400 s), `h`,
//! `m` and `s`, each at most once and from the largest to the smallest (`1d2h30m`, never
//! `30m1h`, so a text has one reading). Surrounding whitespace is ignored, nothing else is:
//! no spaces inside, no signs, no fractions, no capitals. Refused with a message that quotes
//! the text and says what to type: an empty text, a unit without a number, an unknown unit,
//! a total past `u64` seconds, and (unless the caller allows it) zero and a bare number.
//!
//! [`Rules`] says what a caller accepts beyond that: a bare number as seconds (for flags and
//! keys that took seconds before this syntax, e.g. `plexd join --max-wait 300`) and zero
//! (where zero means "off"). [`format`] writes the canonical text; `parse(format(n)) == n`.

/// Seconds per unit, in the order the units must appear.
const UNITS: [(char, u64); 4] = [('d', 86_400), ('h', 3_600), ('m', 60), ('s', 1)];

/// What a caller accepts besides the strict syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rules {
    /// A bare number (`300`) is that many seconds.
    pub bare_seconds: bool,
    /// Zero (`0s`, `0h0m`, and `0` with `bare_seconds`) is a valid duration.
    pub zero: bool,
}

impl Rules {
    /// Units required, zero refused: lifetimes and intervals.
    pub const STRICT: Rules = Rules {
        bare_seconds: false,
        zero: false,
    };
    /// A bare number is seconds, zero refused: flags that took seconds before.
    pub const SECONDS_OK: Rules = Rules {
        bare_seconds: true,
        zero: false,
    };
}

/// Why a duration was refused. The message quotes the text and shows valid forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("the duration is empty; give one like 90s, 30m, 1h, 2d or 1h30m")]
    Empty,
    #[error("the duration `{0}` has a number without a unit; add s, m, h or d (e.g. {0}s)")]
    MissingUnit(String),
    #[error(
        "the duration `{text}` has a unit `{unit}` without a number before it; write e.g. 1{unit}"
    )]
    MissingNumber { text: String, unit: char },
    #[error(
        "the duration `{text}` has the unknown unit `{unit}`; use s, m, h or d (e.g. 90s, 30m, 1h, 2d)"
    )]
    UnknownUnit { text: String, unit: char },
    #[error(
        "the duration `{0}` repeats a unit or puts a smaller one first; write the units from d to s once each, e.g. 1d2h30m"
    )]
    Order(String),
    #[error("the duration `{0}` is too large to count in seconds; use a shorter one")]
    Overflow(String),
    #[error("the duration `{0}` is zero; give a positive one, e.g. 30s or 1h")]
    Zero(String),
}

/// Parses a duration into whole seconds: units required, zero refused ([`Rules::STRICT`]).
pub fn parse(input: &str) -> Result<u64, DurationError> {
    parse_with(input, Rules::STRICT)
}

/// Parses a duration into a [`std::time::Duration`] under `rules`.
pub fn parse_std(input: &str, rules: Rules) -> Result<std::time::Duration, DurationError> {
    parse_with(input, rules).map(std::time::Duration::from_secs)
}

/// Parses a duration into whole seconds under `rules`.
pub fn parse_with(input: &str, rules: Rules) -> Result<u64, DurationError> {
    let text = input.trim();
    if text.is_empty() {
        return Err(DurationError::Empty);
    }
    let overflow = || DurationError::Overflow(text.to_owned());
    let mut total: u64 = 0;
    let mut number: Option<u64> = None;
    // Index into UNITS of the next unit allowed; a unit before it repeats or reverses order.
    let mut next_unit = 0usize;
    for ch in text.chars() {
        if let Some(digit) = ch.to_digit(10) {
            let grown = number
                .unwrap_or(0)
                .checked_mul(10)
                .and_then(|n| n.checked_add(u64::from(digit)))
                .ok_or_else(overflow)?;
            number = Some(grown);
            continue;
        }
        let Some(pos) = UNITS.iter().position(|(unit, _)| *unit == ch) else {
            return Err(DurationError::UnknownUnit {
                text: text.to_owned(),
                unit: ch,
            });
        };
        let Some(n) = number.take() else {
            return Err(DurationError::MissingNumber {
                text: text.to_owned(),
                unit: ch,
            });
        };
        if pos < next_unit {
            return Err(DurationError::Order(text.to_owned()));
        }
        next_unit = pos + 1;
        let part = n.checked_mul(UNITS[pos].1).ok_or_else(overflow)?;
        total = total.checked_add(part).ok_or_else(overflow)?;
    }
    if let Some(n) = number {
        // Trailing digits: a bare number, or digits after the last unit (`1h30`).
        if !(rules.bare_seconds && next_unit == 0) {
            return Err(DurationError::MissingUnit(text.to_owned()));
        }
        total = n;
    }
    if total == 0 && !rules.zero {
        return Err(DurationError::Zero(text.to_owned()));
    }
    Ok(total)
}

/// The canonical text of `secs`: its units from `d` to `s`, zero parts left out (`5400` ->
/// `1h30m`, `0` -> `0s`). [`parse`] reads it back to the same number.
pub fn format(secs: u64) -> String {
    if secs == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    let mut rest = secs;
    for (unit, size) in UNITS {
        let n = rest / size;
        rest %= size;
        if n > 0 {
            out.push_str(&n.to_string());
            out.push(unit);
        }
    }
    out
}

#[cfg(test)]
#[path = "duration_tests.rs"]
mod tests;
