use proptest::prelude::*;

use super::*;

#[test]
fn single_units() {
    assert_eq!(parse("90s"), Ok(90));
    assert_eq!(parse("30m"), Ok(1_800));
    assert_eq!(parse("1h"), Ok(3_600));
    assert_eq!(parse("2d"), Ok(172_800));
    assert_eq!(parse(" 1h "), Ok(3_600));
    assert_eq!(parse("0090s"), Ok(90));
}

#[test]
fn combinations() {
    assert_eq!(parse("1h30m"), Ok(5_400));
    assert_eq!(parse("1d12h"), Ok(129_600));
    assert_eq!(parse("1d2h3m4s"), Ok(93_784));
    assert_eq!(parse("0h5m"), Ok(300));
    assert_eq!(parse("90m"), Ok(5_400));
}

#[test]
fn zero_is_refused_unless_allowed() {
    assert_eq!(parse("0s"), Err(DurationError::Zero("0s".into())));
    assert_eq!(parse("0h0m"), Err(DurationError::Zero("0h0m".into())));
    let zero_ok = Rules {
        bare_seconds: true,
        zero: true,
    };
    assert_eq!(parse_with("0s", zero_ok), Ok(0));
    assert_eq!(parse_with("0", zero_ok), Ok(0));
    assert_eq!(
        parse_with("0", Rules::SECONDS_OK),
        Err(DurationError::Zero("0".into()))
    );
}

#[test]
fn bare_seconds_only_when_allowed_and_never_after_a_unit() {
    assert_eq!(parse("60"), Err(DurationError::MissingUnit("60".into())));
    assert_eq!(parse_with("300", Rules::SECONDS_OK), Ok(300));
    assert_eq!(
        parse_with("1h30", Rules::SECONDS_OK),
        Err(DurationError::MissingUnit("1h30".into()))
    );
    assert_eq!(
        parse_std("5m", Rules::SECONDS_OK),
        Ok(std::time::Duration::from_secs(300))
    );
}

#[test]
fn garbage_is_refused() {
    assert_eq!(parse(""), Err(DurationError::Empty));
    assert_eq!(parse("   "), Err(DurationError::Empty));
    assert_eq!(
        parse("1h30"),
        Err(DurationError::MissingUnit("1h30".into()))
    );
    assert_eq!(
        parse("h"),
        Err(DurationError::MissingNumber {
            text: "h".into(),
            unit: 'h'
        })
    );
    for (text, unit) in [
        ("1w", 'w'),
        ("1 h", ' '),
        ("-1h", '-'),
        ("1H", 'H'),
        ("1.5h", '.'),
    ] {
        assert_eq!(
            parse(text),
            Err(DurationError::UnknownUnit {
                text: text.into(),
                unit
            }),
            "{text}"
        );
    }
    assert_eq!(parse("30m1h"), Err(DurationError::Order("30m1h".into())));
    assert_eq!(parse("1h1h"), Err(DurationError::Order("1h1h".into())));
}

#[test]
fn overflow_is_refused() {
    assert_eq!(
        parse("99999999999999999999s"),
        Err(DurationError::Overflow("99999999999999999999s".into()))
    );
    assert_eq!(
        parse("18446744073709551615d"),
        Err(DurationError::Overflow("18446744073709551615d".into()))
    );
    assert_eq!(
        parse("213503982334601d1s"),
        Ok(213_503_982_334_601 * 86_400 + 1)
    );
    assert_eq!(
        parse("213503982334601d23h59m59s"),
        Err(DurationError::Overflow("213503982334601d23h59m59s".into()))
    );
    assert_eq!(parse(&format!("{}s", u64::MAX)), Ok(u64::MAX));
}

#[test]
fn messages_say_what_to_type() {
    let msg = parse("60").err().map(|e| e.to_string()).unwrap_or_default();
    assert_eq!(
        msg,
        "the duration `60` has a number without a unit; add s, m, h or d (e.g. 60s)"
    );
}

#[test]
fn format_writes_the_canonical_text() {
    assert_eq!(format(0), "0s");
    assert_eq!(format(90), "1m30s");
    assert_eq!(format(5_400), "1h30m");
    assert_eq!(format(172_800), "2d");
    assert_eq!(format(93_784), "1d2h3m4s");
}

proptest! {
    #[test]
    fn format_then_parse_round_trips(secs in 1u64..) {
        prop_assert_eq!(parse(&format(secs)), Ok(secs));
    }

    #[test]
    fn parse_then_format_is_canonical(d in 0u64..1000, h in 0u64..24, m in 0u64..60, s in 0u64..60) {
        let total = d * 86_400 + h * 3_600 + m * 60 + s;
        prop_assume!(total > 0);
        let text = format!("{d}d{h}h{m}m{s}s");
        prop_assert_eq!(parse(&text), Ok(total));
        prop_assert_eq!(parse(&format(total)), Ok(total));
    }

    #[test]
    fn parse_never_panics(text in "\\PC{0,24}") {
        let _ = parse_with(&text, Rules { bare_seconds: true, zero: true });
    }
}
