//! Key names as engines send them: `keys::keysym` for one name, `keys::chord` for
//! `ctrl+shift+t`. Input: a name or chord; a first `\n` splits it into two specs that are
//! also joined with `+` (a chord of two keys resolves to both keys' keysyms, in order).
#![no_main]

use berth_agent::display::keys::{char_keysym, chord, keysym};
use libfuzzer_sys::fuzz_target;

fn check_one(spec: &str) {
    let result = chord(spec);
    // Surrounding whitespace never changes a chord.
    assert_eq!(chord(&format!(" \t{spec} ")), result);
    match &result {
        Ok(keys) => {
            assert!(!keys.is_empty(), "{spec:?} resolved to no keys");
            let trimmed = spec.trim();
            if !trimmed.contains('+') {
                // No `+`: the chord is the one key.
                assert_eq!(keys, &[keysym(trimmed).unwrap()], "{spec:?}");
            }
            assert!(keys.len() <= trimmed.matches('+').count() + 1);
        }
        Err(m) => {
            if spec.trim().is_empty() {
                assert_eq!(m, "empty key name");
            } else {
                // Errors name the key that does not exist, and that key does not resolve.
                let name = m
                    .strip_prefix("unknown key ")
                    .unwrap_or_else(|| panic!("{spec:?}: {m}"));
                assert!(name.starts_with('"') && name.ends_with('"'), "{m}");
            }
        }
    }
    // A single character is a key, itself — but for a control character no key exists for
    // (NUL, BEL, …), which is no key at all.
    let mut chars = spec.chars();
    if let (Some(c), None) = (chars.next(), chars.next()) {
        let sym = char_keysym(c);
        if c.is_control() && sym == 0x0100_0000 + c as u32 {
            assert_eq!(keysym(spec), None, "{spec:?}");
        } else {
            assert_eq!(keysym(spec), Some(sym), "{spec:?}");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    check_one(&text);
    if let Some((a, b)) = text.split_once('\n') {
        check_one(a);
        check_one(b);
        let (ta, tb) = (a.trim(), b.trim());
        if !ta.is_empty() && !tb.is_empty() && !ta.contains('+') && !tb.contains('+') {
            let joined = chord(&format!("{a}+{b}"));
            match (keysym(ta), keysym(tb)) {
                (Some(x), Some(y)) => assert_eq!(joined, Ok(vec![x, y]), "{a:?} + {b:?}"),
                (None, _) => assert_eq!(joined, Err(format!("unknown key {ta:?}"))),
                (Some(_), None) => assert_eq!(joined, Err(format!("unknown key {tb:?}"))),
            }
        }
    }
});
