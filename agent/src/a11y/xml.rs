//! OSWorld's XML for the tree (its spec §4): root `desktop-frame` with the eight namespace
//! declarations, one element per node named by its role, attributes in the reference's order
//! (`name`, `st:*`, `attr:*`, `cp:screencoord`, `cp:size`, `image`, `selection`, `val:*`,
//! `act:*`), text as element content, no XML declaration, one line.

use super::Node;

const NAMESPACES: [(&str, &str); 8] = [
    ("st", "state"),
    ("attr", "attributes"),
    ("cp", "component"),
    ("doc", "document"),
    ("docattr", "document/attributes"),
    ("txt", "text"),
    ("val", "value"),
    ("act", "action"),
];

const NS_BASE: &str = "https://accessibility.ubuntu.example.org/ns/";

/// Characters XML 1.0 cannot carry at all are dropped.
fn allowed(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..)
}

fn escape_text(out: &mut String, s: &str) {
    for c in s.chars().filter(|c| allowed(*c)) {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\r' => out.push_str("&#13;"),
            c => out.push(c),
        }
    }
}

fn escape_attr(out: &mut String, s: &str) {
    for c in s.chars().filter(|c| allowed(*c)) {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\t' => out.push_str("&#9;"),
            '\n' => out.push_str("&#10;"),
            '\r' => out.push_str("&#13;"),
            c => out.push(c),
        }
    }
}

/// A name usable as an XML name (tags come from role names, attribute names from toolkits).
fn xml_name(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if !out.starts_with(|c: char| c.is_alphabetic() || c == '_') {
        out.insert(0, '_');
    }
    out
}

fn attr(out: &mut String, name: &str, value: &str) {
    out.push(' ');
    out.push_str(name);
    out.push_str("=\"");
    escape_attr(out, value);
    out.push('"');
}

/// Python's `str(float)` for the values OSWorld prints.
fn py_float(v: f64) -> String {
    if v.is_finite() && v == v.trunc() && v.abs() < 1e16 {
        format!("{v:.1}")
    } else if v.is_nan() {
        "nan".into()
    } else if v.is_infinite() {
        if v > 0.0 { "inf".into() } else { "-inf".into() }
    } else {
        format!("{v}")
    }
}

fn element(out: &mut String, n: &Node) {
    let tag = xml_name(&n.role);
    out.push('<');
    out.push_str(&tag);
    // The reference builds a dict: a repeated key keeps its first place and its last value.
    let mut attrs: Vec<(String, String)> = Vec::new();
    let mut put = |k: String, v: String| match attrs.iter_mut().find(|(x, _)| *x == k) {
        Some(slot) => slot.1 = v,
        None => attrs.push((k, v)),
    };
    put("name".into(), n.name.clone());
    for s in &n.states {
        put(format!("st:{s}"), "true".into());
    }
    for (k, v) in &n.attributes {
        put(format!("attr:{}", xml_name(k)), v.clone());
    }
    if let (Some((x, y)), Some((w, h))) = (n.screencoord, n.size) {
        put("cp:screencoord".into(), format!("({x}, {y})"));
        put("cp:size".into(), format!("({w}, {h})"));
    }
    if n.image {
        put("image".into(), "true".into());
    }
    if n.selection {
        put("selection".into(), "true".into());
    }
    if let Some(v) = &n.value {
        put("val:value".into(), py_float(v.current));
        put("val:min".into(), py_float(v.min));
        put("val:max".into(), py_float(v.max));
        put("val:step".into(), py_float(v.step));
    }
    for a in &n.actions {
        let name = a.name.replace(' ', "-");
        put(
            format!("act:{}", xml_name(&format!("{name}_desc"))),
            a.description.clone(),
        );
        put(
            format!("act:{}", xml_name(&format!("{name}_kb"))),
            a.keybinding.clone(),
        );
    }
    for (k, v) in &attrs {
        attr(out, k, v);
    }
    let text = n.text.as_deref().unwrap_or_default();
    if text.is_empty() && n.children.is_empty() {
        out.push_str("/>");
        return;
    }
    out.push('>');
    escape_text(out, text);
    for c in &n.children {
        element(out, c);
    }
    out.push_str("</");
    out.push_str(&tag);
    out.push('>');
}

pub fn to_xml(apps: &[Node]) -> String {
    let mut out = String::with_capacity(64 * 1024);
    out.push_str("<desktop-frame");
    for (prefix, path) in NAMESPACES {
        attr(
            &mut out,
            &format!("xmlns:{prefix}"),
            &format!("{NS_BASE}{path}"),
        );
    }
    if apps.is_empty() {
        out.push_str("/>");
        return out;
    }
    out.push('>');
    for a in apps {
        element(&mut out, a);
    }
    out.push_str("</desktop-frame>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::a11y::{Action, Node};

    #[test]
    fn a_node_reads_like_the_reference() {
        let button = Node {
            role: "push-button".into(),
            name: "Click <Me> & \"you\"".into(),
            states: ["enabled", "showing", "visible"].map(String::from).into(),
            attributes: [("toolkit".to_string(), "gtk".to_string())].into(),
            screencoord: Some((237, 110)),
            size: Some((402, 25)),
            image: true,
            actions: vec![Action {
                name: "click".into(),
                description: "Clicks the button".into(),
                keybinding: String::new(),
            }],
            ..Default::default()
        };
        let app = Node {
            role: "application".into(),
            name: "app".into(),
            children: vec![
                Node {
                    role: "text".into(),
                    text: Some("typed <text>\u{1}".into()),
                    ..Default::default()
                },
                button,
            ],
            ..Default::default()
        };
        let xml = to_xml(&[app]);
        assert!(xml.starts_with(
            "<desktop-frame xmlns:st=\"https://accessibility.ubuntu.example.org/ns/state\" xmlns:attr=\"https://accessibility.ubuntu.example.org/ns/attributes\" xmlns:cp="
        ), "{xml}");
        assert!(
            xml.contains("<application name=\"app\"><text name=\"\">typed &lt;text&gt;</text>"),
            "{xml}"
        );
        assert!(xml.contains(
            "<push-button name=\"Click &lt;Me&gt; &amp; &quot;you&quot;\" st:enabled=\"true\" st:showing=\"true\" st:visible=\"true\" attr:toolkit=\"gtk\" cp:screencoord=\"(237, 110)\" cp:size=\"(402, 25)\" image=\"true\" act:click_desc=\"Clicks the button\" act:click_kb=\"\"/>"
        ), "{xml}");
        assert!(xml.ends_with("</application></desktop-frame>"));
    }

    #[test]
    fn repeated_action_names_make_one_attribute() {
        let n = Node {
            role: "link".into(),
            actions: vec![
                Action {
                    name: String::new(),
                    description: "a".into(),
                    keybinding: String::new(),
                },
                Action {
                    name: String::new(),
                    description: "b".into(),
                    keybinding: String::new(),
                },
            ],
            ..Default::default()
        };
        let xml = to_xml(&[n]);
        assert!(
            xml.contains("<link name=\"\" act:_desc=\"b\" act:_kb=\"\"/>"),
            "{xml}"
        );
    }

    #[test]
    fn floats_print_like_python() {
        assert_eq!(py_float(3.0), "3.0");
        assert_eq!(py_float(0.5), "0.5");
        assert_eq!(py_float(-1.0), "-1.0");
    }
}
