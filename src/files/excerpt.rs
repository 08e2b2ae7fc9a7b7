//! Short quotes of offending values. A config error goes to stderr at start and to the journal
//! on reload: quoting a 5 MB value whole would make one 5 MB log line, so a message quotes at
//! most [`EXCERPT_CHARS`] characters of any value, marked with `…` where it was cut.

/// The most characters of a value an error message quotes.
pub const EXCERPT_CHARS: usize = 80;

/// `value` quoted as `Debug` does (`"…"` with escapes), cut to [`EXCERPT_CHARS`] characters of
/// the value with a `…` after the closing quote when cut.
pub fn excerpt(value: &str) -> String {
    match value.char_indices().nth(EXCERPT_CHARS) {
        None => format!("{value:?}"),
        Some((end, _)) => format!("{:?}… ({} bytes in all)", &value[..end], value.len()),
    }
}

/// `message` with every double-quoted run longer than [`EXCERPT_CHARS`] characters cut to
/// that length and marked `…`, for messages written by others (the YAML parser quotes a
/// mistyped value whole: `invalid type: string "<all of it>", expected u32`). Backslash
/// escapes inside quotes are honoured; an unclosed quote is cut the same way. The rest of the
/// message (field path, line and column) is kept.
pub fn clip_quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(1024));
    let mut chars = message.chars();
    while let Some(c) = chars.next() {
        out.push(c);
        if c != '"' {
            continue;
        }
        // Inside a quoted run: copy up to EXCERPT_CHARS characters, skip the rest.
        let mut kept = 0usize;
        let mut cut = false;
        let mut escaped = false;
        for c in chars.by_ref() {
            let closing = c == '"' && !escaped;
            escaped = c == '\\' && !escaped;
            if closing {
                break;
            }
            if kept < EXCERPT_CHARS {
                out.push(c);
                kept += 1;
            } else {
                cut = true;
            }
        }
        // A cut inside an escape would leave a lone backslash before the closing quote.
        if cut && out.ends_with('\\') && !out.ends_with("\\\\") {
            out.pop();
        }
        out.push('"');
        if cut {
            out.push('…');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_are_quoted_whole() {
        assert_eq!(excerpt("abc"), "\"abc\"");
        assert_eq!(excerpt("a\"b"), "\"a\\\"b\"");
        let exact = "x".repeat(EXCERPT_CHARS);
        assert_eq!(excerpt(&exact), format!("\"{exact}\""));
    }

    #[test]
    fn long_values_are_cut_to_eighty_characters() {
        let long = "é".repeat(5_000);
        assert_eq!(
            excerpt(&long),
            format!("\"{}\"… (10000 bytes in all)", "é".repeat(EXCERPT_CHARS))
        );
    }

    #[test]
    fn long_quoted_runs_are_cut_and_the_rest_kept() {
        let value = "y".repeat(1_000_000);
        let message =
            format!("health: invalid type: string \"{value}\", expected u32 at line 2 column 3");
        let clipped = clip_quoted(&message);
        assert_eq!(
            clipped,
            format!(
                "health: invalid type: string \"{}\"…, expected u32 at line 2 column 3",
                "y".repeat(EXCERPT_CHARS)
            )
        );
    }

    #[test]
    fn escapes_and_short_quotes_are_kept() {
        let message = r#"unknown field "a\"b", expected one of "version", "health""#;
        assert_eq!(clip_quoted(message), message);
        let unclosed = format!("bad \"{}", "z".repeat(200));
        assert_eq!(
            clip_quoted(&unclosed),
            format!("bad \"{}\"…", "z".repeat(EXCERPT_CHARS))
        );
        let escapes = format!("\"{}\"", "\\n".repeat(100));
        let clipped = clip_quoted(&escapes);
        assert!(clipped.ends_with("\"…"), "{clipped}");
        assert!(!clipped.ends_with("\\\"…"), "{clipped}");
    }
}
