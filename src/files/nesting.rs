//! A cheap bound on a YAML document's nesting, checked on the bytes before the parser sees
//! them: the parser's time grows with the square of the depth (200 KB of `[` took 17 s to be
//! refused), while no real config file nests more than a handful of levels.
//!
//! The scan is one pass and errs towards counting more, never less, than the parser would:
//! - flow collections: every `[` or `{` outside quotes and comments opens a level, `]`/`}`
//!   closes one;
//! - block collections: each line's indentation, with `- ` sequence markers counted as
//!   indentation (`- - x` is two sequences), opens a level per distinct deeper indentation.
//!
//! A block scalar's text or a plain scalar with brackets may count a few levels too many; at a
//! limit of [`MAX_NESTING`] that never refuses a real file.

/// Deepest nesting accepted: NVIDIA's and mig-parted's files use about six levels.
pub const MAX_NESTING: usize = 64;

/// The first 1-based line at which `text` nests deeper than `limit` levels, with that depth.
pub fn nesting_beyond(text: &str, limit: usize) -> Option<(usize, usize)> {
    let mut flow = 0usize;
    let mut indents: Vec<usize> = Vec::new();
    let mut quote: Option<char> = None;
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let mut block = indents.len();
        if quote.is_none() && flow == 0 {
            let (indent, markers) = indentation(line);
            let rest = line[indent..].trim_start();
            if !rest.is_empty() && !rest.starts_with('#') {
                while indents.last().is_some_and(|&top| top > indent) {
                    indents.pop();
                }
                if indents.last().is_none_or(|&top| top < indent) {
                    indents.push(indent);
                }
                block = indents.len() + markers;
            }
        }
        let mut chars = line.chars().peekable();
        let mut previous = ' ';
        while let Some(c) = chars.next() {
            match quote {
                Some('"') if c == '\\' => {
                    chars.next();
                }
                Some(q) if c == q => {
                    // '' inside a single-quoted scalar is an escaped quote.
                    if q == '\'' && chars.peek() == Some(&'\'') {
                        chars.next();
                    } else {
                        quote = None;
                    }
                }
                Some(_) => {}
                None => match c {
                    '#' if previous.is_whitespace() => break,
                    '"' | '\'' => quote = Some(c),
                    '[' | '{' => {
                        flow += 1;
                        if block + flow > limit {
                            return Some((number, block + flow));
                        }
                    }
                    ']' | '}' => flow = flow.saturating_sub(1),
                    _ => {}
                },
            }
            previous = c;
        }
        if block + flow > limit {
            return Some((number, block + flow));
        }
    }
    None
}

/// The width of a line's indentation including `- ` sequence markers, and how many markers.
fn indentation(line: &str) -> (usize, usize) {
    let bytes = line.as_bytes();
    let mut at = 0;
    let mut markers = 0;
    while at < bytes.len() {
        match bytes[at] {
            b' ' | b'\t' => at += 1,
            b'-' if bytes.get(at + 1).is_none_or(|b| *b == b' ' || *b == b'\t') => {
                markers += 1;
                at += 1;
            }
            _ => break,
        }
    }
    (at, markers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_files_are_shallow() {
        let config = "version: v1\nflags:\n  migStrategy: none\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n";
        assert_eq!(nesting_beyond(config, 6), None);
        let mig = "version: v1\nmig-configs:\n  all-balanced:\n    - device-filter: [\"0x233110DE\"]\n      devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.10gb\": 2, \"2g.20gb\": 1}\n";
        assert_eq!(nesting_beyond(mig, 6), None);
    }

    #[test]
    fn deep_flow_nesting_is_found_at_its_line() {
        let text = format!("a: 1\nb: {}", "[".repeat(200_000));
        assert_eq!(
            nesting_beyond(&text, MAX_NESTING),
            Some((2, MAX_NESTING + 1))
        );
        let braces = "{a: ".repeat(100);
        assert!(nesting_beyond(&braces, MAX_NESTING).is_some());
    }

    #[test]
    fn brackets_in_quotes_and_comments_do_not_count() {
        let brackets = "[".repeat(100);
        let text = format!(
            "a: \"{brackets}\"\nb: '{brackets}'' {brackets}'\nc: 1 # {brackets}\nd: \"\\\"{brackets}\"\n"
        );
        assert_eq!(nesting_beyond(&text, 4), None);
    }

    #[test]
    fn deep_block_nesting_counts_indentation_and_markers() {
        let mut text = String::new();
        for depth in 0..70 {
            text.push_str(&" ".repeat(depth));
            text.push_str(&format!("k{depth}:\n"));
        }
        assert_eq!(nesting_beyond(&text, MAX_NESTING), Some((65, 65)));
        let markers = format!("{}x\n", "- ".repeat(70));
        assert_eq!(nesting_beyond(&markers, MAX_NESTING), Some((1, 71)));
        // Closing levels frees them again.
        let flat = "a:\n  b:\n    c: 1\nd:\n  e: 2\n".repeat(1000);
        assert_eq!(nesting_beyond(&flat, 3), None);
    }
}
