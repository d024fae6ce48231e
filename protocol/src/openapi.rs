//! OpenAPI 3.1 documents of both APIs, served at `GET /openapi.json`: the agent's (native `/v1`
//! and the OSWorld-compatible surface) and the controller's.
//!
//! Generated from the operation tables ([`crate::ops`]), the bodies' schemas from the
//! protocol's wire types (`schemars`, JSON Schema 2020-12, which OpenAPI 3.1 uses).

use schemars::SchemaGenerator;
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use crate::ops::{self, Answer, Content, Document, Documented, ERROR, Operation};

/// The OpenAPI version the documents declare.
pub const OPENAPI_VERSION: &str = "3.1.0";

/// The agent's document: native `/v1` (bearer token; the (V) routes also take the viewer
/// cookie) and the OSWorld-compatible surface at root paths.
pub fn agent() -> Value {
    document(&ops::AGENT)
}

/// The controller's document.
pub fn controller() -> Value {
    document(&ops::CONTROLLER)
}

/// The agent's document as JSON text, built once (what `GET /openapi.json` answers).
pub fn agent_json() -> &'static str {
    static DOC: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DOC.get_or_init(|| agent().to_string())
}

/// The controller's document as JSON text, built once.
pub fn controller_json() -> &'static str {
    static DOC: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DOC.get_or_init(|| controller().to_string())
}

/// An axum path template as OpenAPI writes it: `{*path}` becomes `{path}`.
pub fn openapi_path(template: &str) -> String {
    template.replace("{*", "{")
}

/// A document's OpenAPI form.
pub fn document(doc: &Document) -> Value {
    let mut g = SchemaSettings::draft2020_12()
        .with(|s| {
            s.definitions_path = "/components/schemas".into();
            s.meta_schema = None;
        })
        .into_generator();
    let mut paths = Map::new();
    for op in doc.operations() {
        for form in op.documented() {
            let item = paths
                .entry(openapi_path(op.path))
                .or_insert_with(|| json!({}));
            item[form.method.as_str()] = operation(&mut g, op, &form);
        }
    }
    let schemas: Map<String, Value> = g.take_definitions(true);
    json!({
        "openapi": OPENAPI_VERSION,
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "info": {
            "title": doc.title,
            "version": env!("CARGO_PKG_VERSION"),
            "description": doc.description,
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": (doc.security_schemes)(),
        },
    })
}

/// One method of an operation.
fn operation(g: &mut SchemaGenerator, op: &Operation, form: &Documented) -> Value {
    let mut parameters = path_parameters(op.path);
    for p in op.query {
        parameters.push(
            json!({"name": p.name, "in": "query", "required": p.required,
                               "schema": (p.schema)(g), "description": p.description}),
        );
    }
    let mut responses = Map::new();
    for a in &form.answers {
        responses.insert(a.status.into(), answer(g, a));
    }
    if op.native_errors {
        let mut common = vec![
            ("400", "bad input"),
            ("404", "unknown id or path"),
            ("default", "an error"),
        ];
        if !op.is_open() {
            common.push(("401", "missing or wrong credentials"));
        }
        for (status, description) in common {
            if !responses.contains_key(status) {
                let a = Answer::json(status, description, ERROR);
                responses.insert(status.into(), answer(g, &a));
            }
        }
    }
    // Any one of the credentials admits it; `{}` is none needed.
    let security: Vec<Value> = op
        .security
        .iter()
        .map(|s| match *s {
            "" => json!({}),
            name => json!({ name: [] }),
        })
        .collect();
    let mut o = json!({
        "operationId": form.id,
        "summary": op.summary,
        "parameters": parameters,
        "responses": responses,
        "security": security,
    });
    if let Some(b) = form.body {
        o["requestBody"] = json!({"required": b.required,
                                  "content": {b.content_type: {"schema": (b.schema)(g)}}});
    }
    if let Some(tag) = op.tag {
        o["tags"] = json!([tag]);
    }
    o
}

/// The `{name}` segments of a path (a `{port}` is a TCP port).
fn path_parameters(path: &str) -> Vec<Value> {
    let mut params = Vec::new();
    for seg in path.split('/') {
        let Some(name) = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) else {
            continue;
        };
        let rest = name.starts_with('*');
        let name = name.trim_start_matches('*');
        let schema = match name {
            "port" => json!({"type": "integer", "minimum": 1, "maximum": 65535}),
            _ => json!({"type": "string", "minLength": 1}),
        };
        let mut p = json!({"name": name, "in": "path", "required": true, "schema": schema});
        if rest {
            p["description"] = "the rest of the path (may contain `/`)".into();
        }
        params.push(p);
    }
    params
}

fn answer(g: &mut SchemaGenerator, a: &Answer) -> Value {
    let mut r = json!({"description": a.description});
    let content: Map<String, Value> = match a.content {
        Content::None => Map::new(),
        Content::Json(schema) => [("application/json".to_string(), json!({"schema": schema(g)}))]
            .into_iter()
            .collect(),
        Content::Media(media) => media
            .iter()
            .map(|(ty, schema)| (ty.to_string(), json!({"schema": schema(g)})))
            .collect(),
    };
    if !content.is_empty() {
        r["content"] = Value::Object(content);
    }
    if !a.headers.is_empty() {
        let headers: Map<String, Value> = a
            .headers
            .iter()
            .map(|(name, schema)| (name.to_string(), json!({"schema": schema(g)})))
            .collect();
        r["headers"] = Value::Object(headers);
    }
    r
}

/// One method and OpenAPI path of a document, for checks and tests.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Listed {
    pub method: String,
    pub path: String,
}

/// Every method and path a document lists.
pub fn operations(doc: &Value) -> Vec<Listed> {
    let mut out = Vec::new();
    if let Some(paths) = doc["paths"].as_object() {
        for (path, item) in paths {
            for method in item.as_object().into_iter().flat_map(|m| m.keys()) {
                out.push(Listed {
                    method: method.clone(),
                    path: path.clone(),
                });
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Every `$ref` in a document points at a schema it carries.
    fn check_refs(doc: &Value, at: &str) {
        match doc {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    let name = r
                        .strip_prefix("#/components/schemas/")
                        .unwrap_or_else(|| panic!("{at}: $ref {r} is not a component"));
                    let root = DOCS.with(|d| d.borrow().clone());
                    assert!(
                        root["components"]["schemas"].get(name).is_some(),
                        "{at}: $ref {r} is missing"
                    );
                }
                for (k, v) in m {
                    check_refs(v, &format!("{at}/{k}"));
                }
            }
            Value::Array(a) => a.iter().for_each(|v| check_refs(v, at)),
            _ => {}
        }
    }

    thread_local! {
        static DOCS: std::cell::RefCell<Value> = const { std::cell::RefCell::new(Value::Null) };
    }

    fn well_formed(doc: &Value) {
        assert_eq!(doc["openapi"], OPENAPI_VERSION);
        DOCS.with(|d| *d.borrow_mut() = doc.clone());
        check_refs(doc, "#");
        let mut ids = BTreeSet::new();
        for o in operations(doc) {
            let item = &doc["paths"][&o.path][&o.method];
            let id = item["operationId"].as_str().expect("operationId");
            assert!(ids.insert(id.to_string()), "operationId {id} twice");
            assert!(
                item["responses"].as_object().is_some_and(|r| !r.is_empty()),
                "{} {} has no responses",
                o.method,
                o.path
            );
            // Every `{name}` of the path is a declared path parameter.
            let declared: BTreeSet<&str> = item["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|p| p["in"] == "path")
                .filter_map(|p| p["name"].as_str())
                .collect();
            for seg in o.path.split('/') {
                if let Some(n) = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                    assert!(
                        declared.contains(n),
                        "{} {}: {n} undeclared",
                        o.method,
                        o.path
                    );
                }
            }
        }
        println!(
            "{} operations, {} schemas",
            ids.len(),
            doc["components"]["schemas"].as_object().unwrap().len()
        );
    }

    #[test]
    fn documents_are_well_formed() {
        well_formed(&agent());
        well_formed(&controller());
        // The error body is generated from the wire type, not written by hand.
        let doc = agent();
        let e = &doc["components"]["schemas"]["ErrorBody"];
        assert_eq!(e["required"], json!(["error"]), "{e}");
        let detail = &doc["components"]["schemas"]["ErrorDetail"];
        assert_eq!(detail["properties"]["code"]["type"], "string");
    }
}
