//! Key names as engines send them — xdotool's (X keysym names: `Return`, `ctrl+shift+t`,
//! `KP_Enter`, `super`) and pyautogui's (`enter`, `pgdn`, `win`) — resolved to keysyms.

/// Names that are not X keysym names, or not spelled like one.
const ALIASES: &[(&str, &str)] = &[
    ("ctrl", "Control_L"),
    ("control", "Control_L"),
    ("ctrlleft", "Control_L"),
    ("ctrlright", "Control_R"),
    ("shift", "Shift_L"),
    ("shiftleft", "Shift_L"),
    ("shiftright", "Shift_R"),
    ("alt", "Alt_L"),
    ("altleft", "Alt_L"),
    ("altright", "Alt_R"),
    ("option", "Alt_L"),
    ("super", "Super_L"),
    ("win", "Super_L"),
    ("winleft", "Super_L"),
    ("winright", "Super_R"),
    ("cmd", "Super_L"),
    ("command", "Super_L"),
    ("meta", "Meta_L"),
    ("enter", "Return"),
    ("return", "Return"),
    ("esc", "Escape"),
    ("escape", "Escape"),
    ("backspace", "BackSpace"),
    ("del", "Delete"),
    ("delete", "Delete"),
    ("ins", "Insert"),
    ("insert", "Insert"),
    ("tab", "Tab"),
    ("space", "space"),
    ("spacebar", "space"),
    ("pageup", "Prior"),
    ("page_up", "Prior"),
    ("pgup", "Prior"),
    ("pagedown", "Next"),
    ("page_down", "Next"),
    ("pgdn", "Next"),
    ("up", "Up"),
    ("down", "Down"),
    ("left", "Left"),
    ("right", "Right"),
    ("home", "Home"),
    ("end", "End"),
    ("capslock", "Caps_Lock"),
    ("numlock", "Num_Lock"),
    ("scrolllock", "Scroll_Lock"),
    ("printscreen", "Print"),
    ("prtsc", "Print"),
    ("prtscr", "Print"),
    ("print", "Print"),
    ("pause", "Pause"),
    ("menu", "Menu"),
    ("apps", "Menu"),
    ("volumeup", "XF86AudioRaiseVolume"),
    ("volumedown", "XF86AudioLowerVolume"),
    ("volumemute", "XF86AudioMute"),
    ("playpause", "XF86AudioPlay"),
    ("nexttrack", "XF86AudioNext"),
    ("prevtrack", "XF86AudioPrev"),
    ("plus", "plus"),
    ("minus", "minus"),
    ("multiply", "KP_Multiply"),
    ("divide", "KP_Divide"),
    ("add", "KP_Add"),
    ("subtract", "KP_Subtract"),
    ("decimal", "KP_Decimal"),
];

/// The keysym for one key name, or `None` when nothing by that name exists.
pub fn keysym(name: &str) -> Option<u32> {
    let lower = name.to_ascii_lowercase();
    if let Some((_, target)) = ALIASES.iter().find(|(a, _)| *a == lower) {
        return named(target);
    }
    // A single character stands for itself (`a`, `A`, `é`, `/`).
    let mut chars = name.chars();
    if let (Some(c), None) = (chars.next(), chars.next()) {
        // A control character is a key only where one exists for it (Return, Tab, …): NUL or
        // ESC-less controls would press a keysym no keyboard has, silently doing nothing.
        let sym = char_keysym(c);
        return (!c.is_control() || sym != 0x0100_0000 + c as u32).then_some(sym);
    }
    // F1–F35 and num0–num9 in any case.
    if let Some(n) = lower.strip_prefix('f').and_then(|n| n.parse::<u32>().ok())
        && (1..=35).contains(&n)
    {
        return named(&format!("F{n}"));
    }
    if let Some(n) = lower
        .strip_prefix("num")
        .and_then(|n| n.parse::<u32>().ok())
        && n <= 9
    {
        return named(&format!("KP_{n}"));
    }
    named(name)
        .or_else(|| named(&capitalised(&lower)))
        .or_else(|| named(&lower))
}

fn named(name: &str) -> Option<u32> {
    x11_keysymdef::lookup_by_name(name).map(|r| r.keysym)
}

fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// The keysym that types `c`: Latin-1 keysyms equal their code point, everything else is
/// 0x01000000 + code point (control characters map to their keys).
pub fn char_keysym(c: char) -> u32 {
    match c {
        '\n' | '\r' => 0xff0d, // Return
        '\t' => 0xff09,        // Tab
        '\u{8}' => 0xff08,     // BackSpace
        '\u{1b}' => 0xff1b,    // Escape
        c if (' '..='~').contains(&c) || ('\u{a0}'..='\u{ff}').contains(&c) => c as u32,
        c => 0x0100_0000 + c as u32,
    }
}

/// `ctrl+shift+t` → the keysyms in press order. Errors name the key that does not exist.
pub fn chord(spec: &str) -> Result<Vec<u32>, String> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Err("empty key name".into());
    }
    let mut parts: Vec<&str> = Vec::new();
    // "ctrl++" means ctrl and the plus key.
    let mut rest = spec;
    while !rest.is_empty() {
        match rest.find('+') {
            Some(0) => {
                parts.push("+");
                rest = rest[1..].strip_prefix('+').unwrap_or(&rest[1..]);
            }
            Some(i) => {
                parts.push(&rest[..i]);
                rest = &rest[i + 1..];
            }
            None => {
                parts.push(rest);
                rest = "";
            }
        }
    }
    parts
        .iter()
        .map(|p| {
            let p = p.trim();
            keysym(p).ok_or_else(|| format!("unknown key {p:?}"))
        })
        .collect()
}

/// OpenAI's computer-use key names (`keypress`'s `keys`), any case, to the X keysym names
/// [`keysym`] resolves.
const OPENAI: &[(&str, &str)] = &[
    ("CTRL", "Control_L"),
    ("CONTROL", "Control_L"),
    ("ALT", "Alt_L"),
    ("OPTION", "Alt_L"),
    ("SHIFT", "Shift_L"),
    ("META", "Super_L"),
    ("CMD", "Super_L"),
    ("COMMAND", "Super_L"),
    ("SUPER", "Super_L"),
    ("WIN", "Super_L"),
    ("ENTER", "Return"),
    ("RETURN", "Return"),
    ("ESC", "Escape"),
    ("ESCAPE", "Escape"),
    ("TAB", "Tab"),
    ("SPACE", "space"),
    ("BACKSPACE", "BackSpace"),
    ("DELETE", "Delete"),
    ("DEL", "Delete"),
    ("ARROWLEFT", "Left"),
    ("ARROWRIGHT", "Right"),
    ("ARROWUP", "Up"),
    ("ARROWDOWN", "Down"),
    ("LEFT", "Left"),
    ("RIGHT", "Right"),
    ("UP", "Up"),
    ("DOWN", "Down"),
    ("HOME", "Home"),
    ("END", "End"),
    ("PAGEUP", "Prior"),
    ("PAGEDOWN", "Next"),
    ("INSERT", "Insert"),
    ("CAPSLOCK", "Caps_Lock"),
];

/// An OpenAI key name (`CTRL`, `ENTER`, `ARROWLEFT`, `F5`, `a`, `/`) as the X keysym name
/// that [`keysym`] and [`chord`] resolve, or `None` for a name OpenAI does not use. Letters
/// are lower case (`T` in `["CTRL", "T"]` is the T key, not a capital: OpenAI names Shift
/// when it means it); `+` and space are spelled out so they survive in a chord.
pub fn openai_key(name: &str) -> Option<String> {
    let upper = name.to_ascii_uppercase();
    if let Some((_, x)) = OPENAI.iter().find(|(o, _)| *o == upper) {
        return Some((*x).to_string());
    }
    if let Some(n) = upper.strip_prefix('F').and_then(|n| n.parse::<u32>().ok())
        && (1..=24).contains(&n)
        && !upper[1..].starts_with(['0', '+'])
    {
        return Some(format!("F{n}"));
    }
    let mut chars = name.chars();
    match (chars.next(), chars.next()) {
        (Some('+'), None) => Some("plus".into()),
        (Some(' '), None) => Some("space".into()),
        (Some(c), None) if !c.is_control() => Some(c.to_lowercase().collect()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xdotool_and_pyautogui_names_resolve() {
        assert_eq!(keysym("Return"), Some(0xff0d));
        assert_eq!(keysym("enter"), Some(0xff0d));
        assert_eq!(keysym("KP_Enter"), Some(0xff8d));
        assert_eq!(keysym("super"), Some(0xffeb));
        assert_eq!(keysym("F5"), Some(0xffc2));
        assert_eq!(keysym("f12"), Some(0xffc9));
        assert_eq!(keysym("pgdn"), Some(0xff56));
        assert_eq!(keysym("a"), Some(0x61));
        assert_eq!(keysym("A"), Some(0x41));
        assert_eq!(keysym("\u{0}"), None, "NUL is no key");
        assert_eq!(keysym("\u{7}"), None);
        assert_eq!(keysym("\t"), Some(0xff09));
        assert!(chord("ctrl+\u{0}").unwrap_err().contains("unknown key"));
        assert_eq!(keysym("é"), Some(0xe9));
        assert_eq!(keysym("✓"), Some(0x0100_2713));
        assert_eq!(keysym("BackSpace"), Some(0xff08));
        assert_eq!(keysym("backspace"), Some(0xff08));
        assert_eq!(keysym("nosuchkey"), None);
    }

    #[test]
    fn chords_split_on_plus_and_name_the_bad_key() {
        assert_eq!(chord("ctrl+shift+t").unwrap(), vec![0xffe3, 0xffe1, 0x74]);
        assert_eq!(chord("ctrl++").unwrap(), vec![0xffe3, 0x2b]);
        assert_eq!(chord("+").unwrap(), vec![0x2b]);
        assert_eq!(chord("ctrl+bogus").unwrap_err(), "unknown key \"bogus\"");
        assert!(chord("").is_err());
    }

    #[test]
    fn openai_key_names_map_to_keysyms_in_any_case() {
        let sym = |n: &str| openai_key(n).and_then(|x| keysym(&x));
        for (name, want) in [
            ("CTRL", 0xffe3),
            ("control", 0xffe3),
            ("ALT", 0xffe9),
            ("option", 0xffe9),
            ("SHIFT", 0xffe1),
            ("META", 0xffeb),
            ("CMD", 0xffeb),
            ("SUPER", 0xffeb),
            ("Win", 0xffeb),
            ("ENTER", 0xff0d),
            ("RETURN", 0xff0d),
            ("ESC", 0xff1b),
            ("ESCAPE", 0xff1b),
            ("TAB", 0xff09),
            ("SPACE", 0x20),
            (" ", 0x20),
            ("BACKSPACE", 0xff08),
            ("DELETE", 0xffff),
            ("ARROWLEFT", 0xff51),
            ("ARROWUP", 0xff52),
            ("ARROWRIGHT", 0xff53),
            ("ARROWDOWN", 0xff54),
            ("LEFT", 0xff51),
            ("up", 0xff52),
            ("RIGHT", 0xff53),
            ("DOWN", 0xff54),
            ("HOME", 0xff50),
            ("END", 0xff57),
            ("PAGEUP", 0xff55),
            ("PAGEDOWN", 0xff56),
            ("INSERT", 0xff63),
            ("CAPSLOCK", 0xffe5),
            ("F1", 0xffbe),
            ("f12", 0xffc9),
            ("F24", 0xffd5),
            ("T", 0x74),
            ("t", 0x74),
            ("/", 0x2f),
            ("\\", 0x5c),
            ("+", 0x2b),
            ("1", 0x31),
            ("é", 0xe9),
        ] {
            assert_eq!(sym(name), Some(want), "{name:?}");
        }
        for bad in [
            "",
            "F0",
            "F25",
            "F01",
            "HYPERSPACE",
            "CTRL+C",
            "\u{7}",
            "ab",
        ] {
            assert_eq!(openai_key(bad), None, "{bad:?}");
        }
        // Every target of the table is a key the agent can press.
        for (name, x) in OPENAI {
            assert!(keysym(x).is_some(), "{name} -> {x}");
        }
    }

    #[test]
    fn openai_chords_survive_the_join() {
        let join = |keys: &[&str]| {
            keys.iter()
                .map(|k| openai_key(k).unwrap())
                .collect::<Vec<_>>()
                .join("+")
        };
        assert_eq!(
            chord(&join(&["CTRL", "SHIFT", "T"])).unwrap(),
            vec![0xffe3, 0xffe1, 0x74]
        );
        assert_eq!(chord(&join(&["CTRL", "+"])).unwrap(), vec![0xffe3, 0x2b]);
        assert_eq!(chord(&join(&["SHIFT", " "])).unwrap(), vec![0xffe1, 0x20]);
    }
}
