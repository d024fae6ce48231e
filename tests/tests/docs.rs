//! The README and the book (`docs/`, mdBook) as CI keeps them: the README stays a front page with
//! the two commands first; every relative link lands on a file and, with a `#fragment`, on one of
//! its headings (as mdBook and GitHub make their ids); every chapter is in the summary; every
//! fenced block names its language and none is Rust (so `mdbook test` has nothing to compile);
//! `mdbook build docs` succeeds without a warning; and the CLI reference is the CLI's own `--help`
//! (`BERTH_BLESS=1` rewrites it).

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use pulldown_cmark::{CodeBlockKind, Event, Options, Parser, Tag, TagEnd};

/// The workspace's root, where README.md and docs/ are.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// README.md and every Markdown file under docs/src, as paths from the root, sorted.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = vec![root().join("README.md")];
    walk(&root().join("docs/src"), &mut out);
    out.sort();
    out.into_iter()
        .map(|p| p.strip_prefix(root()).unwrap().to_path_buf())
        .collect()
}

fn read(page: &Path) -> String {
    std::fs::read_to_string(root().join(page)).unwrap_or_else(|e| panic!("{}: {e}", page.display()))
}

/// The Markdown extensions both mdBook and GitHub render with.
fn parser(text: &str) -> Parser<'_> {
    Parser::new_ext(
        text,
        Options::ENABLE_TABLES
            | Options::ENABLE_FOOTNOTES
            | Options::ENABLE_STRIKETHROUGH
            | Options::ENABLE_TASKLISTS
            | Options::ENABLE_HEADING_ATTRIBUTES,
    )
}

/// A heading's id from its text, as mdBook 0.5 makes it (`id_from_content`: trimmed, lowercased,
/// letters, digits, `-` and `_` kept, whitespace made `-`, the rest dropped). GitHub's rule gives
/// the same for this book's headings: it differs only on whitespace other than spaces.
fn heading_id(text: &str) -> String {
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            c if c.is_whitespace() => Some('-'),
            _ => None,
        })
        .collect()
}

/// The ids of a page's headings, a repeated one suffixed `-1`, `-2`, … as both renderers do.
fn heading_ids(text: &str) -> HashSet<String> {
    let mut ids = HashSet::new();
    let mut heading: Option<(Option<String>, String)> = None;
    for event in parser(text) {
        match event {
            Event::Start(Tag::Heading { id, .. }) => {
                heading = Some((id.map(|i| i.to_string()), String::new()))
            }
            Event::Text(t) | Event::Code(t) => {
                if let Some((_, s)) = heading.as_mut() {
                    s.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let (given, text) = heading.take().unwrap();
                let id = given.unwrap_or_else(|| heading_id(&text));
                let mut unique = id.clone();
                let mut n = 0;
                while !ids.insert(unique.clone()) {
                    n += 1;
                    unique = format!("{id}-{n}");
                }
            }
            _ => {}
        }
    }
    ids
}

/// `base`'s directory joined with `rel`, `..` applied; None when it climbs out of the root.
fn resolve(base: &Path, rel: &str) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in base.parent().unwrap().join(rel).components() {
        match part {
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

/// What is wrong with one link of `page`, if anything.
fn check_link(page: &Path, dest: &str) -> Option<String> {
    if let Some(rest) = dest
        .strip_prefix("https://")
        .or_else(|| dest.strip_prefix("http://"))
    {
        // Not fetched (no network here): only its form.
        let ok = reqwest::Url::parse(dest)
            .is_ok_and(|u| u.host_str().is_some_and(|h| h.contains('.')))
            && !rest.contains(' ');
        return (!ok).then(|| format!("a malformed URL {dest:?}"));
    }
    if dest.starts_with("mailto:") {
        return (!dest.contains('@')).then(|| format!("a malformed address {dest:?}"));
    }
    if dest.split(['/', '#']).next().unwrap_or("").contains(':') {
        return Some(format!("a link of an unknown scheme {dest:?}"));
    }
    let (path, fragment) = dest.split_once('#').unwrap_or((dest, ""));
    let target = if path.is_empty() {
        page.to_path_buf()
    } else {
        match resolve(page, path) {
            Some(t) => t,
            None => return Some(format!("{dest:?} leaves the repository")),
        }
    };
    if !root().join(&target).exists() {
        return Some(format!("{dest:?}: no file {}", target.display()));
    }
    // mdBook renders a chapter's link to another chapter as .html: one to a Markdown file outside
    // the book would be a page the rendered book does not have.
    if page.starts_with("docs/src")
        && target.extension().is_some_and(|e| e == "md")
        && !target.starts_with("docs/src")
    {
        return Some(format!("{dest:?}: a page the rendered book does not have"));
    }
    if fragment.is_empty() {
        return None;
    }
    if target.extension().is_none_or(|e| e != "md") {
        return Some(format!(
            "{dest:?}: a fragment of a file that is not Markdown"
        ));
    }
    (!heading_ids(&read(&target)).contains(fragment))
        .then(|| format!("{dest:?}: {} has no heading #{fragment}", target.display()))
}

/// What is wrong with an mdBook `{{#include path[:anchor]}}` of `page`, if anything.
fn check_include(page: &Path, directive: &str) -> Option<String> {
    let (path, anchor) = directive.split_once(':').unwrap_or((directive, ""));
    let Some(target) = resolve(page, path).filter(|t| root().join(t).is_file()) else {
        return Some(format!("includes {path:?}, which is no file"));
    };
    if anchor.is_empty() {
        return None;
    }
    let text = read(&target);
    let marked = text.contains(&format!("ANCHOR: {anchor} "))
        && text.contains(&format!("ANCHOR_END: {anchor} "));
    (!marked).then(|| {
        format!(
            "includes {directive:?}: {} marks no such anchor",
            target.display()
        )
    })
}

#[test]
fn every_relative_link_lands_on_a_file_and_a_heading() {
    let mut broken = Vec::new();
    let mut links = 0;
    for page in pages() {
        let text = read(&page);
        for event in parser(&text) {
            if let Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) = event {
                links += 1;
                if let Some(why) = check_link(&page, &dest_url) {
                    broken.push(format!("{}: {why}", page.display()));
                }
            }
        }
        for directive in text.split("{{#include ").skip(1) {
            let directive = directive.split("}}").next().unwrap().trim();
            if let Some(why) = check_include(&page, directive) {
                broken.push(format!("{}: {why}", page.display()));
            }
        }
    }
    assert!(links > 100, "only {links} links: the pages were not read");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_chapter_is_in_the_summary() {
    let summary = Path::new("docs/src/SUMMARY.md");
    let text = read(summary);
    let listed: HashSet<PathBuf> = parser(&text)
        .filter_map(|e| match e {
            Event::Start(Tag::Link { dest_url, .. }) => resolve(summary, &dest_url),
            _ => None,
        })
        .collect();
    let left_out: Vec<_> = pages()
        .into_iter()
        .filter(|p| p.starts_with("docs/src") && p != summary && !listed.contains(p))
        .collect();
    assert!(left_out.is_empty(), "not in SUMMARY.md: {left_out:?}");
}

#[test]
fn every_fenced_block_names_its_language_and_none_is_rust() {
    let mut bad = Vec::new();
    for page in pages() {
        let text = read(&page);
        for event in parser(&text) {
            if let Event::Start(Tag::CodeBlock(kind)) = event {
                let lang = match &kind {
                    CodeBlockKind::Fenced(info) => info.split([',', ' ']).next().unwrap_or(""),
                    CodeBlockKind::Indented => "",
                };
                // mdBook tests a block without a language as Rust.
                if lang.is_empty() || lang == "rust" {
                    bad.push(format!("{}: a block of language {lang:?}", page.display()));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The blocks the suites run as written (quickstart, engines, workpieces, session_control) are
/// where those suites read them: a block moved or its marker lost fails here, in a second,
/// rather than in a suite that needs a desktop.
#[test]
fn the_examples_the_suites_run_are_where_they_read_them() {
    use berth_tests::readme::{block, chapter, section};
    let quickstart = section("Quick start: the gateway API");
    assert!(block(quickstart, "sh", None).contains("berth serve --listen 127.0.0.1:8780"));
    assert!(block(quickstart, "sh", Some("quickstart")).contains("/viewer"));
    let engines = chapter("engines.md");
    assert!(block(engines, "sh", Some("engines")).contains("/computer"));
    assert!(block(engines, "python", Some("engines-mcp")).contains("ClientSession"));
    assert!(block(engines, "python", Some("engines-toolset")).contains("ComputerToolset"));
    let workpieces = chapter("controller/workpieces.md");
    assert!(block(workpieces, "python", Some("workpieces-mcp")).contains("workpiece_"));
    let control = chapter("controller/session-control.md");
    assert!(block(control, "sh", Some("control-curl")).contains("$URL"));
}

#[test]
fn the_readme_is_a_front_page_with_the_two_commands_first() {
    let readme = read(Path::new("README.md"));
    let lines = readme.lines().count();
    assert!(
        (150..=250).contains(&lines),
        "README.md has {lines} lines; the reference belongs in the book"
    );
    let first = berth_tests::readme::block(&readme, "sh", None);
    assert!(
        first.starts_with("./tests/demo.sh") && first.contains("\n./tests/test.sh"),
        "the README's first block is the two commands: {first}"
    );
    assert!(readme.contains("\n## Quick start: the gateway API\n"));
}

/// The README's headline figures are the book's: every number of its Figures table is one the
/// benchmarks chapter (or, for the fresh-clone run, getting started) states, so a new run that
/// changes a table and forgets the front page fails here.
#[test]
fn the_readme_figures_are_the_books() {
    let readme = read(Path::new("README.md"));
    let table = readme
        .split("\n## Figures\n")
        .nth(1)
        .expect("the README has a Figures section")
        .split("\n## ")
        .next()
        .unwrap();
    let book =
        read(Path::new("docs/src/benchmarks.md")) + &read(Path::new("docs/src/getting-started.md"));
    let mut numbers = 0;
    for row in table
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| measurement"))
    {
        for number in row
            .split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .map(|n| n.trim_matches('.'))
            .filter(|n| n.chars().any(|c| c.is_ascii_digit()))
        {
            numbers += 1;
            assert!(
                book.contains(number),
                "the README's figure {number} is in no chapter: {row}"
            );
        }
    }
    assert!(numbers >= 20, "only {numbers} figures read: {table}");
}

#[test]
fn the_book_builds_with_mdbook_without_a_warning() {
    let Ok(version) = Command::new("mdbook").arg("--version").output() else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "mdbook is missing (tests/setup.sh installs it)"
        );
        eprintln!("mdbook is not installed: the book is not built (tests/setup.sh installs it)");
        return;
    };
    eprintln!("{}", String::from_utf8_lossy(&version.stdout).trim());
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new("mdbook")
        .arg("build")
        .arg(root().join("docs"))
        .arg("--dest-dir")
        .arg(out_dir.path())
        .output()
        .unwrap();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "mdbook build docs failed:\n{log}");
    assert!(
        !log.contains("WARN") && !log.contains("ERROR"),
        "mdbook build docs warned:\n{log}"
    );
    // The included quick start is the README's, and no directive is left unexpanded.
    let started = std::fs::read_to_string(out_dir.path().join("getting-started.html")).unwrap();
    assert!(started.contains("SANDBOX_GATEWAY_URL=http://localhost:8780"));
    for page in pages().iter().filter(|p| p.starts_with("docs/src")) {
        let html = page
            .strip_prefix("docs/src")
            .unwrap()
            .with_extension("html");
        if html.ends_with("SUMMARY.html") {
            continue;
        }
        let text = std::fs::read_to_string(out_dir.path().join(&html))
            .unwrap_or_else(|e| panic!("{}: {e}", html.display()));
        assert!(
            !text.contains("{{#"),
            "{}: a directive left",
            html.display()
        );
    }
}

/// `program args… --help` with no `BERTH_*` or `SANDBOX_*` variable (clap shows an env
/// variable's value when it is set), and the subcommands its `Commands:` list names.
fn help(program: &Path, args: &[String]) -> (String, Vec<String>) {
    let mut cmd = Command::new(program);
    cmd.args(args).arg("--help");
    for (k, _) in std::env::vars() {
        if k.starts_with("BERTH_") || k.starts_with("SANDBOX_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd.output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{args:?} --help: {text}");
    let subcommands = text
        .split("\nCommands:\n")
        .nth(1)
        .map(|list| {
            list.lines()
                .take_while(|l| !l.is_empty())
                .filter_map(|l| l.strip_prefix("  "))
                .filter(|l| !l.starts_with(' '))
                .filter_map(|l| l.split_whitespace().next())
                .filter(|name| *name != "help")
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    (text, subcommands)
}

/// The CLI chapter as the binaries print their help: `berth`, every subcommand depth first, then
/// `berth-agent` and its subcommands.
fn cli_chapter() -> String {
    let mut text = String::from(
        "# CLI reference\n\n\
         The usage of `berth` and `berth-agent`, and of every subcommand, as their `--help` prints\n\
         it. `tests/tests/docs.rs` compares this page with the binaries' output on every run; after\n\
         a change to the command line,\n\
         `BERTH_BLESS=1 cargo nextest run -p berth-tests -E 'test(/^docs::/)'` rewrites it. What the\n\
         commands do is in [berth (the controller)](controller/index.md) and\n\
         [berth-agent](agent/index.md).\n",
    );
    for name in ["berth", "berth-agent"] {
        let program = berth_tests::workspace_bin(name);
        let mut todo = vec![Vec::<String>::new()];
        while let Some(args) = todo.pop() {
            let (usage, subcommands) = help(&program, &args);
            let title = std::iter::once(name.to_string())
                .chain(args.iter().cloned())
                .collect::<Vec<_>>()
                .join(" ");
            // clap indents the blank lines inside an option's help: trailing spaces dropped.
            let usage: Vec<&str> = usage.trim_end().lines().map(str::trim_end).collect();
            let usage = usage.join("\n");
            text.push_str(&format!("\n## `{title}`\n\n```text\n{usage}\n```\n"));
            for sub in subcommands.into_iter().rev() {
                let mut next = args.clone();
                next.push(sub);
                todo.push(next);
            }
        }
    }
    text
}

#[test]
fn the_cli_chapter_is_the_clis_own_help() {
    let path = root().join("docs/src/cli.md");
    let generated = cli_chapter();
    if std::env::var_os("BERTH_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap();
    if committed != generated {
        let differs = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(generated.lines().count()));
        panic!(
            "docs/src/cli.md is not the CLI's --help from line {} on: `{}` where the binaries \
             print `{}` (BERTH_BLESS=1 rewrites it)",
            differs + 1,
            committed.lines().nth(differs).unwrap_or(""),
            generated.lines().nth(differs).unwrap_or("")
        );
    }
}
