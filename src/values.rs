//! Parsers for values on the command line that several modules' flags share. A leaf module: the
//! argument groups of the HTTP server, the exporter and the applets all use it.

/// A clap value parser for durations that must be longer than zero ("5s", "500ms", "10m").
pub fn positive_duration(text: &str) -> Result<std::time::Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err("must be longer than zero".into()),
        Err(err) => Err(err.to_string()),
    }
}
