//! How long each function of a crate is, measured on its syntax tree (`syn`): the lines from its
//! `fn` to its closing brace. Test code (`#[cfg(test)]` modules and items, `#[test]` functions)
//! does not count; a function nested in another counts on its own and inside its parent.

use std::path::{Path, PathBuf};
use syn::spanned::Spanned;
use syn::visit::Visit;

/// One function as measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Function {
    /// The file, relative to the directory measured.
    pub file: PathBuf,
    /// `name`, or `Type::name` in an impl or trait.
    pub name: String,
    /// The line of its `fn`.
    pub line: usize,
    /// Lines from its `fn` to its closing brace, both included.
    pub lines: usize,
}

impl Function {
    /// `file::Type::name` with `/` in the file's path, as the reports write it.
    pub fn path(&self) -> String {
        format!("{}::{}", self.file.display(), self.name)
    }
}

/// Every function with a body in the Rust files under `dir`, longest first. A file declared as
/// a test module (`#[cfg(test)] mod tests;`) is test code and is skipped.
pub fn functions(dir: &Path) -> Vec<Function> {
    let mut sources = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).expect("read a source file");
                let rel = p.strip_prefix(dir).expect("under dir").to_path_buf();
                sources.push((rel, text));
            }
        }
    }
    let measured: Vec<(PathBuf, Collect)> = sources
        .iter()
        .map(|(rel, text)| (rel.clone(), collect(text, rel)))
        .collect();
    let test_files: Vec<PathBuf> = measured
        .iter()
        .flat_map(|(rel, c)| c.test_mods.iter().flat_map(|m| module_files(rel, m)))
        .collect();
    let mut out: Vec<Function> = measured
        .into_iter()
        .filter(|(rel, _)| !test_files.iter().any(|t| rel.starts_with(t) || rel == t))
        .flat_map(|(_, c)| c.out)
        .collect();
    out.sort_by(|a, b| b.lines.cmp(&a.lines).then_with(|| a.path().cmp(&b.path())));
    out
}

/// Where the module `name` declared in `file` may live: `name.rs` and the directory `name/`,
/// beside `file` when it is a `lib.rs`, `main.rs` or `mod.rs`, else in the directory named
/// after it.
fn module_files(file: &Path, name: &str) -> [PathBuf; 2] {
    let stem = file.file_stem().unwrap_or_default();
    let dir = match file.parent() {
        Some(p) if ["lib", "main", "mod"].iter().any(|s| stem == *s) => p.to_path_buf(),
        Some(p) => p.join(stem),
        None => PathBuf::new(),
    };
    [dir.join(format!("{name}.rs")), dir.join(name)]
}

/// Every function with a body in one source text.
pub fn in_source(text: &str, file: &Path) -> Vec<Function> {
    collect(text, file).out
}

fn collect(text: &str, file: &Path) -> Collect {
    let syntax = syn::parse_file(text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let mut v = Collect {
        file: file.to_path_buf(),
        owner: Vec::new(),
        out: Vec::new(),
        test_mods: Vec::new(),
    };
    v.visit_file(&syntax);
    v
}

struct Collect {
    file: PathBuf,
    owner: Vec<String>,
    out: Vec<Function>,
    /// Test modules declared here whose code is in their own file.
    test_mods: Vec<String>,
}

/// `#[test]`, `#[tokio::test]`, `#[cfg(test)]`: the item is test code.
fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        let p = a.path();
        if p.segments.last().is_some_and(|s| s.ident == "test") {
            return true;
        }
        p.is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

impl Collect {
    fn record(&mut self, name: String, start: proc_macro2::Span, end: proc_macro2::Span) {
        let line = start.start().line;
        self.out.push(Function {
            file: self.file.clone(),
            name,
            line,
            lines: end.end().line + 1 - line,
        });
    }

    fn named(&self, ident: &syn::Ident) -> String {
        match self.owner.last() {
            Some(o) => format!("{o}::{ident}"),
            None => ident.to_string(),
        }
    }
}

impl<'ast> Visit<'ast> for Collect {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        } else if m.content.is_none() {
            self.test_mods.push(m.ident.to_string());
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if is_test(&f.attrs) {
            return;
        }
        let name = self.named(&f.sig.ident);
        self.record(name, f.sig.fn_token.span, f.block.span());
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if is_test(&i.attrs) {
            return;
        }
        let ty = match &*i.self_ty {
            syn::Type::Path(p) => p
                .path
                .segments
                .last()
                .map(|s| s.ident.to_string())
                .unwrap_or_default(),
            _ => "_".to_string(),
        };
        self.owner.push(ty);
        syn::visit::visit_item_impl(self, i);
        self.owner.pop();
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if is_test(&f.attrs) {
            return;
        }
        let name = self.named(&f.sig.ident);
        self.record(name, f.sig.fn_token.span, f.block.span());
        syn::visit::visit_impl_item_fn(self, f);
    }

    fn visit_item_trait(&mut self, t: &'ast syn::ItemTrait) {
        if is_test(&t.attrs) {
            return;
        }
        self.owner.push(t.ident.to_string());
        syn::visit::visit_item_trait(self, t);
        self.owner.pop();
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(body) = &f.default
            && !is_test(&f.attrs)
        {
            let name = self.named(&f.sig.ident);
            self.record(name, f.sig.fn_token.span, body.span());
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The longest a function may be, in lines from its `fn` to its closing brace.
    const LIMIT: usize = 80;

    /// Functions that are data written out (a table, a document), not steps; each with why.
    const TABLES: &[(&str, &str)] = &[];

    #[test]
    fn a_function_is_measured_from_its_fn_to_its_brace_and_test_code_is_not() {
        let text = "/// doc\n#[inline]\npub fn a() {\n    1;\n}\n\
                    struct S;\nimpl S {\n    fn b(&self) {\n        fn c() {}\n    }\n}\n\
                    trait T { fn d() {} fn e(); }\n\
                    #[test]\nfn t() {}\n#[cfg(test)]\nmod tests { fn u() {} }\n";
        let got: Vec<(String, usize, usize)> = in_source(text, Path::new("f.rs"))
            .into_iter()
            .map(|f| (f.name, f.line, f.lines))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a".to_string(), 3, 3),
                ("S::b".to_string(), 8, 3),
                ("S::c".to_string(), 9, 1),
                ("T::d".to_string(), 12, 1),
            ]
        );
    }

    #[test]
    fn a_test_module_in_its_own_file_is_test_code() {
        let f = |p: &str, m: &str| module_files(Path::new(p), m);
        assert_eq!(f("lib.rs", "tests")[0], Path::new("tests.rs"));
        assert_eq!(f("a/mod.rs", "tests")[1], Path::new("a/tests"));
        assert_eq!(f("a/b.rs", "tests")[0], Path::new("a/b/tests.rs"));
        let c = collect("#[cfg(test)]\nmod tests;\nmod real;\n", Path::new("x.rs"));
        assert_eq!(c.test_mods, vec!["tests".to_string()]);
    }

    #[test]
    fn no_function_is_longer_than_the_limit() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut over = Vec::new();
        let mut total = 0;
        for krate in ["agent", "controller", "protocol", "tests"] {
            let all = functions(&root.join(krate).join("src"));
            total += all.len();
            for f in all {
                let path = format!("{krate}/src/{}", f.path());
                if f.lines > LIMIT && !TABLES.iter().any(|(t, _)| *t == path) {
                    over.push(format!("{path} (line {}): {} lines", f.line, f.lines));
                }
            }
        }
        println!("{total} functions, {} over {LIMIT} lines", over.len());
        for o in &over {
            println!("  {o}");
        }
        assert!(
            over.is_empty(),
            "{} functions over {LIMIT} lines",
            over.len()
        );
    }
}
