//! Durations as NVIDIA's config writes them: Go's `time.ParseDuration` syntax (`60s`, `1m30s`,
//! `500ms`, `1.5h`), a bare number of nanoseconds, or GFD's `infinite`.
//!
//! humantime is close but not the same language (it accepts `1 hour`, rejects `.5s`), so the
//! Go grammar is implemented here exactly: an optional sign, then one or more
//! `<number>[.<fraction>]<unit>` parts with units `ns`, `us`/`µs`/`μs`, `ms`, `s`, `m`, `h`;
//! a lone `0` is allowed without a unit.

use std::fmt;
use std::time::Duration;

/// GFD's `sleepInterval`: a period, or never (sleep forever after the first write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SleepInterval {
    /// Relabel this often.
    Every(Duration),
    /// Label once, then wait for a signal (GFD's `infinite`, meant for pods).
    Infinite,
}

/// The spelling GFD accepts for [`SleepInterval::Infinite`].
pub const INFINITE: &str = "infinite";

impl SleepInterval {
    /// Parses a flag or environment value: a Go duration or `infinite`. Zero and negative
    /// periods are refused: they would make the labeller spin.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text == INFINITE {
            return Ok(SleepInterval::Infinite);
        }
        let nanos = parse_go_duration(text)?;
        positive(nanos)
    }

    /// The period, or `None` for infinite.
    pub fn period(self) -> Option<Duration> {
        match self {
            SleepInterval::Every(period) => Some(period),
            SleepInterval::Infinite => None,
        }
    }
}

/// Converts signed nanoseconds to a positive interval.
pub(crate) fn positive(nanos: i128) -> Result<SleepInterval, String> {
    if nanos <= 0 {
        return Err("must be longer than zero (or \"infinite\")".into());
    }
    let nanos = u64::try_from(nanos).map_err(|_| "is too long".to_owned())?;
    Ok(SleepInterval::Every(Duration::from_nanos(nanos)))
}

impl fmt::Display for SleepInterval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SleepInterval::Every(period) => write!(f, "{}", humantime::format_duration(*period)),
            SleepInterval::Infinite => f.write_str(INFINITE),
        }
    }
}

/// Parses Go's duration syntax into signed nanoseconds.
pub fn parse_go_duration(text: &str) -> Result<i128, String> {
    let bad = || format!("not a duration (examples: 60s, 1m30s, 500ms, {INFINITE})");
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total: i128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (int_part, after) = rest.split_at(int_len);
        let (frac_part, after) = match after.strip_prefix('.') {
            Some(tail) => {
                let frac_len = tail.bytes().take_while(u8::is_ascii_digit).count();
                tail.split_at(frac_len)
            }
            None => ("", after),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(bad());
        }
        let unit_len = after
            .char_indices()
            .find(|(_, c)| c.is_ascii_digit() || *c == '.')
            .map_or(after.len(), |(i, _)| i);
        let (unit, tail) = after.split_at(unit_len);
        let scale: i128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(bad()),
        };
        let whole: i128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| bad())?
        };
        let mut part = whole.checked_mul(scale).ok_or_else(bad)?;
        // The fraction contributes scale * 0.fff, truncated to whole nanoseconds as Go does.
        let mut divisor: i128 = 1;
        let mut fraction: i128 = 0;
        for digit in frac_part.bytes().take(30) {
            fraction = fraction * 10 + i128::from(digit - b'0');
            divisor *= 10;
        }
        part += fraction * scale / divisor;
        total = total.checked_add(part).ok_or_else(bad)?;
        if total > i128::from(i64::MAX) {
            return Err("is too long".into());
        }
        rest = tail;
    }
    Ok(if negative { -total } else { total })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_syntax() {
        let cases = [
            ("60s", 60_000_000_000),
            ("1m30s", 90_000_000_000),
            ("500ms", 500_000_000),
            ("1.5h", 5_400_000_000_000),
            (".5s", 500_000_000),
            ("2h45m10.5s", 9_910_500_000_000),
            ("10us", 10_000),
            ("10µs", 10_000),
            ("7ns", 7),
            ("0", 0),
            ("-1s", -1_000_000_000),
        ];
        for (text, nanos) in cases {
            assert_eq!(parse_go_duration(text), Ok(nanos), "{text}");
        }
    }

    #[test]
    fn rejects_what_go_rejects() {
        for text in ["", "60", "1 h", "1hour", "s", ".s", "1d", "--1s", "1.2.3s"] {
            assert!(parse_go_duration(text).is_err(), "{text:?} should fail");
        }
    }

    #[test]
    fn sleep_interval() {
        assert_eq!(
            SleepInterval::parse("infinite"),
            Ok(SleepInterval::Infinite)
        );
        assert_eq!(
            SleepInterval::parse("60s"),
            Ok(SleepInterval::Every(Duration::from_secs(60)))
        );
        assert_eq!(
            SleepInterval::parse("0s").unwrap_err(),
            "must be longer than zero (or \"infinite\")"
        );
        assert!(SleepInterval::parse("-5s").is_err());
        assert_eq!(SleepInterval::Infinite.to_string(), "infinite");
        assert_eq!(
            SleepInterval::Every(Duration::from_secs(90)).to_string(),
            "1m 30s"
        );
    }
}
