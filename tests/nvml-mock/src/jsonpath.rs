//! Turns the line/column of a `serde_json` error into the JSON path of the offending field
//! (`gpus[2].nvlinks[0].remote`), so that a bad fixture is reported by field, not by position.
//!
//! It is a small tokenizer that walks the text up to the error position keeping a stack of
//! open objects (with their current key) and arrays (with their current index). It assumes the
//! text up to that point is well-formed, which holds for type and field errors; for syntax
//! errors the path is a best effort and the message carries the position anyway.

/// One open container.
enum Frame {
    Object {
        key: Option<String>,
        expect_key: bool,
    },
    Array {
        index: usize,
    },
}

/// The byte offset of a 1-based `(line, column)` position, clamped to the text.
fn offset_of(text: &str, line: usize, column: usize) -> usize {
    let mut start = 0;
    for _ in 1..line {
        match text[start..].find('\n') {
            Some(nl) => start += nl + 1,
            None => return text.len(),
        }
    }
    (start + column.saturating_sub(1)).min(text.len())
}

/// Reads a JSON string starting at the opening quote `bytes[i]`; returns its (unescaped
/// enough for keys) content and the index after the closing quote.
fn read_string(bytes: &[u8], mut i: usize) -> (String, usize) {
    let mut out = Vec::new();
    i += 1;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => return (String::from_utf8_lossy(&out).into_owned(), i + 1),
            b'\\' if i + 1 < bytes.len() => {
                out.push(bytes[i + 1]);
                i += 2;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    (String::from_utf8_lossy(&out).into_owned(), i)
}

fn render(stack: &[Frame]) -> String {
    let mut path = String::new();
    for frame in stack {
        match frame {
            Frame::Object { key: Some(k), .. } => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
            }
            Frame::Object { key: None, .. } => {}
            Frame::Array { index } => path.push_str(&format!("[{index}]")),
        }
    }
    if path.is_empty() {
        "(top level)".to_owned()
    } else {
        path
    }
}

/// The path of the value being parsed at `(line, column)`. With `missing` set (a "missing
/// field" error, reported at the closing brace) the path is that of the enclosing object.
pub fn path_at(text: &str, line: usize, column: usize, missing: bool) -> String {
    // serde_json reports the column of the last character it consumed; stop before it so a
    // closing brace does not pop the object the error is about.
    let target = offset_of(text, line, column).saturating_sub(1);
    let bytes = text.as_bytes();
    let mut stack: Vec<Frame> = Vec::new();
    let mut i = 0;
    while i < target && i < bytes.len() {
        match bytes[i] {
            b'{' => stack.push(Frame::Object {
                key: None,
                expect_key: true,
            }),
            b'[' => stack.push(Frame::Array { index: 0 }),
            b'}' | b']' => {
                stack.pop();
            }
            b',' => match stack.last_mut() {
                Some(Frame::Array { index }) => *index += 1,
                Some(Frame::Object { expect_key, .. }) => *expect_key = true,
                None => {}
            },
            b':' => {
                if let Some(Frame::Object { expect_key, .. }) = stack.last_mut() {
                    *expect_key = false;
                }
            }
            b'"' => {
                let (content, next) = read_string(bytes, i);
                if let Some(Frame::Object {
                    key,
                    expect_key: true,
                }) = stack.last_mut()
                {
                    *key = Some(content);
                }
                i = next;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    if missing && let Some(Frame::Object { key, .. }) = stack.last_mut() {
        *key = None;
    }
    render(&stack)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn locate(text: &str) -> String {
        #[derive(serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Link {
            count: u32,
        }
        #[derive(serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Gpu {
            uuid: String,
            #[serde(default)]
            links: Vec<Link>,
        }
        #[derive(serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Top {
            seed: u64,
            gpus: Vec<Gpu>,
        }
        let err = serde_json::from_str::<Top>(text).unwrap_err();
        let missing = err.to_string().starts_with("missing field");
        path_at(text, err.line(), err.column(), missing)
    }

    #[test]
    fn finds_type_errors() {
        let text = "{\"seed\": 1, \"gpus\": [{\"uuid\": \"a\"}, {\"uuid\": \"b\",\n \"links\": [{\"count\": \"x\"}]}]}";
        assert_eq!(locate(text), "gpus[1].links[0].count");
    }

    #[test]
    fn finds_unknown_and_missing_fields() {
        assert_eq!(
            locate("{\"seed\": 1, \"gpus\": [{\"uuid\": \"a\", \"bogus\": 2}]}"),
            "gpus[0].bogus"
        );
        assert_eq!(
            locate("{\"seed\": 1, \"gpus\": [{\"uuid\": \"a\"}, {}]}"),
            "gpus[1]"
        );
        assert_eq!(locate("{\"seed\": -1, \"gpus\": []}"), "seed");
    }
}
