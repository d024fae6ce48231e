//! `read_page` and `find` over a page's accessibility tree (CDP's `Accessibility.getFullAXTree`)
//! and its layout (`DOMSnapshot.captureSnapshot`): one line an element, `role "name" [ref_<n>]`
//! and its state, where `n` is the element's backend node id — the reference the pointer and
//! form members take, valid as long as the document lives. Pure.

use std::collections::HashMap;

use serde_json::Value;

use super::plan::Filter;
use berth_protocol::toolset::one_line;

/// The most characters `read_page` answers.
pub const MAX_PAGE: usize = 50_000;
/// The most matches `find` answers.
pub const MAX_FOUND: usize = 20;
/// The most characters of a name or value on a line.
const MAX_NAME: usize = 200;

/// Roles an agent acts on.
const INTERACTIVE: &[&str] = &[
    "button",
    "link",
    "textbox",
    "searchbox",
    "checkbox",
    "radio",
    "combobox",
    "listbox",
    "option",
    "menuitem",
    "menuitemcheckbox",
    "menuitemradio",
    "tab",
    "slider",
    "spinbutton",
    "switch",
    "treeitem",
];

/// Roles that carry nothing of their own when they have no name.
const STRUCTURAL: &[&str] = &[
    "generic",
    "none",
    "presentation",
    "GenericContainer",
    "InlineTextBox",
    "LineBreak",
    "Ignored",
];

/// An element's box in document coordinates: x, y, width, height.
pub type Rect = (f64, f64, f64, f64);

/// The page as the two members read it.
pub struct Page<'a> {
    nodes: HashMap<&'a str, &'a Value>,
    order: HashMap<&'a str, usize>,
    root: Option<&'a Value>,
    /// Layout boxes by backend node id.
    pub boxes: HashMap<i64, Rect>,
    /// The viewport in document coordinates.
    pub viewport: Rect,
}

fn s<'a>(v: &'a Value, field: &str) -> &'a str {
    v[field]["value"].as_str().unwrap_or_default()
}

fn short(text: &str) -> String {
    let line = one_line(text);
    let line = line.trim();
    if line.chars().count() > MAX_NAME {
        let cut: String = line.chars().take(MAX_NAME).collect();
        format!("{cut}…")
    } else {
        line.to_string()
    }
}

/// Layout boxes by backend node id from `DOMSnapshot.captureSnapshot`'s first document.
pub fn boxes(snapshot: &Value) -> HashMap<i64, Rect> {
    let doc = &snapshot["documents"][0];
    let ids = doc["nodes"]["backendNodeId"].as_array();
    let index = doc["layout"]["nodeIndex"].as_array();
    let bounds = doc["layout"]["bounds"].as_array();
    let (Some(ids), Some(index), Some(bounds)) = (ids, index, bounds) else {
        return HashMap::new();
    };
    let mut out = HashMap::with_capacity(index.len());
    for (i, b) in index.iter().zip(bounds) {
        let (Some(i), Some(b)) = (i.as_u64(), b.as_array()) else {
            continue;
        };
        let Some(id) = ids.get(i as usize).and_then(Value::as_i64) else {
            continue;
        };
        let f = |k: usize| b.get(k).and_then(Value::as_f64).unwrap_or_default();
        out.entry(id).or_insert((f(0), f(1), f(2), f(3)));
    }
    out
}

impl<'a> Page<'a> {
    pub fn new(ax: &'a Value, boxes: HashMap<i64, Rect>, viewport: Rect) -> Page<'a> {
        let list = ax["nodes"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        let mut nodes = HashMap::with_capacity(list.len());
        let mut order = HashMap::with_capacity(list.len());
        for (i, n) in list.iter().enumerate() {
            if let Some(id) = n["nodeId"].as_str() {
                nodes.insert(id, n);
                order.insert(id, i);
            }
        }
        let root = list
            .iter()
            .find(|n| n["parentId"].is_null() && n["nodeId"].is_string());
        Page {
            nodes,
            order,
            root,
            boxes,
            viewport,
        }
    }

    fn children(&self, n: &'a Value) -> Vec<&'a Value> {
        n["childIds"]
            .as_array()
            .map(|ids| {
                ids.iter()
                    .filter_map(|id| id.as_str().and_then(|id| self.nodes.get(id).copied()))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn backend(n: &Value) -> Option<i64> {
        n["backendDOMNodeId"].as_i64()
    }

    fn prop<'v>(n: &'v Value, name: &str) -> Option<&'v Value> {
        n["properties"]
            .as_array()?
            .iter()
            .find(|p| p["name"] == name)
            .map(|p| &p["value"]["value"])
    }

    fn interactive(n: &Value) -> bool {
        let role = s(n, "role");
        INTERACTIVE.contains(&role)
            || (role != "RootWebArea" && Self::prop(n, "focusable") == Some(&Value::Bool(true)))
    }

    /// Whether the element has a box (anywhere, or in the viewport).
    fn shown(&self, n: &Value, in_view: bool) -> bool {
        let Some((x, y, w, h)) = Self::backend(n).and_then(|id| self.boxes.get(&id)) else {
            return false;
        };
        if *w <= 0.0 || *h <= 0.0 {
            return false;
        }
        if !in_view {
            return true;
        }
        let (vx, vy, vw, vh) = self.viewport;
        x + w > vx && *x < vx + vw && y + h > vy && *y < vy + vh
    }

    /// The element's line: `role "name" [ref_n]` and its state.
    pub fn line(n: &Value) -> String {
        let role = s(n, "role");
        let name = short(s(n, "name"));
        let mut line = String::from(if role == "StaticText" { "text" } else { role });
        if !name.is_empty() {
            line.push_str(&format!(" {:?}", name));
        }
        if let Some(id) = Self::backend(n) {
            line.push_str(&format!(" [ref_{id}]"));
        }
        let value = short(s(n, "value"));
        if !value.is_empty() && value != name {
            line.push_str(&format!(" value={:?}", value));
        }
        for state in [
            "checked", "pressed", "selected", "expanded", "disabled", "required", "focused",
        ] {
            match Self::prop(n, state) {
                Some(Value::Bool(true)) => line.push_str(&format!(" {state}")),
                Some(Value::String(v)) if state == "checked" || state == "pressed" => {
                    if v == "true" {
                        line.push_str(&format!(" {state}"));
                    } else if v == "mixed" {
                        line.push_str(&format!(" {state}=mixed"));
                    }
                }
                _ => {}
            }
        }
        if matches!(role, "checkbox" | "radio" | "switch") && !line.contains(" checked") {
            line.push_str(" unchecked");
        }
        line
    }

    fn printable(&self, n: &Value, parent_name: &str, filter: Filter) -> bool {
        if n["ignored"] == true {
            return false;
        }
        let role = s(n, "role");
        if filter == Filter::Interactive {
            return Self::interactive(n) && self.shown(n, true);
        }
        if role == "RootWebArea" {
            return true;
        }
        if STRUCTURAL.contains(&role) && s(n, "name").trim().is_empty() {
            return false;
        }
        if role == "StaticText"
            && (short(s(n, "name")).is_empty() || short(s(n, "name")) == parent_name)
        {
            return false;
        }
        self.shown(n, filter == Filter::Visible)
    }

    /// `read_page`: the tree under `root` (a backend node id; the document when absent), one
    /// element a line, indented by depth. `None` when `root` names no element of the page.
    pub fn read(&self, filter: Filter, depth: Option<usize>, root: Option<i64>) -> Option<String> {
        let start = match root {
            None => self.root?,
            Some(id) => self
                .nodes
                .values()
                .filter(|n| Self::backend(n) == Some(id))
                .min_by_key(|n| self.order.get(n["nodeId"].as_str().unwrap_or_default()))
                .copied()?,
        };
        let mut out = String::new();
        let mut capped = false;
        // Depth-first with an explicit stack: (node, printed depth, the printed parent's name).
        let mut stack: Vec<(&Value, usize, String)> = vec![(start, 0, String::new())];
        let max = depth.unwrap_or(usize::MAX);
        while let Some((n, d, parent)) = stack.pop() {
            let forced = root.is_some() && std::ptr::eq(n, start);
            let print = forced || self.printable(n, &parent, filter);
            let (child_depth, name) = if print {
                let line = Self::line(n);
                if out.len() + line.len() + 2 * d + 1 > MAX_PAGE {
                    capped = true;
                    break;
                }
                out.push_str(&"  ".repeat(d));
                out.push_str(&line);
                out.push('\n');
                (d + 1, short(s(n, "name")))
            } else {
                (d, parent)
            };
            if child_depth >= max && print {
                continue;
            }
            for c in self.children(n).into_iter().rev() {
                stack.push((c, child_depth, name.clone()));
            }
        }
        if capped {
            out.push_str(
                "[Output capped at 50,000 characters: narrow it with ref or a smaller depth.]\n",
            );
        }
        Some(out.trim_end().to_string())
    }

    /// `find`: the elements best matching `query`'s words (in their role, name, value or
    /// description), best first, at most [`MAX_FOUND`].
    pub fn find(&self, query: &str) -> String {
        let words: Vec<String> = query
            .split(|c: char| !c.is_alphanumeric())
            .map(str::to_lowercase)
            .filter(|w| !w.is_empty() && !STOP_WORDS.contains(&w.as_str()))
            .collect();
        let mut scored: Vec<(usize, usize, &Value)> = Vec::new();
        for (id, n) in &self.nodes {
            let role = s(n, "role");
            if n["ignored"] == true
                || Self::backend(n).is_none()
                || matches!(role, "InlineTextBox" | "RootWebArea")
                || (STRUCTURAL.contains(&role) && s(n, "name").trim().is_empty())
                || !self.shown(n, false)
            {
                continue;
            }
            let hay = format!(
                "{} {} {} {}",
                s(n, "name"),
                s(n, "value"),
                s(n, "description"),
                role
            )
            .to_lowercase();
            let mut score = 0;
            for w in &words {
                if hay.contains(w.as_str()) || role_synonym(w, role) {
                    score += 1;
                }
            }
            if score > 0 {
                scored.push((score, self.order[id], n));
            }
        }
        scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let lines: Vec<String> = scored
            .iter()
            .take(MAX_FOUND)
            .map(|(_, _, n)| Self::line(n))
            .collect();
        if lines.is_empty() {
            "No element on the page matches.".into()
        } else {
            lines.join("\n")
        }
    }
}

const STOP_WORDS: &[&str] = &[
    "the", "a", "an", "to", "of", "for", "on", "in", "at", "with", "and", "or", "this", "that",
    "element", "page",
];

/// Whether a query word names the role (`search bar` → a search box).
fn role_synonym(word: &str, role: &str) -> bool {
    match word {
        "bar" | "box" | "field" | "input" => {
            matches!(role, "textbox" | "searchbox" | "combobox")
        }
        "search" => role == "searchbox",
        "dropdown" | "select" => matches!(role, "combobox" | "listbox"),
        "checkbox" | "tick" => role == "checkbox",
        "menu" => role.starts_with("menu"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(
        id: &str,
        parent: Option<&str>,
        role: &str,
        name: &str,
        backend: i64,
        kids: &[&str],
    ) -> Value {
        json!({"nodeId": id, "parentId": parent, "ignored": false,
               "role": {"type": "role", "value": role}, "name": {"type": "computedString", "value": name},
               "backendDOMNodeId": backend, "childIds": kids})
    }

    fn page() -> (Value, HashMap<i64, Rect>) {
        let mut check = node("5", Some("1"), "checkbox", "Subscribe", 50, &[]);
        check["properties"] = json!([{"name": "checked", "value": {"type": "tristate", "value": "true"}},
                                     {"name": "focusable", "value": {"type": "booleanOrUndefined", "value": true}}]);
        let ax = json!({"nodes": [
            node("1", None, "RootWebArea", "Shop", 1, &["2", "3", "4", "5", "6"]),
            node("2", Some("1"), "heading", "Welcome", 20, &["7"]),
            node("3", Some("1"), "searchbox", "Search products", 30, &[]),
            node("4", Some("1"), "button", "Add to cart", 40, &[]),
            check,
            node("6", Some("1"), "link", "Far below", 60, &[]),
            node("7", Some("2"), "StaticText", "Welcome", 70, &[]),
        ]});
        let mut b = HashMap::new();
        for (id, y) in [
            (1, 0.0),
            (20, 10.0),
            (30, 50.0),
            (40, 90.0),
            (50, 130.0),
            (60, 5000.0),
            (70, 10.0),
        ] {
            b.insert(id, (0.0, y, 100.0, 20.0));
        }
        (ax, b)
    }

    #[test]
    fn read_page_lines_carry_refs_and_state() {
        let (ax, b) = page();
        let p = Page::new(&ax, b, (0.0, 0.0, 800.0, 600.0));
        let text = p.read(Filter::Visible, None, None).unwrap();
        assert_eq!(
            text,
            "RootWebArea \"Shop\" [ref_1]\n  heading \"Welcome\" [ref_20]\n  searchbox \"Search products\" [ref_30]\n  button \"Add to cart\" [ref_40]\n  checkbox \"Subscribe\" [ref_50] checked"
        );
        let all = p.read(Filter::All, None, None).unwrap();
        assert!(all.ends_with("link \"Far below\" [ref_60]"), "{all}");
        let inter = p.read(Filter::Interactive, None, None).unwrap();
        assert!(
            !inter.contains("heading") && inter.contains("[ref_40]"),
            "{inter}"
        );
        assert_eq!(
            p.read(Filter::Visible, Some(1), None).unwrap(),
            "RootWebArea \"Shop\" [ref_1]"
        );
        assert_eq!(
            p.read(Filter::Visible, None, Some(40)).unwrap(),
            "button \"Add to cart\" [ref_40]"
        );
        assert!(p.read(Filter::Visible, None, Some(999)).is_none());
    }

    #[test]
    fn find_ranks_by_words_and_roles() {
        let (ax, b) = page();
        let p = Page::new(&ax, b, (0.0, 0.0, 800.0, 600.0));
        let found = p.find("search bar");
        assert_eq!(
            found.lines().next().unwrap(),
            "searchbox \"Search products\" [ref_30]"
        );
        assert_eq!(
            p.find("add to cart button"),
            "button \"Add to cart\" [ref_40]"
        );
        assert_eq!(p.find("zebra"), "No element on the page matches.");
        // Off-screen elements are found too.
        assert!(p.find("far").contains("[ref_60]"));
    }
}
