//! Every operation of the wire, written once: its method, path (from [`crate::routes`]),
//! operationId, summary, tag, security, query parameters, request body and answers.
//!
//! The OpenAPI documents are generated from these tables ([`crate::openapi`]), and with the
//! `server` feature the routers bind their handlers to them ([`Routes`]): a route is served by
//! naming its operation, and a router is checked to serve exactly its document's operations.
//! Schemas are functions of the document's schema generator, so an operation names a wire
//! type (`schema::<ExecRequest>`) or an inline shape (`fn deleted(..) -> Value`) alike.

pub mod compat;
pub mod controller;
pub mod native;
#[cfg(feature = "server")]
mod router;

#[cfg(feature = "server")]
pub use router::Routes;

use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{Value, json};

use crate::ErrorBody;

/// An OpenAPI document: its title, description, credentials and operations.
#[derive(Debug, Clone, Copy)]
pub struct Document {
    pub title: &'static str,
    pub description: &'static str,
    /// `components/securitySchemes`.
    pub security_schemes: fn() -> Value,
    /// Its surfaces' operations, in the order it lists them.
    pub surfaces: &'static [&'static [&'static Operation]],
}

impl Document {
    pub fn operations(&self) -> impl Iterator<Item = &'static Operation> + use<> {
        let surfaces = self.surfaces;
        surfaces.iter().flat_map(|s| s.iter().copied())
    }
}

/// The agent's: native `/v1` (with health, this document, preview and MCP), bearer token, and
/// the OSWorld-compatible surface at root paths.
pub const AGENT: Document = Document {
    title: "berth agent",
    description: "The guest agent: the native API under /v1 (bearer token) and the \
                  OSWorld-compatible surface at root paths.",
    security_schemes: native::security_schemes,
    surfaces: &[native::ALL, compat::ALL],
};

/// The controller's.
pub const CONTROLLER: Document = Document {
    title: "berth controller",
    description: "Sandboxes, runs, leases, images, the catalog and warm pools; \
                  X-Api-Key on every route but health, metrics, this document and \
                  the viewer's (which also take the viewer cookie).",
    security_schemes: controller::security_schemes,
    surfaces: &[controller::ALL],
};

/// A body's schema, generated into the document's `components/schemas` as need be.
pub type Schema = fn(&mut SchemaGenerator) -> Value;

/// The schema of a wire type: a `$ref` to it under `components/schemas` (the deserializing
/// contract: a field a reader defaults is optional).
pub fn schema<T: JsonSchema>(g: &mut SchemaGenerator) -> Value {
    g.subschema_for::<T>().to_value()
}

/// The native error body, `{"error": {"code", "message"}}`.
pub const ERROR: Schema = schema::<ErrorBody>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Method {
    Get,
    Post,
    Put,
    Delete,
}

impl Method {
    /// As OpenAPI writes it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Method::Get => "get",
            Method::Post => "post",
            Method::Put => "put",
            Method::Delete => "delete",
        }
    }
}

/// What an operation serves, and so which methods its router binds and its document lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One method.
    Call(Method),
    /// Every method, relayed upstream (HTTP, WebSocket): documented by its common methods
    /// (`{id}_get`, `_post`, `_put`, `_delete`), a body either way for POST and PUT.
    Relay,
    /// An MCP endpoint (Streamable HTTP), bound for every method (the transport answers the
    /// ones it does not take): documented by `POST` a message, `GET` the session's stream and
    /// `DELETE` the session ([`MCP_METHODS`]).
    Mcp,
}

/// A query parameter.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    pub name: &'static str,
    pub required: bool,
    pub schema: Schema,
    pub description: &'static str,
}

impl Param {
    pub const fn query(name: &'static str, schema: Schema, description: &'static str) -> Param {
        Param {
            name,
            required: false,
            schema,
            description,
        }
    }

    pub const fn required(name: &'static str, schema: Schema, description: &'static str) -> Param {
        Param {
            required: true,
            ..Param::query(name, schema, description)
        }
    }
}

/// A request body.
#[derive(Debug, Clone, Copy)]
pub struct Body {
    pub content_type: &'static str,
    pub schema: Schema,
    pub required: bool,
}

impl Body {
    /// A required body of `content_type`.
    pub const fn new(content_type: &'static str, schema: Schema) -> Body {
        Body {
            content_type,
            schema,
            required: true,
        }
    }

    /// A required JSON body.
    pub const fn json(schema: Schema) -> Body {
        Body::new("application/json", schema)
    }

    /// The body may be left out.
    pub const fn optional(self) -> Body {
        Body {
            required: false,
            ..self
        }
    }
}

/// An answer's body.
#[derive(Debug, Clone, Copy)]
pub enum Content {
    None,
    Json(Schema),
    /// Any of these content types.
    Media(&'static [(&'static str, Schema)]),
}

/// An answer: its status (`"200"`, `"default"`), description and body.
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    pub status: &'static str,
    pub description: &'static str,
    pub content: Content,
    pub headers: &'static [(&'static str, Schema)],
}

impl Answer {
    /// An answer with a JSON body.
    pub const fn json(status: &'static str, description: &'static str, schema: Schema) -> Answer {
        Answer::with(status, description, Content::Json(schema))
    }

    /// An answer with a body of any of the given content types.
    pub const fn media(
        status: &'static str,
        description: &'static str,
        media: &'static [(&'static str, Schema)],
    ) -> Answer {
        Answer::with(status, description, Content::Media(media))
    }

    /// An answer without a body.
    pub const fn empty(status: &'static str, description: &'static str) -> Answer {
        Answer::with(status, description, Content::None)
    }

    const fn with(status: &'static str, description: &'static str, content: Content) -> Answer {
        Answer {
            status,
            description,
            content,
            headers: &[],
        }
    }

    /// The answer's headers.
    pub const fn headers(self, headers: &'static [(&'static str, Schema)]) -> Answer {
        Answer { headers, ..self }
    }
}

/// One operation of a document.
#[derive(Debug, Clone, Copy)]
pub struct Operation {
    pub kind: Kind,
    /// The path as served, an axum template (`/v1/commands/{id}`).
    pub path: &'static str,
    /// Where the router serving it is nested (`/v1` for the native API, else empty): it binds
    /// the path without it ([`Operation::route`]).
    pub nest: &'static str,
    pub id: &'static str,
    pub summary: &'static str,
    pub tag: Option<&'static str>,
    /// The credentials that admit it, any one of them (`""`: none needed); empty, an open
    /// operation.
    pub security: &'static [&'static str],
    pub query: &'static [Param],
    pub body: Option<Body>,
    pub answers: &'static [Answer],
    /// It may also give the native error answers: 400, 404 and `default`, and 401 unless open
    /// (an answer it declares itself is kept).
    pub native_errors: bool,
}

impl Operation {
    const fn new(kind: Kind, path: &'static str, id: &'static str, summary: &'static str) -> Self {
        Operation {
            kind,
            path,
            nest: "",
            id,
            summary,
            tag: None,
            security: &[],
            query: &[],
            body: None,
            answers: &[],
            native_errors: false,
        }
    }

    pub const fn get(path: &'static str, id: &'static str, summary: &'static str) -> Self {
        Operation::new(Kind::Call(Method::Get), path, id, summary)
    }

    pub const fn post(path: &'static str, id: &'static str, summary: &'static str) -> Self {
        Operation::new(Kind::Call(Method::Post), path, id, summary)
    }

    pub const fn put(path: &'static str, id: &'static str, summary: &'static str) -> Self {
        Operation::new(Kind::Call(Method::Put), path, id, summary)
    }

    pub const fn delete(path: &'static str, id: &'static str, summary: &'static str) -> Self {
        Operation::new(Kind::Call(Method::Delete), path, id, summary)
    }

    /// An `ANY` relay: any body either way, 502 when nothing answers upstream.
    pub const fn relay(path: &'static str, id: &'static str, summary: &'static str) -> Self {
        Operation {
            tag: Some("relay"),
            body: Some(Body::new("*/*", binary)),
            answers: RELAY_ANSWERS,
            ..Operation::new(Kind::Relay, path, id, summary)
        }
    }

    /// An MCP endpoint; the transport's errors are its own.
    pub const fn mcp(path: &'static str, id: &'static str, summary: &'static str) -> Self {
        Operation {
            tag: Some("mcp"),
            answers: MCP_ANSWERS,
            ..Operation::new(Kind::Mcp, path, id, summary)
        }
    }

    pub const fn nest(self, nest: &'static str) -> Self {
        Operation { nest, ..self }
    }

    pub const fn tag(self, tag: &'static str) -> Self {
        Operation {
            tag: Some(tag),
            ..self
        }
    }

    pub const fn security(self, security: &'static [&'static str]) -> Self {
        Operation { security, ..self }
    }

    pub const fn query(self, query: &'static [Param]) -> Self {
        Operation { query, ..self }
    }

    pub const fn body(self, body: Body) -> Self {
        Operation {
            body: Some(body),
            ..self
        }
    }

    pub const fn answers(self, answers: &'static [Answer]) -> Self {
        Operation { answers, ..self }
    }

    pub const fn native_errors(self) -> Self {
        Operation {
            native_errors: true,
            ..self
        }
    }

    /// The path its router binds: [`Operation::path`] without the nest.
    pub fn route(&self) -> &'static str {
        let path: &'static str = self.path;
        path.strip_prefix(self.nest).unwrap_or(path)
    }

    /// No credential needed.
    pub fn is_open(&self) -> bool {
        self.security.is_empty()
    }

    /// The operations a document lists for it: one per method it is documented by.
    pub fn documented(&self) -> Vec<Documented> {
        match self.kind {
            Kind::Call(method) => vec![Documented {
                method,
                id: self.id.to_string(),
                body: self.body,
                answers: self.answers.to_vec(),
            }],
            Kind::Relay => [Method::Get, Method::Post, Method::Put, Method::Delete]
                .into_iter()
                .map(|method| Documented {
                    method,
                    id: format!("{}_{}", self.id, method.as_str()),
                    body: self
                        .body
                        .filter(|_| matches!(method, Method::Post | Method::Put)),
                    answers: self.answers.to_vec(),
                })
                .collect(),
            Kind::Mcp => MCP_METHODS
                .iter()
                .map(|(method, body, answers)| Documented {
                    method: *method,
                    id: format!("{}_{}", self.id, method.as_str()),
                    body: *body,
                    answers: [answers, self.answers].concat(),
                })
                .collect(),
        }
    }
}

/// One method of an operation as a document lists it.
#[derive(Debug, Clone)]
pub struct Documented {
    pub method: Method,
    pub id: String,
    pub body: Option<Body>,
    pub answers: Vec<Answer>,
}

/// A relay's answers: the upstream's own, whatever their status and body.
const RELAY_ANSWERS: &[Answer] = &[
    Answer::media("200", "the upstream's answer", ANY),
    Answer::empty("101", "a WebSocket tunnelled to the upstream"),
    Answer::empty("308", "to the path with a trailing slash"),
    Answer::json("502", "nothing answers upstream", ERROR),
    Answer::media("default", "the upstream's answer, or an error", ANY),
];

/// The methods an MCP endpoint is documented by: `POST` a JSON-RPC message (answered as JSON or
/// as an SSE stream; 202 for a notification), `GET` the session's SSE stream, `DELETE` ends
/// the session (`Mcp-Session-Id`).
pub const MCP_METHODS: [(Method, Option<Body>, &[Answer]); 3] = [
    (
        Method::Post,
        Some(Body::json(mcp_message)),
        &[
            Answer::media(
                "200",
                "the answer (JSON, or an SSE stream)",
                &[
                    ("application/json", mcp_message),
                    ("text/event-stream", string),
                ],
            ),
            Answer::empty("202", "a notification or response accepted"),
        ],
    ),
    (
        Method::Get,
        None,
        &[Answer::media(
            "200",
            "the session's server-to-client stream",
            &[("text/event-stream", string)],
        )],
    ),
    (
        Method::Delete,
        None,
        &[
            Answer::media("200", "the session ended", ANY),
            Answer::empty("204", "the session ended"),
        ],
    ),
];

/// Every MCP method's: errors of the transport are its own (400 no or bad session header, 404
/// unknown session, 406 `Accept`, 415 content type), a JSON-RPC error object (the agent's) or
/// the transport's own text.
const MCP_ANSWERS: &[Answer] = &[
    Answer::json("401", "missing or wrong credentials", ERROR),
    Answer::media(
        "default",
        "the transport's error",
        &[("application/json", mcp_message), ("*/*", binary)],
    ),
];

fn mcp_message(_: &mut SchemaGenerator) -> Value {
    json!({"type": "object", "description": "a JSON-RPC 2.0 message (MCP)"})
}

/// Any content type, any bytes.
pub const ANY: &[(&str, Schema)] = &[("*/*", binary)];

pub fn int(_: &mut SchemaGenerator) -> Value {
    json!({"type": "integer", "minimum": 0})
}

pub fn boolean(_: &mut SchemaGenerator) -> Value {
    json!({"type": "boolean"})
}

pub fn string(_: &mut SchemaGenerator) -> Value {
    json!({"type": "string"})
}

pub fn binary(_: &mut SchemaGenerator) -> Value {
    json!({"type": "string", "contentMediaType": "application/octet-stream"})
}

pub fn object(_: &mut SchemaGenerator) -> Value {
    json!({"type": "object"})
}

/// `{"ok": bool}`, what `/healthz` answers.
pub fn alive(_: &mut SchemaGenerator) -> Value {
    json!({"type": "object", "properties": {"ok": {"type": "boolean"}}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_is_under_its_nest_and_named_once() {
        for doc in [AGENT, CONTROLLER] {
            let mut ids = std::collections::BTreeSet::new();
            for op in doc.operations() {
                assert!(
                    op.path.starts_with(op.nest),
                    "{} is not under {}",
                    op.id,
                    op.nest
                );
                assert!(op.route().starts_with('/'), "{}", op.id);
                assert!(ids.insert(op.id), "{}: {} twice", doc.title, op.id);
            }
        }
        assert_eq!(native::EXEC.route(), crate::routes::native::nested::EXEC);
        assert_eq!(native::MCP.route(), crate::routes::native::MCP);
    }
}
