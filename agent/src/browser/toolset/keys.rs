//! Key names as the toolsets take them (`Return`, `ctrl+a`, `Page_Down`, `a`) as the key events
//! CDP's `Input.dispatchKeyEvent` takes: the DOM `key` and `code`, the Windows virtual key code
//! and the text a key types. Pure.

/// One key: what a page's key events see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyDef {
    pub key: String,
    pub code: String,
    pub key_code: i64,
    /// The text the key types (none for a control key, or when a modifier other than Shift
    /// is held).
    pub text: Option<String>,
}

/// `ctrl+shift+t`: the modifiers held (as CDP's bits and as keys) and the key pressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chord {
    pub modifiers: u32,
    pub held: Vec<KeyDef>,
    pub key: KeyDef,
}

fn def(key: &str, code: &str, key_code: i64, text: Option<&str>) -> KeyDef {
    KeyDef {
        key: key.into(),
        code: code.into(),
        key_code,
        text: text.map(String::from),
    }
}

/// A modifier's CDP bit and key.
fn modifier(name: &str) -> Option<(u32, KeyDef)> {
    Some(match name {
        "alt" | "option" => (1, def("Alt", "AltLeft", 18, None)),
        "ctrl" | "control" => (2, def("Control", "ControlLeft", 17, None)),
        "cmd" | "command" | "meta" | "super" | "win" => (4, def("Meta", "MetaLeft", 91, None)),
        "shift" => (8, def("Shift", "ShiftLeft", 16, None)),
        _ => return None,
    })
}

/// A named key (case and `_` ignored: `Page_Down`, `pagedown`, `PageDown`).
fn named(name: &str) -> Option<KeyDef> {
    let n: String = name
        .chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect();
    if let Some(f) = n.strip_prefix('f')
        && let Ok(i) = f.parse::<i64>()
        && (1..=12).contains(&i)
    {
        let k = format!("F{i}");
        return Some(def(&k, &k, 111 + i, None));
    }
    Some(match n.as_str() {
        "enter" | "return" | "kpenter" => def("Enter", "Enter", 13, Some("\r")),
        "tab" => def("Tab", "Tab", 9, None),
        "escape" | "esc" => def("Escape", "Escape", 27, None),
        "backspace" => def("Backspace", "Backspace", 8, None),
        "delete" | "del" => def("Delete", "Delete", 46, None),
        "insert" => def("Insert", "Insert", 45, None),
        "space" => def(" ", "Space", 32, Some(" ")),
        "up" | "arrowup" => def("ArrowUp", "ArrowUp", 38, None),
        "down" | "arrowdown" => def("ArrowDown", "ArrowDown", 40, None),
        "left" | "arrowleft" => def("ArrowLeft", "ArrowLeft", 37, None),
        "right" | "arrowright" => def("ArrowRight", "ArrowRight", 39, None),
        "home" => def("Home", "Home", 36, None),
        "end" => def("End", "End", 35, None),
        "pageup" | "prior" => def("PageUp", "PageUp", 33, None),
        "pagedown" | "next" => def("PageDown", "PageDown", 34, None),
        "minus" => def("-", "Minus", 189, Some("-")),
        "plus" => def("+", "Equal", 187, Some("+")),
        "equal" => def("=", "Equal", 187, Some("=")),
        "comma" => def(",", "Comma", 188, Some(",")),
        "period" => def(".", "Period", 190, Some(".")),
        "slash" => def("/", "Slash", 191, Some("/")),
        _ => return None,
    })
}

/// A printable character's key.
fn printable(c: char, shift: bool) -> KeyDef {
    let text = if shift {
        c.to_uppercase().collect()
    } else {
        c.to_string()
    };
    let (code, key_code) = if c.is_ascii_alphabetic() {
        (
            format!("Key{}", c.to_ascii_uppercase()),
            c.to_ascii_uppercase() as i64,
        )
    } else if c.is_ascii_digit() {
        (format!("Digit{c}"), c as i64)
    } else {
        (String::new(), 0)
    };
    KeyDef {
        key: text.clone(),
        code,
        key_code,
        text: Some(text),
    }
}

/// One chord (`ctrl+shift+t`, `Return`, `a`), or what is wrong with it.
pub fn chord(text: &str) -> Result<Chord, String> {
    let parts: Vec<&str> = text.split('+').collect();
    // A trailing `+` is the plus key itself (`ctrl++`).
    let (mods, last) = match parts.as_slice() {
        [.., a, b] if a.is_empty() && b.is_empty() && parts.len() >= 2 => {
            (&parts[..parts.len() - 2], "+")
        }
        [mods @ .., last] => (mods, *last),
        [] => return Err("empty key name".into()),
    };
    let mut modifiers = 0;
    let mut held = Vec::new();
    for m in mods {
        let Some((bit, key)) = modifier(&m.trim().to_ascii_lowercase()) else {
            return Err(format!("unknown modifier {m:?}"));
        };
        modifiers |= bit;
        held.push(key);
    }
    let last = if last.is_empty() { "+" } else { last };
    let lower = last.to_ascii_lowercase();
    let key = if let Some((bit, key)) = modifier(&lower) {
        // A modifier alone (`shift`) is pressed as a key.
        let _ = bit;
        key
    } else if let Some(k) = named(last) {
        k
    } else {
        let mut chars = last.chars();
        match (chars.next(), chars.next()) {
            (Some(c), None) if !c.is_control() => printable(c, modifiers & 8 != 0),
            _ => return Err(format!("unknown key {last:?}")),
        }
    };
    // A shortcut types nothing: Ctrl, Alt or Meta held.
    let key = if modifiers & 7 != 0 {
        KeyDef { text: None, ..key }
    } else {
        key
    };
    Ok(Chord {
        modifiers,
        held,
        key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_dom_keys() {
        let c = chord("ctrl+a").unwrap();
        assert_eq!(c.modifiers, 2);
        assert_eq!(c.key, def("a", "KeyA", 65, None));
        let c = chord("shift+a").unwrap();
        assert_eq!(c.key, def("A", "KeyA", 65, Some("A")));
        assert_eq!(chord("Return").unwrap().key.key, "Enter");
        assert_eq!(chord("Page_Down").unwrap().key.code, "PageDown");
        assert_eq!(chord("F5").unwrap().key.key_code, 116);
        assert_eq!(chord("ctrl++").unwrap().key.key, "+");
        assert_eq!(chord("shift").unwrap().key.key, "Shift");
        assert_eq!(chord("7").unwrap().key, def("7", "Digit7", 55, Some("7")));
        assert!(chord("hyper+a").is_err());
        assert!(chord("notakey").is_err());
    }
}
