//! Byte and text helpers shared by the native and compat surfaces: UTF-8 aware chunking, and
//! Python-compatible formatting for the OSWorld surface (its clients compare strings that
//! Python produced).

use std::fmt::Write as _;

use base64::Engine;
use berth_protocol::{OutputChunk, Stream};

/// Valid UTF-8 runs shorter than this, sandwiched next to invalid bytes, travel inside the
/// base64 chunk instead of as their own chunk, so binary output does not shatter into tiny
/// chunks.
const MIN_TEXT_RUN: usize = 32;

/// Splits `bytes` (which start at `seq` in the output stream) into chunks: valid UTF-8 runs as
/// `data`, anything else as `data_b64`. Concatenating the chunks' bytes gives `bytes` back.
pub fn encode_chunks(seq: u64, stream: Stream, bytes: &[u8]) -> Vec<OutputChunk> {
    let mut runs: Vec<(usize, usize, bool)> = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        match std::str::from_utf8(&bytes[pos..]) {
            Ok(_) => {
                runs.push((pos, bytes.len(), true));
                pos = bytes.len();
            }
            Err(e) => {
                let valid = e.valid_up_to();
                if valid > 0 {
                    runs.push((pos, pos + valid, true));
                }
                let bad = e.error_len().unwrap_or(bytes.len() - pos - valid);
                runs.push((pos + valid, pos + valid + bad, false));
                pos += valid + bad;
            }
        }
    }
    // Fold short text runs that touch binary into the binary, then merge neighbours.
    let n = runs.len();
    for i in 0..n {
        let (s, e, text) = runs[i];
        let touches_binary = (i > 0 && !runs[i - 1].2) || (i + 1 < n && !runs[i + 1].2);
        if text && e - s < MIN_TEXT_RUN && touches_binary {
            runs[i].2 = false;
        }
    }
    let mut merged: Vec<(usize, usize, bool)> = Vec::new();
    for r in runs {
        match merged.last_mut() {
            Some(last) if last.2 == r.2 && last.1 == r.0 => last.1 = r.1,
            _ => merged.push(r),
        }
    }
    merged
        .into_iter()
        .map(|(s, e, text)| {
            let slice = &bytes[s..e];
            let (data, data_b64) = if text {
                // Valid by construction.
                (Some(String::from_utf8_lossy(slice).into_owned()), None)
            } else {
                (
                    None,
                    Some(base64::engine::general_purpose::STANDARD.encode(slice)),
                )
            };
            OutputChunk {
                seq: seq + s as u64,
                stream,
                data,
                data_b64,
            }
        })
        .collect()
}

/// How many trailing bytes of `bytes` form an incomplete (but so far valid) UTF-8 sequence
/// that more bytes could still complete. Those are held back from live readers so a character
/// is never split across chunks.
pub fn incomplete_utf8_tail(bytes: &[u8]) -> usize {
    let n = bytes.len();
    for back in 1..=3.min(n) {
        let b = bytes[n - back];
        if b & 0b1100_0000 == 0b1000_0000 {
            continue; // continuation byte: keep looking for the lead byte
        }
        let need = if b & 0b1110_0000 == 0b1100_0000 {
            2
        } else if b & 0b1111_0000 == 0b1110_0000 {
            3
        } else if b & 0b1111_1000 == 0b1111_0000 {
            4
        } else {
            return 0;
        };
        return if need > back { back } else { 0 };
    }
    0
}

/// Text as Python's `subprocess.run(text=True)` returns it: UTF-8 decoded (invalid bytes
/// replaced) with universal newlines (`\r\n` and lone `\r` become `\n`).
pub fn python_text(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    if !s.contains('\r') {
        return s.into_owned();
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\r' {
            if chars.peek() == Some(&'\n') {
                chars.next();
            }
            out.push('\n');
        } else {
            out.push(c);
        }
    }
    out
}

/// Python's `repr()` of a `str`.
pub fn py_repr_str(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if (0x80..0xa0).contains(&(c as u32)) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Python's `repr()` of a list of strings: `['a', 'b']`.
pub fn py_repr_list(items: &[String]) -> String {
    let inner: Vec<String> = items.iter().map(|s| py_repr_str(s)).collect();
    format!("[{}]", inner.join(", "))
}

/// Python's `str()` of a float: shortest round-trip digits, always with a fraction or exponent.
pub fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let abs = f.abs();
    if abs != 0.0 && !(1e-4..1e16).contains(&abs) {
        // Python switches to exponent notation here: 1e-05, 1e+16.
        let s = format!("{f:e}");
        let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mant}e{sign}{:02}", exp.abs());
    }
    let s = format!("{f}");
    if s.contains('.') { s } else { format!("{s}.0") }
}

/// A JSON number the way Python prints the value it parsed: ints stay ints, floats use
/// `py_float`.
pub fn py_number(n: &serde_json::Number) -> String {
    if n.is_f64() {
        py_float(n.as_f64().unwrap_or(0.0))
    } else {
        n.to_string()
    }
}

/// Serialises like Flask's `jsonify`: keys sorted, non-ASCII escaped as `\uXXXX`, compact
/// separators, trailing newline.
pub fn flask_json(value: &serde_json::Value) -> String {
    let mut out = String::new();
    write_flask_json(&mut out, value);
    out.push('\n');
    out
}

fn write_flask_json(out: &mut String, value: &serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&py_number(n)),
        Value::String(s) => write_ascii_json_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_flask_json(out, v);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_ascii_json_string(out, k);
                out.push(':');
                write_flask_json(out, &map[k]);
            }
            out.push('}');
        }
    }
}

fn write_ascii_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `os.strerror`-style message for an errno, as used in `[Errno N] msg: 'path'`.
pub fn errno_message(errno: i32) -> String {
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    // std formats "No such file or directory (os error 2)"; Python prints the bare text.
    match text.rfind(" (os error") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

/// Python's `str(OSError)` for an error about `path`: `[Errno 2] No such file or directory: 'x'`.
pub fn py_os_error(errno: i32, path: &str) -> String {
    format!(
        "[Errno {errno}] {}: {}",
        errno_message(errno),
        py_repr_str(path)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(bytes: &[u8]) -> Vec<u8> {
        encode_chunks(0, Stream::Stdout, bytes)
            .iter()
            .flat_map(|c| c.bytes())
            .collect()
    }

    #[test]
    fn chunks_reassemble_to_the_exact_bytes() {
        let cases: Vec<Vec<u8>> = vec![
            b"plain text\n".to_vec(),
            vec![0xff, 0xfe, b'a', 0x80],
            "héllo ✓".as_bytes().to_vec(),
            [
                b"long valid text run that is long enough".as_slice(),
                &[0xc3],
                b"x",
            ]
            .concat(),
            (0u8..=255).collect(),
        ];
        for c in cases {
            assert_eq!(roundtrip(&c), c);
        }
    }

    #[test]
    fn valid_text_travels_as_data_and_binary_as_b64() {
        let chunks = encode_chunks(10, Stream::Stderr, "ok ✓".as_bytes());
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].data.as_deref(), Some("ok ✓"));
        assert_eq!(chunks[0].seq, 10);
        let chunks = encode_chunks(0, Stream::Stdout, &[0xff, 0xfe]);
        assert_eq!(chunks.len(), 1);
        assert!(chunks[0].data.is_none());
        assert_eq!(chunks[0].bytes(), vec![0xff, 0xfe]);
    }

    #[test]
    fn chunk_seqs_are_byte_offsets() {
        let mut bytes = b"a long enough line of plain ascii text\n".to_vec();
        bytes.push(0xff);
        bytes.extend_from_slice(b"another long enough line of plain ascii text\n");
        let chunks = encode_chunks(100, Stream::Stdout, &bytes);
        assert_eq!(chunks.len(), 3);
        assert_eq!(chunks[1].seq, 100 + 39);
        assert_eq!(chunks[2].seq, 100 + 40);
    }

    #[test]
    fn incomplete_tail_is_detected_only_when_completable() {
        assert_eq!(incomplete_utf8_tail(b"abc"), 0);
        assert_eq!(incomplete_utf8_tail(&[b'a', 0xe2, 0x9c]), 2);
        assert_eq!(incomplete_utf8_tail(&[b'a', 0xe2]), 1);
        assert_eq!(incomplete_utf8_tail("✓".as_bytes()), 0);
        assert_eq!(incomplete_utf8_tail(&[0xf0, 0x9f, 0x98]), 3);
        assert_eq!(incomplete_utf8_tail(&[0xff]), 0);
    }

    #[test]
    fn python_text_uses_universal_newlines() {
        assert_eq!(python_text(b"a\r\nb\rc\n"), "a\nb\nc\n");
        assert_eq!(python_text(&[b'a', 0xff]), "a\u{fffd}");
    }

    #[test]
    fn python_reprs_match_the_interpreter() {
        assert_eq!(py_repr_str("x"), "'x'");
        assert_eq!(py_repr_str("it's"), "\"it's\"");
        assert_eq!(py_repr_str("a'b\"c"), "'a\\'b\"c'");
        assert_eq!(py_repr_str("tab\tnl\n"), "'tab\\tnl\\n'");
        assert_eq!(py_repr_str("é"), "'é'");
        assert_eq!(
            py_repr_list(&["sleep".into(), "200".into()]),
            "['sleep', '200']"
        );
        assert_eq!(py_float(1.0), "1.0");
        assert_eq!(py_float(0.5), "0.5");
        assert_eq!(py_float(0.009760141372680664), "0.009760141372680664");
        assert_eq!(py_float(1e-5), "1e-05");
        assert_eq!(py_float(1e16), "1e+16");
    }

    #[test]
    fn flask_json_sorts_keys_and_escapes_non_ascii() {
        let v =
            serde_json::json!({"status": "success", "output": "é\n", "error": "", "returncode": 0});
        assert_eq!(
            flask_json(&v),
            "{\"error\":\"\",\"output\":\"\\u00e9\\n\",\"returncode\":0,\"status\":\"success\"}\n"
        );
        let v = serde_json::json!({"x": "😀"});
        assert_eq!(flask_json(&v), "{\"x\":\"\\ud83d\\ude00\"}\n");
    }

    #[test]
    fn os_errors_read_like_python() {
        assert_eq!(
            py_os_error(2, "x"),
            "[Errno 2] No such file or directory: 'x'"
        );
    }
}
