//! Python semantics the reference server gets for free and clients depend on: truthiness,
//! `os.path.expanduser`/`expandvars`, `shlex.split` errors, type names in messages.

use std::path::Path;

use serde_json::Value;

/// Python's `bool(x)` for a JSON value.
pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// The Python type name of the value `json.loads` would produce.
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

/// `os.path.expanduser`: a leading `~` or `~/…` becomes the sandbox home (`~name` is left
/// alone unless it names the sandbox user).
pub fn expanduser(p: &str, home: &Path, user: &str) -> String {
    let Some(rest) = p.strip_prefix('~') else {
        return p.to_string();
    };
    let (name, tail) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if name.is_empty() || name == user {
        let h = home.to_string_lossy();
        let h = h.trim_end_matches('/');
        let h = if h.is_empty() { "/" } else { h };
        if tail.is_empty() {
            return h.to_string();
        }
        return format!("{}{tail}", if h == "/" { "" } else { h });
    }
    match nix::unistd::User::from_name(name) {
        Ok(Some(u)) => format!("{}{tail}", u.dir.to_string_lossy().trim_end_matches('/')),
        _ => p.to_string(),
    }
}

/// `os.path.expandvars`: `$NAME` and `${NAME}` replaced from `env`; unknown names stay.
pub fn expandvars(p: &str, env: &dyn Fn(&str) -> Option<String>) -> String {
    if !p.contains('$') {
        return p.to_string();
    }
    let mut out = String::with_capacity(p.len());
    let mut rest = p;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, consumed) = if let Some(inner) = after.strip_prefix('{') {
            match inner.find('}') {
                Some(end) => (&inner[..end], end + 2),
                None => ("", 0),
            }
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], end)
        };
        match (name.is_empty(), env(name)) {
            (false, Some(v)) => out.push_str(&v),
            _ => out.push_str(&rest[i..i + 1 + consumed]),
        }
        rest = &rest[i + 1 + consumed..];
        if consumed == 0 {
            // A lone `$` (or an unterminated `${`): keep it literally.
            continue;
        }
    }
    out.push_str(rest);
    out
}

/// `shlex.split` (POSIX mode), with Python's error messages.
pub fn shlex_split(s: &str) -> Result<Vec<String>, String> {
    shlex::split(s).ok_or_else(|| {
        if s.trim_end().ends_with('\\') && !s.trim_end().ends_with("\\\\") {
            "No escaped character".to_string()
        } else {
            "No closing quotation".to_string()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expanduser_matches_python() {
        let home = Path::new("/home/user");
        assert_eq!(expanduser("~/a/b", home, "user"), "/home/user/a/b");
        assert_eq!(expanduser("~", home, "user"), "/home/user");
        assert_eq!(expanduser("~user/x", home, "user"), "/home/user/x");
        assert_eq!(expanduser("/abs/~", home, "user"), "/abs/~");
        assert_eq!(
            expanduser("~nosuchuserxyz/x", home, "user"),
            "~nosuchuserxyz/x"
        );
    }

    #[test]
    fn expandvars_matches_python() {
        let env = |k: &str| match k {
            "HOME" => Some("/home/user".to_string()),
            "A_1" => Some("v".to_string()),
            _ => None,
        };
        assert_eq!(expandvars("$HOME/x", &env), "/home/user/x");
        assert_eq!(expandvars("${HOME}x", &env), "/home/userx");
        assert_eq!(expandvars("$A_1-$MISSING", &env), "v-$MISSING");
        assert_eq!(expandvars("cost $ 5 ${", &env), "cost $ 5 ${");
    }

    #[test]
    fn shlex_matches_python() {
        assert_eq!(
            shlex_split("echo 'a  b' c").unwrap(),
            vec!["echo", "a  b", "c"]
        );
        assert_eq!(
            shlex_split("echo 'unterminated").unwrap_err(),
            "No closing quotation"
        );
        assert_eq!(shlex_split("").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn truthiness_matches_python() {
        use serde_json::json;
        assert!(!truthy(&json!(0)));
        assert!(!truthy(&json!("")));
        assert!(!truthy(&json!(null)));
        assert!(truthy(&json!("false")));
        assert!(truthy(&json!(1)));
    }
}
