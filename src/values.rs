//! Parsers for values on the command line that several modules' flags share. A leaf module: the
//! argument groups of the HTTP server, the exporter and the applets all use it.

/// A clap value parser for durations that must be longer than zero ("5s", "500ms", "10m").
pub fn positive_duration(text: &str) -> Result<std::time::Duration, String> {
    match duration(text) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err("must be longer than zero, e.g. 5s".into()),
        Err(err) => Err(err),
    }
}

/// A clap value parser for durations: a number with a unit, as in `30s`, `500ms`, `10m` or
/// `1h30m`; a mistake is explained with an example rather than a parser position.
pub fn duration(text: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(text).map_err(|_| {
        "not a duration; write a number with a unit, e.g. 30s, 500ms, 10m or 1h30m".to_owned()
    })
}

/// A clap value parser for a rate above zero, such as requests per second ("5", "0.5").
pub fn positive_rate(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        _ => Err("must be a number above zero, e.g. 5 or 0.5".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_must_be_a_number_above_zero() {
        assert_eq!(positive_rate("0.5"), Ok(0.5));
        let expected = "must be a number above zero, e.g. 5 or 0.5";
        for bad in ["0", "-1", "fast", "inf", "NaN", ""] {
            assert_eq!(positive_rate(bad).unwrap_err(), expected, "{bad}");
        }
    }

    #[test]
    fn bad_durations_get_an_example() {
        let expected = "not a duration; write a number with a unit, e.g. 30s, 500ms, 10m or 1h30m";
        assert_eq!(duration("abc").unwrap_err(), expected);
        assert_eq!(duration("10").unwrap_err(), expected);
        assert_eq!(
            positive_duration("0s").unwrap_err(),
            "must be longer than zero, e.g. 5s"
        );
        assert_eq!(
            duration("1h30m").unwrap(),
            std::time::Duration::from_secs(5400)
        );
    }
}
