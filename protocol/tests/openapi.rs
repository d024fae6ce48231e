//! The generated OpenAPI documents against their committed copies (`tests/openapi/*.json`),
//! byte for byte as pretty JSON: a change to a document is a change to a file in review.
//! `BERTH_BLESS=1 cargo test -p berth-protocol --test openapi` rewrites the copies.

use std::path::PathBuf;

use serde_json::Value;

fn pretty(doc: &Value) -> String {
    let mut text = serde_json::to_string_pretty(doc).unwrap();
    text.push('\n');
    text
}

fn golden(name: &str, mut doc: Value) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/openapi/{name}.json"));
    if std::env::var_os("BERTH_BLESS").is_some() {
        std::fs::write(&path, pretty(&doc)).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (BERTH_BLESS=1 writes it)", path.display()));
    // The version is the crate's: a release changes no document's content.
    let committed: Value = serde_json::from_str(&want).unwrap();
    doc["info"]["version"] = committed["info"]["version"].clone();
    let text = pretty(&doc);
    if text != want {
        let line = text
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(text.lines().count().min(want.lines().count()));
        panic!(
            "the {name} document differs from {} at line {}: generated {:?}, committed {:?}",
            path.display(),
            line + 1,
            text.lines().nth(line),
            want.lines().nth(line),
        );
    }
}

#[test]
fn agent_document_is_the_committed_one() {
    golden("agent", berth_protocol::openapi::agent());
}

#[test]
fn controller_document_is_the_committed_one() {
    golden("controller", berth_protocol::openapi::controller());
}
