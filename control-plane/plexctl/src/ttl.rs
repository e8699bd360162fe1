//! Lifetimes as operators type them: `90s`, `30m`, `1h`, `2d`, `1h30m`, `1d12h`.
//!
//! A lifetime is one or more `<number><unit>` parts with the units `d`, `h`, `m`, `s`, each at
//! most once and from the largest to the smallest. Zero, a bare number, an unknown unit and a
//! total past `u64` seconds are refused with a message that says what to type instead. The
//! server enforces its own bounds (at least 60 s, at most 30 days) and answers
//! `invalid_request` outside them.

/// Why a lifetime was refused. The message quotes the operator's text and shows valid forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TtlError {
    #[error("the lifetime is empty; give one like 90s, 30m, 1h, 2d or 1h30m")]
    Empty,
    #[error("the lifetime `{0}` has a number without a unit; add s, m, h or d (e.g. {0}s)")]
    MissingUnit(String),
    #[error(
        "the lifetime `{text}` has a unit `{unit}` without a number before it; write e.g. 1{unit}"
    )]
    MissingNumber { text: String, unit: char },
    #[error(
        "the lifetime `{text}` has the unknown unit `{unit}`; use s, m, h or d (e.g. 90s, 30m, 1h, 2d)"
    )]
    UnknownUnit { text: String, unit: char },
    #[error(
        "the lifetime `{0}` repeats a unit or puts a smaller one first; write the units from d to s once each, e.g. 1d2h30m"
    )]
    Order(String),
    #[error("the lifetime `{0}` is too large to count in seconds; use a shorter one")]
    Overflow(String),
    #[error("the lifetime `{0}` is zero; a token must live for some time, e.g. 1h")]
    Zero(String),
}

/// Seconds per unit, in the order the units must appear.
const UNITS: [(char, u64); 4] = [('d', 86_400), ('h', 3_600), ('m', 60), ('s', 1)];

/// Parses a lifetime into seconds. Surrounding whitespace is ignored; nothing else is.
pub fn parse_ttl(input: &str) -> Result<u64, TtlError> {
    let text = input.trim();
    if text.is_empty() {
        return Err(TtlError::Empty);
    }
    let mut total: u64 = 0;
    let mut number: Option<u64> = None;
    // Index into UNITS of the next unit allowed; a unit before it repeats or reverses order.
    let mut next_unit = 0usize;
    for ch in text.chars() {
        if let Some(digit) = ch.to_digit(10) {
            let so_far = number.unwrap_or(0);
            let grown = so_far
                .checked_mul(10)
                .and_then(|n| n.checked_add(u64::from(digit)))
                .ok_or_else(|| TtlError::Overflow(text.to_owned()))?;
            number = Some(grown);
            continue;
        }
        let Some(pos) = UNITS.iter().position(|(unit, _)| *unit == ch) else {
            return Err(TtlError::UnknownUnit {
                text: text.to_owned(),
                unit: ch,
            });
        };
        let Some(n) = number.take() else {
            return Err(TtlError::MissingNumber {
                text: text.to_owned(),
                unit: ch,
            });
        };
        if pos < next_unit {
            return Err(TtlError::Order(text.to_owned()));
        }
        next_unit = pos + 1;
        let part = n
            .checked_mul(UNITS[pos].1)
            .ok_or_else(|| TtlError::Overflow(text.to_owned()))?;
        total = total
            .checked_add(part)
            .ok_or_else(|| TtlError::Overflow(text.to_owned()))?;
    }
    if number.is_some() {
        return Err(TtlError::MissingUnit(text.to_owned()));
    }
    if total == 0 {
        return Err(TtlError::Zero(text.to_owned()));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_units() {
        assert_eq!(parse_ttl("90s"), Ok(90));
        assert_eq!(parse_ttl("30m"), Ok(1_800));
        assert_eq!(parse_ttl("1h"), Ok(3_600));
        assert_eq!(parse_ttl("2d"), Ok(172_800));
        assert_eq!(parse_ttl(" 1h "), Ok(3_600));
        assert_eq!(parse_ttl("0090s"), Ok(90));
    }

    #[test]
    fn combinations() {
        assert_eq!(parse_ttl("1h30m"), Ok(5_400));
        assert_eq!(parse_ttl("1d12h"), Ok(129_600));
        assert_eq!(parse_ttl("1d2h3m4s"), Ok(93_784));
        assert_eq!(parse_ttl("0h5m"), Ok(300));
    }

    #[test]
    fn zero_is_refused() {
        assert_eq!(parse_ttl("0s"), Err(TtlError::Zero("0s".into())));
        assert_eq!(parse_ttl("0h0m"), Err(TtlError::Zero("0h0m".into())));
    }

    #[test]
    fn garbage_is_refused() {
        assert_eq!(parse_ttl(""), Err(TtlError::Empty));
        assert_eq!(parse_ttl("   "), Err(TtlError::Empty));
        assert_eq!(parse_ttl("60"), Err(TtlError::MissingUnit("60".into())));
        assert_eq!(parse_ttl("1h30"), Err(TtlError::MissingUnit("1h30".into())));
        assert_eq!(
            parse_ttl("h"),
            Err(TtlError::MissingNumber {
                text: "h".into(),
                unit: 'h'
            })
        );
        assert_eq!(
            parse_ttl("1w"),
            Err(TtlError::UnknownUnit {
                text: "1w".into(),
                unit: 'w'
            })
        );
        assert_eq!(
            parse_ttl("1 h"),
            Err(TtlError::UnknownUnit {
                text: "1 h".into(),
                unit: ' '
            })
        );
        assert_eq!(
            parse_ttl("-1h"),
            Err(TtlError::UnknownUnit {
                text: "-1h".into(),
                unit: '-'
            })
        );
        assert_eq!(
            parse_ttl("1H"),
            Err(TtlError::UnknownUnit {
                text: "1H".into(),
                unit: 'H'
            })
        );
        assert_eq!(parse_ttl("30m1h"), Err(TtlError::Order("30m1h".into())));
        assert_eq!(parse_ttl("1h1h"), Err(TtlError::Order("1h1h".into())));
    }

    #[test]
    fn overflow_is_refused() {
        // Too many digits for u64 at all.
        assert_eq!(
            parse_ttl("99999999999999999999s"),
            Err(TtlError::Overflow("99999999999999999999s".into()))
        );
        // Fits as a number, overflows once multiplied by the unit.
        assert_eq!(
            parse_ttl("18446744073709551615d"),
            Err(TtlError::Overflow("18446744073709551615d".into()))
        );
        // Each part fits, the sum does not.
        let text = "213503982334601d1s";
        assert_eq!(
            parse_ttl("213503982334601d"),
            Ok(213_503_982_334_601 * 86_400)
        );
        assert_eq!(parse_ttl(text), Ok(213_503_982_334_601 * 86_400 + 1));
        assert_eq!(
            parse_ttl("213503982334601d23h59m59s"),
            Err(TtlError::Overflow("213503982334601d23h59m59s".into()))
        );
    }

    #[test]
    fn messages_say_what_to_type() {
        let msg = parse_ttl("60")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert_eq!(
            msg,
            "the lifetime `60` has a number without a unit; add s, m, h or d (e.g. 60s)"
        );
    }
}
