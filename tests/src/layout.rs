//! The shape of the code, measured: which source file of a crate imports which, and the import
//! loops among them (files that reach each other through their imports). A file imports
//! another when it names it by a `crate::`, `super::` or `self::` path, in a `use` or inline;
//! the crate root also by a top-level module's name. Test modules do not count.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path within its crate (`["display", "settle"]`; the root is empty).
pub type ModPath = Vec<String>;

/// Each source file of the crate under `src` and the files it imports.
pub fn graph(src: &Path) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let files = files(src);
    let tops: BTreeSet<String> = files.keys().filter_map(|m| m.first().cloned()).collect();
    files
        .iter()
        .map(|(module, path)| {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let tops = if module.is_empty() { Some(&tops) } else { None };
            let targets = paths(&text, tops)
                .into_iter()
                .filter_map(|p| resolve(module, &p, &files))
                .filter(|t| t != module)
                .collect();
            (module.clone(), targets)
        })
        .collect()
}

/// The import loops: each set of two or more files that reach one another, by module path.
pub fn loops(graph: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<BTreeSet<String>> {
    let mut out: Vec<BTreeSet<String>> = sccs(graph)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| c.iter().map(name).collect())
        .collect();
    out.sort();
    out
}

/// Where a file sits in a written layer order (bottom first): the layer of the longest module
/// prefix listed (`"store"` places `store/runs` too); `None` when none is listed.
pub fn layer_of(m: &ModPath, layers: &[&[&str]]) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for (i, layer) in layers.iter().enumerate() {
        for prefix in *layer {
            let p: Vec<&str> = match *prefix {
                "<root>" => Vec::new(),
                p => p.split('/').collect(),
            };
            let matches = p.len() <= m.len() && p.iter().zip(m).all(|(a, b)| a == b);
            let exact_root = !p.is_empty() || m.is_empty();
            if matches && exact_root && best.is_none_or(|(len, _)| p.len() > len) {
                best = Some((p.len(), i));
            }
        }
    }
    best.map(|(_, i)| i)
}

/// The imports that run upward in a layer order (from a file to one in a higher layer), and
/// the files the order does not place.
pub fn upward(
    graph: &BTreeMap<ModPath, BTreeSet<ModPath>>,
    layers: &[&[&str]],
) -> (Vec<(String, String)>, Vec<String>) {
    let mut up = Vec::new();
    let mut unplaced = Vec::new();
    for (from, targets) in graph {
        let Some(lf) = layer_of(from, layers) else {
            unplaced.push(name(from));
            continue;
        };
        for to in targets {
            if layer_of(to, layers).is_some_and(|lt| lt > lf) {
                up.push((name(from), name(to)));
            }
        }
    }
    (up, unplaced)
}

/// A module path as written in the reports (`display/settle`, `<root>`).
pub fn name(m: &ModPath) -> String {
    if m.is_empty() {
        "<root>".into()
    } else {
        m.join("/")
    }
}

fn files(src: &Path) -> BTreeMap<ModPath, PathBuf> {
    let mut out = BTreeMap::new();
    let has_lib = src.join("lib.rs").exists();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = p.strip_prefix(src).expect("under src");
            // A binary over the library is another crate.
            if has_lib && rel == Path::new("main.rs") {
                continue;
            }
            let mut m: ModPath = rel
                .with_extension("")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if m.last()
                .is_some_and(|l| l == "mod" || l == "lib" || l == "main")
            {
                m.pop();
            }
            out.insert(m, p);
        }
    }
    out
}

/// The source without comments and without its test module.
fn code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let line = match line.find("//") {
            Some(i) if !line[..i].contains('"') => &line[..i],
            _ => line,
        };
        out.push_str(line);
        out.push('\n');
    }
    if let Some(i) = out.find("#[cfg(test)]")
        && out[i + 12..].trim_start().starts_with("mod ")
    {
        out.truncate(i);
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The paths a file names: each `use` tree expanded, each `crate::`/`super::`/`self::` path,
/// and (for the root, given its top-level modules) each path starting at one of them.
fn paths(text: &str, root_tops: Option<&BTreeSet<String>>) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    // `use` statements (a line's first item, perhaps `pub`), expanded, and the rest of the code.
    let mut rest = String::with_capacity(text.len());
    let mut lines = code(text)
        .lines()
        .map(str::to_string)
        .collect::<Vec<_>>()
        .into_iter();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        let t = t
            .strip_prefix("pub ")
            .or_else(|| t.strip_prefix("pub(crate) "))
            .or_else(|| t.strip_prefix("pub(super) "))
            .unwrap_or(t);
        let Some(tree) = t.strip_prefix("use ") else {
            rest.push_str(&line);
            rest.push('\n');
            continue;
        };
        let mut tree = tree.to_string();
        while !tree.contains(';') {
            let Some(more) = lines.next() else { break };
            tree.push_str(&more);
        }
        // `x as y` keeps `x`: mark the rename before the blanks go.
        let tree: String = tree
            .split(';')
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .replace(" as ", "@")
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        expand(&tree, &mut out);
    }
    let code = rest;
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if !is_ident(chars[i]) || (i > 0 && (is_ident(chars[i - 1]) || chars[i - 1] == ':')) {
            i += 1;
            continue;
        }
        let mut segs = Vec::new();
        let mut j = i;
        loop {
            let start = j;
            while j < chars.len() && is_ident(chars[j]) {
                j += 1;
            }
            segs.push(chars[start..j].iter().collect::<String>());
            if j + 2 < chars.len()
                && chars[j] == ':'
                && chars[j + 1] == ':'
                && is_ident(chars[j + 2])
            {
                j += 2;
            } else {
                break;
            }
        }
        i = j.max(i + 1);
        if segs.len() < 2 {
            continue;
        }
        let first = segs[0].as_str();
        if matches!(first, "crate" | "super" | "self") {
            out.push(segs);
        } else if root_tops.is_some_and(|t| t.contains(first)) {
            segs.insert(0, "crate".into());
            out.push(segs);
        }
    }
    out
}

/// `a::{b, c::{d, e}}` → `a::b`, `a::c::d`, `a::c::e` (`x as y` keeps `x`).
fn expand(tree: &str, out: &mut Vec<Vec<String>>) {
    let Some(open) = tree.find('{') else {
        let path = tree.split('@').next().unwrap_or(tree);
        let segs: Vec<String> = path
            .split("::")
            .filter(|s| !s.is_empty() && *s != "*")
            .map(str::to_string)
            .collect();
        if !segs.is_empty() {
            out.push(segs);
        }
        return;
    };
    let Some(close) = tree.rfind('}').filter(|&c| c > open) else {
        return;
    };
    let prefix = &tree[..open];
    let mut depth = 0;
    let mut part = String::new();
    for c in tree[open + 1..close].chars().chain(std::iter::once(',')) {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        if c == ',' && depth == 0 {
            if !part.is_empty() {
                expand(&format!("{prefix}{part}"), out);
            }
            part.clear();
        } else {
            part.push(c);
        }
    }
}

/// The file a path names, from the file naming it: the longest prefix that is a file module.
fn resolve(from: &ModPath, path: &[String], files: &BTreeMap<ModPath, PathBuf>) -> Option<ModPath> {
    let mut base: ModPath = Vec::new();
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => rest = &path[1..],
        Some("super") | Some("self") => {
            base = from.clone();
            while let Some(s) = rest.first() {
                match s.as_str() {
                    "super" => {
                        base.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    base.extend(rest.iter().cloned());
    (0..=base.len())
        .rev()
        .map(|n| base[..n].to_vec())
        .find(|m| files.contains_key(m))
}

/// Strongly connected components (Tarjan, iterative).
fn sccs(g: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<Vec<ModPath>> {
    let nodes: Vec<&ModPath> = g.keys().collect();
    let index_of: BTreeMap<&ModPath, usize> =
        nodes.iter().enumerate().map(|(i, m)| (*m, i)).collect();
    let succ: Vec<Vec<usize>> = nodes
        .iter()
        .map(|m| {
            g[*m]
                .iter()
                .filter_map(|t| index_of.get(t).copied())
                .collect()
        })
        .collect();
    let n = nodes.len();
    let (mut index, mut low) = (vec![usize::MAX; n], vec![0; n]);
    let (mut on_stack, mut stack, mut next, mut out) = (vec![false; n], Vec::new(), 0, Vec::new());
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        let mut work = vec![(root, 0usize)];
        while let Some(&mut (v, ref mut k)) = work.last_mut() {
            if *k == 0 && index[v] == usize::MAX {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on_stack[v] = true;
            }
            if let Some(&w) = succ[v].get(*k) {
                *k += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut comp = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    comp.push(nodes[w].clone());
                    if w == v {
                        break;
                    }
                }
                out.push(comp);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    fn report(krate: &str) -> Vec<BTreeSet<String>> {
        let g = graph(&workspace().join(krate).join("src"));
        assert!(g.len() > 5, "{krate}: read {} files", g.len());
        let l = loops(&g);
        println!(
            "{krate}: {} files, {} imports, {} loops {l:?}",
            g.len(),
            g.values().map(BTreeSet::len).sum::<usize>(),
            l.len()
        );
        l
    }

    #[test]
    fn use_trees_and_inline_paths_are_read_and_resolved() {
        let text = "use crate::a::{b::{C, d}, e as f};\nuse super::g::*;\n// use crate::x;\n\
                    fn h() { crate::i::j(); self::k::L; }\n#[cfg(test)]\nmod tests { use crate::m; }\n";
        let got = paths(text, None);
        let want: Vec<Vec<String>> = [
            &["crate", "a", "b", "C"][..],
            &["crate", "a", "b", "d"],
            &["crate", "a", "e"],
            &["super", "g"],
            &["crate", "i", "j"],
            &["self", "k", "L"],
        ]
        .iter()
        .map(|p| p.iter().map(|s| s.to_string()).collect())
        .collect();
        assert_eq!(got, want);
        let files: BTreeMap<ModPath, PathBuf> =
            [vec![], vec!["a".into()], vec!["a".into(), "b".into()]]
                .into_iter()
                .map(|m| (m, PathBuf::new()))
                .collect();
        let from = vec!["a".to_string(), "b".to_string()];
        let r = |p: &[&str]| {
            resolve(
                &from,
                &p.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                &files,
            )
        };
        assert_eq!(r(&["super", "X"]), Some(vec!["a".to_string()]));
        assert_eq!(r(&["crate", "a", "b", "c", "D"]), Some(from.clone()));
        assert_eq!(r(&["crate", "z"]), Some(vec![]));
        assert_eq!(r(&["std", "x"]), None);
    }

    #[test]
    fn a_loop_is_found_and_a_chain_is_not() {
        let m = |s: &str| vec![s.to_string()];
        let mut g: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
        g.insert(m("a"), [m("b")].into());
        g.insert(m("b"), [m("c")].into());
        g.insert(m("c"), BTreeSet::new());
        assert!(loops(&g).is_empty());
        g.insert(m("c"), [m("a")].into());
        assert_eq!(loops(&g), vec![["a", "b", "c"].map(String::from).into()]);
    }

    #[test]
    fn the_agent_protocol_and_harness_have_no_import_loops() {
        for krate in ["agent", "protocol", "tests"] {
            assert_eq!(report(krate), Vec::<BTreeSet<String>>::new(), "{krate}");
        }
    }

    /// The controller's layers, bottom first: each file imports only files of its own layer or
    /// below. The domains sit on the shared context, each on those it uses; the `Controller`
    /// wires them; the surfaces and the program sit on top.
    const CONTROLLER_LAYERS: &[&[&str]] = &[
        &[
            "util",
            "error",
            "lifecycle",
            "seal",
            "config",
            "catalog",
            "limits",
            "atif",
            "metrics",
            "store",
            "egress",
            "provider",
            "image",
            "reconcile",
            "warm",
            "login/sites",
        ],
        &["ctx"],
        &[
            "timeline",
            "viewer",
            "session",
            "image_job",
            "control",
            "login",
        ],
        &["sandbox"],
        &["pool", "lease", "artifact", "workpiece"],
        &["run", "episode", "panes"],
        &["follow", "github"],
        &["recovery"],
        &["controller"],
        &["http", "api", "mcp", "serve"],
        &["cli", "verify", "deploy_manifests", "<root>"],
    ];

    #[test]
    fn the_controller_has_no_import_loop_and_no_import_runs_upward() {
        assert_eq!(report("controller"), Vec::<BTreeSet<String>>::new());
        let g = graph(&workspace().join("controller/src"));
        let (up, unplaced) = upward(&g, CONTROLLER_LAYERS);
        println!(
            "controller: {} imports run upward, {} files unplaced",
            up.len(),
            unplaced.len()
        );
        assert_eq!(
            unplaced,
            Vec::<String>::new(),
            "files the layer order does not place"
        );
        assert_eq!(up, Vec::<(String, String)>::new(), "imports running upward");
    }

    #[test]
    fn a_layer_is_found_by_its_longest_prefix_and_an_upward_import_is_named() {
        let m = |s: &str| -> ModPath { s.split('/').map(String::from).collect() };
        let layers: &[&[&str]] = &[&["store", "a/b"], &["a"], &["<root>"]];
        assert_eq!(layer_of(&m("store/runs"), layers), Some(0));
        assert_eq!(layer_of(&m("a/b"), layers), Some(0));
        assert_eq!(layer_of(&m("a/c"), layers), Some(1));
        assert_eq!(layer_of(&vec![], layers), Some(2));
        assert_eq!(layer_of(&m("z"), layers), None);
        let mut g: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
        g.insert(m("a"), [m("store")].into());
        g.insert(m("store"), [m("a")].into());
        g.insert(m("z"), BTreeSet::new());
        let (up, unplaced) = upward(&g, layers);
        assert_eq!(up, vec![("store".to_string(), "a".to_string())]);
        assert_eq!(unplaced, vec!["z".to_string()]);
    }
}
