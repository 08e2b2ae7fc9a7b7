//! The HTTP bounds as command-line flags and environment variables, for every applet that
//! serves HTTP.

use std::time::Duration;

use super::Limits;
use crate::values::positive_duration;

/// `--http-header-timeout`, `--http-idle-timeout`, `--http-max-connections`.
#[derive(Debug, Clone, clap::Args)]
pub struct HttpArgs {
    /// Time a client has to send a whole request head, from connecting or from the first byte
    /// of its next request; then the connection is closed.
    #[arg(long, value_name = "DURATION", env = "GPUD_HTTP_HEADER_TIMEOUT", default_value = "10s",
          value_parser = positive_duration)]
    pub http_header_timeout: Duration,

    /// Time a keep-alive connection may wait for its next request before it is closed.
    #[arg(long, value_name = "DURATION", env = "GPUD_HTTP_IDLE_TIMEOUT", default_value = "60s",
          value_parser = positive_duration)]
    pub http_idle_timeout: Duration,

    /// Most HTTP connections open at once (lower when the open-file limit leaves less room);
    /// beyond it the longest idle connection is closed for the new one.
    #[arg(long, value_name = "N", env = "GPUD_HTTP_MAX_CONNECTIONS", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub http_max_connections: u32,
}

impl HttpArgs {
    /// The bounds these flags set.
    pub fn limits(&self) -> Limits {
        Limits {
            header_read_timeout: self.http_header_timeout,
            idle_timeout: self.http_idle_timeout,
            max_connections: usize::try_from(self.http_max_connections).unwrap_or(usize::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        http: HttpArgs,
    }

    fn parse(args: &[&str]) -> Result<Limits, String> {
        Cli::try_parse_from(std::iter::once("gpud").chain(args.iter().copied()))
            .map(|cli| cli.http.limits())
            .map_err(|err| err.to_string())
    }

    #[test]
    fn defaults_are_the_documented_limits() {
        assert_eq!(parse(&[]).unwrap(), Limits::default());
    }

    #[test]
    fn flags_set_each_bound() {
        assert_eq!(
            parse(&[
                "--http-header-timeout",
                "2s",
                "--http-idle-timeout",
                "500ms",
                "--http-max-connections",
                "64"
            ])
            .unwrap(),
            Limits {
                header_read_timeout: Duration::from_secs(2),
                idle_timeout: Duration::from_millis(500),
                max_connections: 64,
            }
        );
    }

    #[test]
    fn zero_is_refused_with_the_flag_named() {
        for (flag, value) in [
            ("--http-header-timeout", "0s"),
            ("--http-idle-timeout", "0"),
            ("--http-max-connections", "0"),
        ] {
            let err = parse(&[flag, value]).unwrap_err();
            assert!(
                err.contains(&format!("invalid value '{value}' for '{flag} <")),
                "{err}"
            );
        }
    }
}
