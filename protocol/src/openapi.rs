//! OpenAPI 3.1 documents of both APIs, served at `GET /openapi.json`: the agent's (native `/v1`
//! and the OSWorld-compatible surface) and the controller's.
//!
//! Written once here: one route table per surface (method, path from [`crate::routes`], query
//! parameters, request body, answers per status), with the bodies' schemas generated from the
//! protocol's wire types (`schemars`, JSON Schema 2020-12, which OpenAPI 3.1 uses). Bodies the
//! handlers build ad hoc are described inline. A unit test checks the table against the route
//! constants, so a route cannot be added without its entry.

use schemars::JsonSchema;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use serde_json::{Map, Value, json};

use crate::controller as wire;
use crate::routes::{compat, controller, native};
use crate::*;

/// The OpenAPI version the documents declare.
pub const OPENAPI_VERSION: &str = "3.1.0";

/// One operation of a document, for checks and tests: method (lowercase) and OpenAPI path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Operation {
    pub method: String,
    pub path: String,
}

/// Every operation a document lists.
pub fn operations(doc: &Value) -> Vec<Operation> {
    let mut out = Vec::new();
    if let Some(paths) = doc["paths"].as_object() {
        for (path, item) in paths {
            for method in item.as_object().into_iter().flat_map(|m| m.keys()) {
                out.push(Operation {
                    method: method.clone(),
                    path: path.clone(),
                });
            }
        }
    }
    out.sort();
    out
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

struct Doc {
    generator: SchemaGenerator,
    paths: Map<String, Value>,
}

impl Doc {
    fn new() -> Doc {
        let generator = SchemaSettings::draft2020_12()
            .with(|s| {
                s.definitions_path = "/components/schemas".into();
                s.meta_schema = None;
            })
            .into_generator();
        Doc {
            generator,
            paths: Map::new(),
        }
    }

    /// A `$ref` to `T`'s schema under `components/schemas` (the deserializing contract: a
    /// field a reader defaults is optional).
    fn schema<T: JsonSchema>(&mut self) -> Value {
        self.generator.subschema_for::<T>().to_value()
    }

    fn add(&mut self, op: Op) {
        let item = self
            .paths
            .entry(openapi_path(op.path))
            .or_insert_with(|| json!({}));
        item[op.method] = Value::Object(op.obj);
    }

    fn finish(mut self, info: Value, security_schemes: Value) -> Value {
        let schemas: Map<String, Value> = self.generator.take_definitions(true);
        json!({
            "openapi": OPENAPI_VERSION,
            "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
            "info": info,
            "paths": self.paths,
            "components": {
                "schemas": schemas,
                "securitySchemes": security_schemes,
            },
        })
    }
}

struct Op {
    method: &'static str,
    path: &'static str,
    obj: Map<String, Value>,
}

fn op(method: &'static str, path: &'static str, id: &str, summary: &str) -> Op {
    let mut obj = Map::new();
    obj.insert("operationId".into(), id.into());
    obj.insert("summary".into(), summary.into());
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
    obj.insert("parameters".into(), Value::Array(params));
    obj.insert("responses".into(), json!({}));
    Op { method, path, obj }
}

impl Op {
    fn query(mut self, name: &str, schema: Value, description: &str) -> Op {
        self.param(json!({"name": name, "in": "query", "required": false,
                          "schema": schema, "description": description}));
        self
    }

    fn required_query(mut self, name: &str, schema: Value, description: &str) -> Op {
        self.param(json!({"name": name, "in": "query", "required": true,
                          "schema": schema, "description": description}));
        self
    }

    fn param(&mut self, p: Value) {
        if let Some(Value::Array(ps)) = self.obj.get_mut("parameters") {
            ps.push(p);
        }
    }

    /// A required JSON request body.
    fn json_body(self, schema: Value) -> Op {
        self.body("application/json", schema)
    }

    /// The request body may be left out.
    fn body_optional(mut self) -> Op {
        if let Some(b) = self.obj.get_mut("requestBody") {
            b["required"] = false.into();
        }
        self
    }

    fn body(mut self, content_type: &str, schema: Value) -> Op {
        self.obj.insert(
            "requestBody".into(),
            json!({"required": true, "content": {content_type: {"schema": schema}}}),
        );
        self
    }

    /// An answer with a JSON body.
    fn json(self, status: &str, description: &str, schema: Value) -> Op {
        self.answer(
            status,
            description,
            json!({"application/json": {"schema": schema}}),
        )
    }

    /// An answer with any body of the given content types.
    fn answer(mut self, status: &str, description: &str, content: Value) -> Op {
        let mut r = json!({"description": description});
        if content.as_object().is_some_and(|c| !c.is_empty()) {
            r["content"] = content;
        }
        if let Some(Value::Object(rs)) = self.obj.get_mut("responses") {
            rs.insert(status.into(), r);
        }
        self
    }

    fn headers(mut self, status: &str, headers: Value) -> Op {
        if let Some(r) = self
            .obj
            .get_mut("responses")
            .and_then(|r| r.get_mut(status))
        {
            r["headers"] = headers;
        }
        self
    }

    fn security(mut self, schemes: Value) -> Op {
        self.obj.insert("security".into(), schemes);
        self
    }

    fn tag(mut self, tag: &str) -> Op {
        self.obj.insert("tags".into(), json!([tag]));
        self
    }
}

/// An `ANY` relay (preview, the agent through the controller): documented by its common
/// methods, any body either way; 502 when nothing answers upstream.
fn relay_ops(
    d: &mut Doc,
    path: &'static str,
    id: &str,
    summary: &str,
    security: &Value,
    err: &Value,
) {
    for method in ["get", "post", "put", "delete"] {
        let o = op(method, path, &format!("{id}_{method}"), summary).tag("relay");
        let o = match method {
            "post" | "put" => o.body("*/*", binary()),
            _ => o,
        };
        let o = o
            .answer(
                "200",
                "the upstream's answer",
                json!({"*/*": {"schema": binary()}}),
            )
            .answer("101", "a WebSocket tunnelled to the upstream", json!({}))
            .answer("308", "to the path with a trailing slash", json!({}))
            .json("502", "nothing answers upstream", err.clone());
        // Any other status is the upstream's own, with its own body.
        let o = o.answer(
            "default",
            "the upstream's answer, or an error",
            json!({"*/*": {"schema": binary()}}),
        );
        d.add(o.security(security.clone()));
    }
}

/// `POST …/computer`: the body by its key (`action` Anthropic's, `type` OpenAI's, `actions` a
/// batch), the answer in the request's dialect; an error answer is the error body or the
/// dialect's answer carrying `error` (and `failed` for a batch that stopped).
fn computer_op(d: &mut Doc, o: Op, err: &Value) -> Op {
    let body = d.schema::<ComputerBody>();
    let answer = d.schema::<ComputerAnswer>();
    let failed = json!({"anyOf": [err.clone(), answer.clone()]});
    o.json_body(body)
        .json(
            "200",
            "done: the settled screen in the request's dialect",
            answer,
        )
        .json("400", "bad input (nothing ran)", failed.clone())
        .json("422", "valid but impossible", failed.clone())
        .json("default", "an error", failed)
}

/// An MCP endpoint (Streamable HTTP): `POST` a JSON-RPC message (answered as JSON or as an
/// SSE stream; 202 for a notification), `GET` the session's SSE stream, `DELETE` ends the
/// session (`Mcp-Session-Id`). Errors of the transport are its own (400 no or bad session
/// header, 404 unknown session, 406 `Accept`, 415 content type).
fn mcp_ops(
    d: &mut Doc,
    path: &'static str,
    id: &str,
    summary: &str,
    security: &Value,
    err: &Value,
) {
    let message = json!({"type": "object", "description": "a JSON-RPC 2.0 message (MCP)"});
    let sse = json!({"text/event-stream": {"schema": string()}});
    let answer = json!({
        "application/json": {"schema": message.clone()},
        "text/event-stream": {"schema": string()},
    });
    let other = json!({"*/*": {"schema": binary()}});
    // A transport error: a JSON-RPC error object (the agent's), or the transport's own text.
    let failed = json!({
        "application/json": {"schema": message.clone()},
        "*/*": {"schema": binary()},
    });
    let ops = [
        op("post", path, &format!("{id}_post"), summary)
            .json_body(message.clone())
            .answer("200", "the answer (JSON, or an SSE stream)", answer)
            .answer("202", "a notification or response accepted", json!({})),
        op("get", path, &format!("{id}_get"), summary).answer(
            "200",
            "the session's server-to-client stream",
            sse,
        ),
        op("delete", path, &format!("{id}_delete"), summary)
            .answer("200", "the session ended", other.clone())
            .answer("204", "the session ended", json!({})),
    ];
    for o in ops {
        let o = o
            .json("401", "missing or wrong credentials", err.clone())
            .answer("default", "the transport's error", failed.clone())
            .tag("mcp");
        d.add(o.security(security.clone()));
    }
}

fn int() -> Value {
    json!({"type": "integer", "minimum": 0})
}

fn boolean() -> Value {
    json!({"type": "boolean"})
}

fn string() -> Value {
    json!({"type": "string"})
}

fn binary() -> Value {
    json!({"type": "string", "contentMediaType": "application/octet-stream"})
}

fn object() -> Value {
    json!({"type": "object"})
}

fn html() -> Value {
    json!({"text/html": {"schema": string()}})
}

/// The native error answers (`{"error": {"code", "message"}}`) every native and controller
/// operation may give: 400 bad input, 401 credentials, 404 unknown id or path, and any other
/// status by `default`.
/// An answer the operation already declares (the computer's own 400 body) is kept.
fn native_errors(mut op: Op, err: &Value, auth: bool) -> Op {
    let mut common = vec![
        ("400", "bad input"),
        ("404", "unknown id or path"),
        ("default", "an error"),
    ];
    if auth {
        common.push(("401", "missing or wrong credentials"));
    }
    for (status, description) in common {
        if op.obj["responses"].get(status).is_none() {
            op = op.json(status, description, err.clone());
        }
    }
    op
}

/// The agent's document: native `/v1` (bearer token; the (V) routes also take the viewer
/// cookie) and the OSWorld-compatible surface at root paths.
pub fn agent() -> Value {
    let mut d = Doc::new();
    let err = d.schema::<ErrorBody>();
    let bearer = json!([{"bearer": []}]);
    let viewer = json!([{"bearer": []}, {"viewerCookie": []}]);
    let native_op = |d: &mut Doc, op: Op, open: bool| {
        let op = native_errors(op.tag("native"), &err, !open);
        let op = match open {
            true => op.security(json!([])),
            false => op.security(bearer.clone()),
        };
        d.add(op);
    };

    native_op(
        &mut d,
        op("get", native::HEALTHZ, "healthz", "liveness (no auth)").json(
            "200",
            "alive",
            json!({"type": "object", "properties": {"ok": boolean()}}),
        ),
        true,
    );
    d.add(
        op("get", native::OPENAPI, "openapi", "this document (no auth)")
            .json("200", "the OpenAPI 3.1 document", object())
            .security(json!([]))
            .tag("native"),
    );

    // Commands.
    let (req, fg, bg) = (
        d.schema::<ExecRequest>(),
        d.schema::<ExecResult>(),
        d.schema::<BackgroundStarted>(),
    );
    native_op(
        &mut d,
        op(
            "post",
            native::EXEC,
            "exec",
            "run a command (foreground or background)",
        )
        .json_body(req)
        .json("200", "the foreground command's result", fg)
        .json("202", "the background command's id", bg)
        .json("409", "the id is taken by another request", err.clone()),
        false,
    );
    let list = d.schema::<CommandList>();
    native_op(
        &mut d,
        op(
            "get",
            native::COMMANDS,
            "commands_list",
            "background commands",
        )
        .json("200", "the commands", list),
        false,
    );
    let info = d.schema::<CommandInfo>();
    native_op(
        &mut d,
        op(
            "get",
            native::COMMAND,
            "command_get",
            "one background command",
        )
        .json("200", "the command", info),
        false,
    );
    native_op(
        &mut d,
        op(
            "delete",
            native::COMMAND,
            "command_delete",
            "forget a command (killed if running)",
        )
        .json(
            "200",
            "deleted",
            json!({"type": "object", "required": ["id", "deleted"],
                       "properties": {"id": string(), "deleted": boolean()}}),
        ),
        false,
    );
    let page = d.schema::<OutputPage>();
    native_op(
        &mut d,
        op(
            "get",
            native::COMMAND_OUTPUT,
            "command_output",
            "a command's output from a seq",
        )
        .query("from_seq", int(), "byte offset to read from")
        .query(
            "follow",
            boolean(),
            "WebSocket, SSE or long-poll until the command ends",
        )
        .query("max_bytes", int(), "at most this many bytes")
        .query(
            "timeout_ms",
            int(),
            "long-poll: answer after this long even when empty",
        )
        .query(
            "stall_ms",
            int(),
            "drop a follower that reads nothing this long",
        )
        .json("200", "chunks from from_seq", page)
        .answer("101", "WebSocket follow", json!({})),
        false,
    );
    let stdin = d.schema::<StdinRequest>();
    native_op(
        &mut d,
        op(
            "post",
            native::COMMAND_STDIN,
            "command_stdin",
            "write to a command's stdin",
        )
        .json_body(stdin)
        .json(
            "200",
            "written",
            json!({"type": "object", "required": ["written", "eof"],
                       "properties": {"written": int(), "eof": boolean()}}),
        )
        .json(
            "409",
            "the command is not running or its stdin is closed",
            err.clone(),
        ),
        false,
    );
    let signal = d.schema::<SignalRequest>();
    native_op(
        &mut d,
        op(
            "post",
            native::COMMAND_SIGNAL,
            "command_signal",
            "signal a command's process group",
        )
        .json_body(signal)
        .json(
            "200",
            "sent",
            json!({"type": "object", "required": ["signal"], "properties": {"signal": string()}}),
        )
        .json("409", "the command is not running", err.clone()),
        false,
    );

    // PTYs.
    let (preq, pinfo, plist, psize) = (
        d.schema::<PtyRequest>(),
        d.schema::<PtyInfo>(),
        d.schema::<PtyList>(),
        d.schema::<PtySize>(),
    );
    native_op(
        &mut d,
        op("post", native::PTYS, "pty_open", "open a PTY session")
            .json_body(preq)
            .json("201", "the session", pinfo.clone()),
        false,
    );
    native_op(
        &mut d,
        op("get", native::PTYS, "pty_list", "PTY sessions").json("200", "the sessions", plist),
        false,
    );
    native_op(
        &mut d,
        op("get", native::PTY, "pty_get", "one PTY session").json(
            "200",
            "the session",
            pinfo.clone(),
        ),
        false,
    );
    native_op(
        &mut d,
        op("delete", native::PTY, "pty_kill", "kill a PTY session").json(
            "200",
            "killed",
            json!({"type": "object", "required": ["id", "killed"],
                   "properties": {"id": string(), "killed": boolean()}}),
        ),
        false,
    );
    native_op(
        &mut d,
        op(
            "get",
            native::PTY_ATTACH,
            "pty_attach",
            "attach to a PTY (WebSocket)",
        )
        .query(
            "stall_ms",
            int(),
            "drop a client that reads nothing this long",
        )
        .answer("101", "the terminal's bytes both ways", json!({})),
        false,
    );
    native_op(
        &mut d,
        op("post", native::PTY_RESIZE, "pty_resize", "resize a PTY")
            .json_body(psize)
            .json("200", "the session", pinfo),
        false,
    );

    // Files.
    native_op(
        &mut d,
        op(
            "get",
            native::FILES,
            "files_download",
            "download a file (Range)",
        )
        .required_query("path", string(), "absolute, or relative to the home")
        .answer(
            "200",
            "the bytes",
            json!({"application/octet-stream": {"schema": binary()}}),
        )
        .answer(
            "206",
            "the requested range",
            json!({"application/octet-stream": {"schema": binary()}}),
        )
        .answer("304", "not modified", json!({}))
        .json("416", "range not satisfiable", err.clone()),
        false,
    );
    let uploaded = d.schema::<UploadResult>();
    native_op(
        &mut d,
        op(
            "put",
            native::FILES,
            "files_upload",
            "upload a file (streamed, no size limit)",
        )
        .required_query("path", string(), "absolute, or relative to the home")
        .query(
            "mode",
            json!({"type": "string", "pattern": "^(0o)?[0-7]{1,4}$"}),
            "octal mode",
        )
        .body("application/octet-stream", binary())
        .json("201", "written", uploaded),
        false,
    );
    native_op(
        &mut d,
        op(
            "delete",
            native::FS,
            "fs_remove",
            "remove a file or directory",
        )
        .required_query("path", string(), "absolute, or relative to the home")
        .query("recursive", boolean(), "remove a directory's contents")
        .json(
            "200",
            "removed",
            json!({"type": "object", "required": ["path", "removed"],
                       "properties": {"path": string(), "removed": boolean()}}),
        )
        .json("409", "a directory that is not empty", err.clone()),
        false,
    );
    let listing = d.schema::<ListResponse>();
    native_op(
        &mut d,
        op("get", native::FS_LIST, "fs_list", "list a directory")
            .required_query("path", string(), "absolute, or relative to the home")
            .query("depth", int(), "levels below the directory (default 1)")
            .json("200", "the entries", listing),
        false,
    );
    let entry = d.schema::<FileEntry>();
    native_op(
        &mut d,
        op("get", native::FS_STAT, "fs_stat", "one entry's metadata")
            .required_query("path", string(), "absolute, or relative to the home")
            .json("200", "the entry", entry.clone()),
        false,
    );
    let mkdir = d.schema::<MkdirRequest>();
    native_op(
        &mut d,
        op("post", native::FS_MKDIR, "fs_mkdir", "make a directory")
            .json_body(mkdir)
            .json("201", "the directory", entry.clone())
            .json("409", "exists", err.clone()),
        false,
    );
    let mv = d.schema::<MoveRequest>();
    native_op(
        &mut d,
        op("post", native::FS_MOVE, "fs_move", "move or rename")
            .json_body(mv)
            .json("200", "the moved entry", entry)
            .json("409", "the target exists", err.clone()),
        false,
    );
    native_op(
        &mut d,
        op(
            "get",
            native::FS_WATCH,
            "fs_watch",
            "watch a path (WebSocket or SSE)",
        )
        .required_query("path", string(), "absolute, or relative to the home")
        .query("recursive", boolean(), "watch below the path too")
        .query(
            "stall_ms",
            int(),
            "drop a client that reads nothing this long",
        )
        .answer("101", "WebSocket of changes", json!({}))
        .answer(
            "200",
            "SSE of changes",
            json!({"text/event-stream": {"schema": string()}}),
        ),
        false,
    );

    // Display.
    let image = json!({
        "image/png": {"schema": binary()},
        "image/jpeg": {"schema": binary()},
        "image/webp": {"schema": binary()},
    });
    let shot_headers = json!({
        "X-Screen-Width": {"schema": int()},
        "X-Screen-Height": {"schema": int()},
        "X-Scale": {"schema": {"type": "number"}},
        "X-Cache": {"schema": {"type": "string", "enum": ["hit", "miss"]}},
        "X-Settled-Ms": {"schema": int()},
        "X-Settle-Timed-Out": {"schema": {"type": "string", "enum": ["true", "false"]}},
    });
    native_op(
        &mut d,
        op(
            "get",
            native::SCREENSHOT,
            "screenshot",
            "the screen as an image",
        )
        .query(
            "format",
            json!({"type": "string", "enum": ["png", "jpeg", "webp"]}),
            "image format",
        )
        .query(
            "quality",
            json!({"type": "integer", "minimum": 1, "maximum": 100}),
            "jpeg/webp quality",
        )
        .query(
            "compression",
            string(),
            "png compression (fast, default, best)",
        )
        .query(
            "scale",
            json!({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
            "downscale factor",
        )
        .query(
            "region",
            json!({"type": "string", "pattern": "^\\d+,\\d+,\\d+,\\d+$"}),
            "x,y,w,h",
        )
        .query("cursor", boolean(), "draw the cursor")
        .query(
            "settle_ms",
            int(),
            "wait until the screen is quiet this long",
        )
        .query(
            "timeout_ms",
            int(),
            "give up the settle wait after this long",
        )
        .answer("200", "the image", image.clone())
        .headers("200", shot_headers.clone())
        .answer("304", "not modified (If-None-Match)", json!({})),
        false,
    );
    let (ireq, iresp) = (d.schema::<InputRequest>(), d.schema::<InputResponse>());
    native_op(
        &mut d,
        op("post", native::INPUT, "input", "mouse and keyboard actions")
            .json_body(ireq)
            .json("200", "done", iresp)
            .json("422", "valid but impossible", err.clone()),
        false,
    );
    let dinfo = d.schema::<DisplayInfo>();
    native_op(
        &mut d,
        op("get", native::DISPLAY, "display", "the display").json(
            "200",
            "the display",
            dinfo.clone(),
        ),
        false,
    );
    let size = d.schema::<DisplaySize>();
    native_op(
        &mut d,
        op(
            "put",
            native::DISPLAY,
            "display_resize",
            "resize the live screen (RandR)",
        )
        .json_body(size)
        .json("200", "resized: the display at its new size", dinfo)
        .json("503", "no display, or no RandR", err.clone()),
        false,
    );
    native_op(
        &mut d,
        op("get", native::WINDOWS, "windows", "top-level windows").json(
            "200",
            "the windows",
            json!({"type": "object", "required": ["windows"],
                   "properties": {"windows": {"type": "array", "items": object()}}}),
        ),
        false,
    );
    let clip = d.schema::<Clipboard>();
    native_op(
        &mut d,
        op(
            "get",
            native::CLIPBOARD,
            "clipboard_get",
            "the clipboard's text",
        )
        .json("200", "the text", clip.clone()),
        false,
    );
    native_op(
        &mut d,
        op(
            "put",
            native::CLIPBOARD,
            "clipboard_put",
            "set the clipboard's text",
        )
        .json_body(clip)
        .answer("204", "set", json!({})),
        false,
    );
    let o = op(
        "post",
        native::COMPUTER,
        "computer",
        "a computer-use tool action (Anthropic's or OpenAI's) or a batch of them",
    );
    let o = computer_op(&mut d, o, &err);
    native_op(&mut d, o, false);
    let (tinfo, turn) = (
        d.schema::<crate::toolset::ComputerToolsetInfo>(),
        d.schema::<crate::toolset::ToolsetTurn>(),
    );
    native_op(
        &mut d,
        op(
            "get",
            native::TOOLSET_COMPUTER,
            "toolset_computer_info",
            "Anthropic's computer toolset: the tools[] entry, the display and the screenshot size",
        )
        .json("200", "the toolset", tinfo)
        .json("503", "no display", err.clone()),
        false,
    );
    native_op(
        &mut d,
        op(
            "post",
            native::TOOLSET_COMPUTER,
            "toolset_computer_turn",
            "a model turn's content: its computer tool_use blocks run in order, answered with \
             their tool_result blocks",
        )
        .json_body(turn.clone())
        .json("200", "one tool_result per tool_use", turn.clone())
        .json("503", "no display", err.clone()),
        false,
    );
    let binfo = d.schema::<crate::toolset::BrowserToolsetInfo>();
    native_op(
        &mut d,
        op(
            "get",
            native::TOOLSET_BROWSER,
            "toolset_browser_info",
            "Anthropic's browser toolset: the tools[] entry, the members served and the \
             active tab's viewport and screenshot size",
        )
        .json("200", "the toolset", binfo)
        .json("503", "no desktop, or the browser is down", err.clone()),
        false,
    );
    native_op(
        &mut d,
        op(
            "post",
            native::TOOLSET_BROWSER,
            "toolset_browser_turn",
            "a model turn's content: its browser tool_use blocks run in order over CDP in the \
             sandbox's browser, answered with their tool_result blocks (each with the \
             browser_state block)",
        )
        .json_body(turn.clone())
        .json("200", "one tool_result per tool_use", turn)
        .json(
            "400",
            "a content block that is not well formed",
            err.clone(),
        )
        .json("503", "no desktop", err.clone()),
        false,
    );

    // Recordings and the live stream.
    let (rreq, rinfo, rlist) = (
        d.schema::<RecordingRequest>(),
        d.schema::<RecordingInfo>(),
        d.schema::<RecordingList>(),
    );
    native_op(
        &mut d,
        op(
            "post",
            native::RECORDINGS,
            "recording_start",
            "start a recording",
        )
        .json_body(rreq)
        .json("201", "started", rinfo.clone())
        .json("409", "conflict", err.clone())
        .json("429", "too many recordings", err.clone()),
        false,
    );
    native_op(
        &mut d,
        op("get", native::RECORDINGS, "recordings_list", "recordings").json(
            "200",
            "the recordings",
            rlist,
        ),
        false,
    );
    native_op(
        &mut d,
        op("get", native::RECORDING, "recording_get", "one recording").json(
            "200",
            "the recording",
            rinfo.clone(),
        ),
        false,
    );
    native_op(
        &mut d,
        op(
            "delete",
            native::RECORDING,
            "recording_delete",
            "delete a recording",
        )
        .json(
            "200",
            "deleted",
            json!({"type": "object", "required": ["deleted"], "properties": {"deleted": string()}}),
        )
        .json("409", "conflict", err.clone()),
        false,
    );
    native_op(
        &mut d,
        op(
            "post",
            native::RECORDING_STOP,
            "recording_stop",
            "stop a recording",
        )
        .json("200", "stopped", rinfo)
        .json("409", "conflict", err.clone()),
        false,
    );
    native_op(
        &mut d,
        op(
            "get",
            native::RECORDING_FILE,
            "recording_file",
            "a recording's MP4 (Range)",
        )
        .answer(
            "200",
            "the video",
            json!({"video/mp4": {"schema": binary()}}),
        )
        .answer(
            "206",
            "the requested range",
            json!({"video/mp4": {"schema": binary()}}),
        )
        .json("409", "not finished", err.clone())
        .json("416", "range not satisfiable", err.clone()),
        false,
    );
    native_op(
        &mut d,
        op(
            "get",
            native::EPISODE_ACTIONS,
            "episode_actions",
            "the episode's logged computer-use and input actions, oldest first",
        )
        .query("from_seq", int(), "the first seq to answer (default 1)")
        .query(
            "limit",
            int(),
            "at most this many (default 1000, at most 10000)",
        )
        .json(
            "200",
            "a page of the log",
            json!({"type": "object", "required": ["actions", "next_seq"], "properties": {
                "actions": {"type": "array", "items": {"type": "object"}},
                "next_seq": int(),
                "dropped": int(),
            }}),
        ),
        false,
    );
    native_op(
        &mut d,
        op(
            "get",
            native::EPISODE_SCREENSHOT,
            "episode_screenshot",
            "a screenshot an action answered, the bytes it answered",
        )
        .answer(
            "200",
            "the image",
            json!({"image/png": {"schema": binary()}, "image/jpeg": {"schema": binary()}, "image/webp": {"schema": binary()}}),
        )
        .json("400", "bad name", err.clone())
        .json("404", "no such screenshot (or dropped)", err.clone()),
        false,
    );
    native_op(
        &mut d,
        op(
            "delete",
            native::EPISODE,
            "episode_clear",
            "start a new episode: the action log and its screenshots are cleared",
        )
        .json(
            "200",
            "cleared",
            json!({"type": "object", "required": ["cleared"], "properties": {"cleared": int()}}),
        ),
        false,
    );
    let stream_q = |o: Op| {
        o.query("fps", int(), "frames per second")
            .query("width", int(), "scaled width")
            .query("bitrate_kbps", int(), "target bitrate")
    };
    native_op(
        &mut d,
        stream_q(op(
            "get",
            native::STREAM_MP4,
            "stream_mp4",
            "the live screen as fragmented MP4 (V)",
        ))
        .answer(
            "200",
            "the stream",
            json!({"video/mp4": {"schema": binary()}}),
        )
        .security(viewer.clone()),
        false,
    );
    native_op(
        &mut d,
        stream_q(op(
            "get",
            native::STREAM,
            "stream_ws",
            "the live screen over a WebSocket (V)",
        ))
        .answer("101", "fragmented MP4 in binary messages", json!({})),
        false,
    );
    let (vreq, vtok) = (d.schema::<ViewerTokenRequest>(), d.schema::<ViewerToken>());
    native_op(
        &mut d,
        op(
            "post",
            native::VIEWER_TOKENS,
            "viewer_token",
            "a one-time viewer URL",
        )
        .json_body(vreq)
        .json("201", "the URL", vtok)
        .json("429", "too many unused URLs", err.clone()),
        false,
    );
    native_op(
        &mut d,
        op("get", native::VNC_INDEX, "vnc_index", "the noVNC page (V)")
            .query("t", string(), "a one-time viewer token (sets the cookie)")
            .answer("302", "to the page", json!({}))
            .answer("303", "to the clean URL, cookie set", json!({})),
        false,
    );
    native_op(
        &mut d,
        op("get", native::VNC_WS, "vnc_ws", "noVNC's WebSocket (V)").answer(
            "101",
            "RFB over WebSocket",
            json!({}),
        ),
        false,
    );
    native_op(
        &mut d,
        op(
            "get",
            native::VNC_FILE,
            "vnc_file",
            "noVNC's static files (V)",
        )
        .answer("200", "the file", json!({"*/*": {"schema": binary()}})),
        false,
    );
    // The (V) routes take either credential.
    for (path, method) in [
        (native::STREAM, "get"),
        (native::VNC_INDEX, "get"),
        (native::VNC_WS, "get"),
        (native::VNC_FILE, "get"),
    ] {
        if let Some(o) = d
            .paths
            .get_mut(&openapi_path(path))
            .and_then(|p| p.get_mut(method))
        {
            o["security"] = viewer.clone();
        }
    }

    // Desktop.
    let ready = d.schema::<ReadyReport>();
    native_op(
        &mut d,
        op(
            "get",
            native::READY,
            "ready",
            "readiness of the desktop's components",
        )
        .query(
            "wait",
            string(),
            "wait up to this long for ready (30s, 2m; at most 300 s)",
        )
        .json("200", "ready", ready.clone())
        .json("503", "not ready", ready),
        false,
    );
    let a11y = d.schema::<A11yTree>();
    native_op(
        &mut d,
        op("get", native::A11Y, "a11y", "the accessibility tree")
            .json("200", "the tree", a11y)
            .json("503", "no accessibility bus", err.clone()),
        false,
    );
    let desktop_state = d.schema::<DesktopState>();
    native_op(
        &mut d,
        op(
            "get",
            native::DESKTOP_STATE,
            "desktopState",
            "the desktop-state contract: session, theme, dock, default applications, windows, \
             first-run state, programs, volume and time zone, each expected item checked",
        )
        .json("200", "the state", desktop_state)
        .json(
            "503",
            "no desktop, or its settings could not be read",
            err.clone(),
        ),
        false,
    );
    let browser = d.schema::<BrowserInfo>();
    native_op(
        &mut d,
        op("get", native::BROWSER, "browser", "the desktop's Chromium")
            .json("200", "the browser", browser.clone())
            .json("503", "no browser", err.clone()),
        false,
    );
    native_op(
        &mut d,
        op(
            "post",
            native::BROWSER_RESTART,
            "browser_restart",
            "restart Chromium",
        )
        .json("200", "the new browser", browser)
        .json("503", "no browser", err.clone()),
        false,
    );
    native_op(
        &mut d,
        op(
            "get",
            native::BROWSER_CDP,
            "browser_cdp",
            "the browser target's CDP (WebSocket)",
        )
        .answer("101", "CDP over WebSocket", json!({})),
        false,
    );
    native_op(
        &mut d,
        op(
            "get",
            native::BROWSER_CDP_TARGET,
            "browser_cdp_target",
            "one target's CDP (WebSocket)",
        )
        .answer("101", "CDP over WebSocket", json!({})),
        false,
    );

    // Events and lifecycle.
    let events = d.schema::<EventsPage>();
    native_op(
        &mut d,
        op("get", native::EVENTS, "events", "the agent's event log")
            .query("from_seq", int(), "first seq")
            .query("follow", boolean(), "WebSocket, SSE or long-poll")
            .query("limit", int(), "at most this many events (1..10000)")
            .query(
                "timeout_ms",
                int(),
                "long-poll: answer after this long even when empty",
            )
            .query(
                "stall_ms",
                int(),
                "drop a follower that reads nothing this long",
            )
            .json("200", "a page of events", events)
            .answer("101", "WebSocket follow", json!({})),
        false,
    );
    native_op(
        &mut d,
        op(
            "post",
            native::SHUTDOWN,
            "shutdown",
            "full shutdown (destructive)",
        )
        .json(
            "202",
            "shutting down",
            json!({"type": "object", "required": ["shutting_down"],
                   "properties": {"shutting_down": boolean()}}),
        ),
        false,
    );

    // Preview: 127.0.0.1:{port} inside the sandbox.
    for (path, id) in [
        (native::PORT, "preview"),
        (native::PORT_ROOT, "preview_root"),
        (PORT_BARE, "preview_bare"),
    ] {
        relay_ops(
            &mut d,
            path,
            id,
            "the preview relay to 127.0.0.1:{port} in the sandbox (HTTP, WebSocket)",
            &viewer,
            &err,
        );
    }

    mcp_ops(
        &mut d,
        native::MCP,
        "mcp",
        "MCP (Streamable HTTP): the sandbox's computer, exec, file, accessibility, browser and recording tools",
        &bearer,
        &err,
    );

    compat_ops(&mut d);

    d.finish(
        json!({
            "title": "berth agent",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The guest agent: the native API under /v1 (bearer token) and the \
                            OSWorld-compatible surface at root paths.",
        }),
        json!({
            "bearer": {"type": "http", "scheme": "bearer"},
            "viewerCookie": {"type": "apiKey", "in": "cookie", "name": "berth_viewer"},
        }),
    )
}

/// The preview root without its slash (it redirects to [`native::PORT_ROOT`]).
const PORT_BARE: &str = "/v1/ports/{port}";

/// The controller's preview root without its slash (it redirects to the one with).
const SANDBOX_PORT_BARE: &str = "/sandbox/sandboxes/v1/{id}/ports/{port}";

/// The OSWorld-compatible surface: Flask's answers (`{"message", "status": "error"}` or
/// `{"error"}` for errors, JSON objects or text for results). Open or bearer, per
/// `--compat-auth`.
fn compat_ops(d: &mut Doc) {
    let err = json!({"anyOf": [
        {"type": "object", "required": ["message", "status"],
         "properties": {"message": string(), "status": string()}},
        {"type": "object", "required": ["error"], "properties": {"error": string()}},
    ]});
    // Results are whatever JSON the reference server's handler returns (objects, the cursor's
    // `[x, y]`), or text.
    let any_json = json!({"application/json": {"schema": {}}, "text/html": {"schema": string()}});
    let errors = json!({"application/json": {"schema": err}, "text/html": {"schema": string()}});
    let security = json!([{}, {"bearer": []}]);
    let form = json!({"type": "object", "additionalProperties": true});
    let json_ops: [(&'static str, &str, &str); 21] = [
        (
            compat::EXECUTE,
            "compat_execute",
            "run a command (destructive)",
        ),
        (
            compat::SETUP_EXECUTE,
            "compat_setup_execute",
            "run a command (destructive)",
        ),
        (
            compat::EXECUTE_WITH_VERIFICATION,
            "compat_execute_verify",
            "run and verify (destructive)",
        ),
        (
            compat::SETUP_EXECUTE_WITH_VERIFICATION,
            "compat_setup_execute_verify",
            "run and verify (destructive)",
        ),
        (
            compat::SETUP_LAUNCH,
            "compat_launch",
            "launch a program (destructive)",
        ),
        (
            compat::RUN_PYTHON,
            "compat_run_python",
            "run Python code (destructive)",
        ),
        (
            compat::RUN_BASH_SCRIPT,
            "compat_run_bash",
            "run a bash script (destructive)",
        ),
        (
            compat::LIST_DIRECTORY,
            "compat_list_directory",
            "a directory tree",
        ),
        (
            compat::DESKTOP_PATH,
            "compat_desktop_path",
            "the desktop directory",
        ),
        (
            compat::SETUP_DOWNLOAD_FILE,
            "compat_download_file",
            "fetch a URL into a file (destructive)",
        ),
        (
            compat::SCREEN_SIZE,
            "compat_screen_size",
            "the screen's size",
        ),
        (compat::WINDOW_SIZE, "compat_window_size", "a window's size"),
        (
            compat::SETUP_ACTIVATE_WINDOW,
            "compat_activate_window",
            "raise a window",
        ),
        (
            compat::SETUP_CLOSE_WINDOW,
            "compat_close_window",
            "close a window",
        ),
        (
            compat::SETUP_OPEN_FILE,
            "compat_open_file",
            "open a file (destructive)",
        ),
        (
            compat::WALLPAPER,
            "compat_wallpaper",
            "the wallpaper's bytes",
        ),
        (
            compat::SETUP_CHANGE_WALLPAPER,
            "compat_change_wallpaper",
            "set the wallpaper",
        ),
        (
            compat::START_RECORDING,
            "compat_start_recording",
            "start the recording",
        ),
        (
            compat::END_RECORDING,
            "compat_end_recording",
            "end the recording (the MP4)",
        ),
        (compat::FILE, "compat_file", "a file's bytes"),
        (
            compat::SETUP_UPLOAD,
            "compat_upload",
            "upload a file (multipart; destructive)",
        ),
    ];
    for (path, id, summary) in json_ops {
        let mut o = op("post", path, id, summary).tag("compat");
        o = match path {
            compat::FILE => o.body("application/x-www-form-urlencoded", form.clone()),
            compat::SETUP_UPLOAD => o.body("multipart/form-data", form.clone()),
            compat::SCREEN_SIZE | compat::DESKTOP_PATH => o,
            _ => o.json_body(object()),
        };
        let ok = match path {
            compat::FILE | compat::WALLPAPER => {
                json!({"application/octet-stream": {"schema": binary()}, "*/*": {"schema": binary()}})
            }
            compat::END_RECORDING => json!({"video/mp4": {"schema": binary()}}),
            _ => any_json.clone(),
        };
        d.add(
            o.answer("200", "done", ok)
                .answer(
                    "500",
                    "the reference server's own 500 (kept: the compat spec freezes it)",
                    errors.clone(),
                )
                .answer("default", "an error (Flask's shapes)", errors.clone())
                .security(security.clone()),
        );
    }
    let gets: [(&'static str, &str, &str); 5] = [
        (
            compat::PLATFORM,
            "compat_platform",
            "the platform's name (text)",
        ),
        (compat::SCREENSHOT, "compat_screenshot", "the screen as PNG"),
        (
            compat::CURSOR_POSITION,
            "compat_cursor_position",
            "the cursor's position",
        ),
        (
            compat::ACCESSIBILITY,
            "compat_accessibility",
            "the accessibility tree as XML in JSON",
        ),
        (compat::TERMINAL, "compat_terminal", "the terminal's text"),
    ];
    for (path, id, summary) in gets {
        let mut o = op("get", path, id, summary).tag("compat");
        if path == compat::SCREENSHOT {
            o = o.query("cursor", boolean(), "draw the cursor");
        }
        let ok = match path {
            compat::SCREENSHOT => json!({"image/png": {"schema": binary()}}),
            compat::PLATFORM => html(),
            _ => any_json.clone(),
        };
        d.add(
            o.answer("200", "done", ok)
                .answer(
                    "500",
                    "the reference server's own 500 (kept: the compat spec freezes it)",
                    errors.clone(),
                )
                .answer("default", "an error (Flask's shapes)", errors.clone())
                .security(security.clone()),
        );
    }
}

/// The controller's document.
pub fn controller() -> Value {
    let mut d = Doc::new();
    let err = d.schema::<ErrorBody>();
    let key = json!([{"apiKey": []}]);
    let viewer = json!([{"apiKey": []}, {"viewerCookie": []}]);
    let add = |d: &mut Doc, op: Op, security: &Value| {
        let open = security.as_array().is_some_and(|a| a.is_empty());
        let op = native_errors(op, &err, !open).security(security.clone());
        d.add(op);
    };
    let open = json!([]);

    add(
        &mut d,
        op("get", controller::HEALTHZ, "healthz", "liveness (no auth)").json(
            "200",
            "alive",
            json!({"type": "object", "properties": {"ok": boolean()}}),
        ),
        &open,
    );
    add(
        &mut d,
        op(
            "get",
            controller::METRICS,
            "metrics",
            "Prometheus metrics (no auth)",
        )
        .answer(
            "200",
            "the metrics",
            json!({"text/plain": {"schema": string()}}),
        ),
        &open,
    );
    d.add(
        op(
            "get",
            controller::OPENAPI,
            "openapi",
            "this document (no auth)",
        )
        .json("200", "the OpenAPI 3.1 document", object())
        .security(json!([])),
    );

    let (create, sandbox, list) = (
        d.schema::<wire::CreateSandbox>(),
        d.schema::<wire::Sandbox>(),
        d.schema::<wire::SandboxList>(),
    );
    add(
        &mut d,
        op(
            "post",
            controller::SANDBOXES,
            "sandbox_create",
            "create a sandbox (or claim a warm one)",
        )
        .query(
            "wait",
            boolean(),
            "false: answer at once and get ready in the background",
        )
        .json_body(create)
        .json("201", "the sandbox", sandbox.clone())
        .json("422", "valid but impossible", err.clone())
        .json("503", "no capacity", err.clone()),
        &key,
    );
    add(
        &mut d,
        op("get", controller::SANDBOXES, "sandbox_list", "sandboxes")
            .query("label", json!({"type": "string", "pattern": "^[^=]+=.*$"}), "key=value filter")
            .query(
                "status",
                json!({"type": "string",
                       "enum": ["pending", "starting", "running", "stopping", "stopped", "failed"]}),
                "status filter",
            )
            .json("200", "the sandboxes", list),
        &key,
    );
    add(
        &mut d,
        op("get", controller::SANDBOX, "sandbox_get", "one sandbox").json(
            "200",
            "the sandbox",
            sandbox.clone(),
        ),
        &key,
    );
    add(
        &mut d,
        op(
            "delete",
            controller::SANDBOX,
            "sandbox_delete",
            "destroy a sandbox",
        )
        .json("200", "the sandbox, stopped", sandbox),
        &key,
    );
    let url = d.schema::<wire::ViewerUrl>();
    add(
        &mut d,
        op(
            "post",
            controller::SANDBOX_VIEWER,
            "sandbox_viewer",
            "a one-time viewer URL",
        )
        .json("200", "the URL", url)
        .json("409", "not running", err.clone()),
        &key,
    );
    let (rreq, run) = (d.schema::<wire::RunRequest>(), d.schema::<wire::Run>());
    add(
        &mut d,
        op(
            "post",
            controller::SANDBOX_EXEC,
            "sandbox_exec",
            "run a command in a sandbox",
        )
        .json_body(rreq)
        .json("200", "the run", run.clone())
        .json("409", "not running", err.clone())
        .json("502", "the agent failed", err.clone())
        .json("503", "not ready", err.clone()),
        &key,
    );
    add(
        &mut d,
        op("get", controller::RUN, "run_get", "one run").json("200", "the run", run),
        &key,
    );
    let page = d.schema::<OutputPage>();
    add(
        &mut d,
        op(
            "get",
            controller::RUN_OUTPUT,
            "run_output",
            "a run's output from a seq",
        )
        .query("from_seq", int(), "byte offset to read from")
        .query("limit", int(), "unused here; accepted")
        .json("200", "chunks from from_seq", page),
        &key,
    );
    add(
        &mut d,
        op(
            "get",
            controller::SANDBOX_EVENTS,
            "sandbox_events",
            "a sandbox's timeline",
        )
        .query("from_seq", int(), "first seq")
        .query("limit", int(), "at most this many events")
        .json(
            "200",
            "a page of events",
            json!({"type": "object", "required": ["events"],
                       "properties": {"events": {"type": "array", "items": object()},
                                      "next_seq": int()}}),
        ),
        &key,
    );

    add(
        &mut d,
        op(
            "get",
            controller::SANDBOX_EPISODE,
            "sandbox_episode",
            "the episode bundle (zip: recording.mp4, actions.jsonl, screenshots/, \
             timeline.jsonl, episode.json), kept as an `episode` artifact (X-Artifact-Id); \
             once the sandbox is gone, the last kept bundle",
        )
        .query(
            "recording",
            string(),
            "the recording to bundle (default: the one most actions fall in)",
        )
        .answer(
            "200",
            "the bundle",
            json!({"application/zip": {"schema": binary()}}),
        )
        .answer(
            "206",
            "the requested range",
            json!({"application/zip": {"schema": binary()}}),
        )
        .json("404", "no such sandbox, or none kept", err.clone())
        .json(
            "413",
            "the bundle passes artifact_max_file_bytes",
            err.clone(),
        ),
        &key,
    );

    let (artifact, artifacts) = (
        d.schema::<wire::Artifact>(),
        d.schema::<wire::ArtifactList>(),
    );
    let publish = d.schema::<wire::PublishArtifact>();
    add(
        &mut d,
        op(
            "post",
            controller::SANDBOX_ARTIFACTS,
            "sandbox_artifact_publish",
            "publish a file or directory (as a zip) of the sandbox as an artifact",
        )
        .json_body(publish)
        .json("201", "the artifact", artifact.clone())
        .json("400", "a relative path or a bad name", err.clone())
        .json("404", "no such sandbox, path or run", err.clone())
        .json("409", "the sandbox is not running", err.clone())
        .json(
            "413",
            "past artifact_max_file_bytes or artifact_max_entries",
            err.clone(),
        )
        .json("502", "the agent failed", err.clone()),
        &key,
    );
    add(
        &mut d,
        op(
            "get",
            controller::SANDBOX_ARTIFACTS,
            "sandbox_artifact_list",
            "the sandbox's artifacts (also after it was deleted)",
        )
        .query("run", json!({"type": "string"}), "only this run's")
        .json("200", "the artifacts, oldest first", artifacts.clone()),
        &key,
    );
    add(
        &mut d,
        op("get", controller::ARTIFACTS, "artifact_list", "artifacts")
            .query("sandbox", json!({"type": "string"}), "only this sandbox's")
            .query("run", json!({"type": "string"}), "only this run's")
            .json("200", "the artifacts, oldest first", artifacts)
            .json("400", "an unknown query parameter", err.clone()),
        &key,
    );
    add(
        &mut d,
        op(
            "get",
            controller::ARTIFACT,
            "artifact_get",
            "an artifact's bytes (one Range honoured; ETag is its SHA-256)",
        )
        .answer(
            "200",
            "the bytes, with the artifact's content type",
            json!({"*/*": {"schema": binary()}}),
        )
        .answer(
            "206",
            "the range asked for",
            json!({"*/*": {"schema": binary()}}),
        )
        .answer("304", "If-None-Match matched", json!({}))
        .json("404", "no such artifact", err.clone())
        .json("416", "the range cannot be served", err.clone()),
        &key,
    );
    add(
        &mut d,
        op(
            "delete",
            controller::ARTIFACT,
            "artifact_delete",
            "delete an artifact",
        )
        .json("200", "the artifact deleted", artifact)
        .json("404", "no such artifact", err.clone()),
        &key,
    );

    // Through to the agent.
    let image = json!({
        "image/png": {"schema": binary()},
        "image/jpeg": {"schema": binary()},
        "image/webp": {"schema": binary()},
    });
    add(
        &mut d,
        op(
            "get",
            controller::SANDBOX_SCREENSHOT,
            "sandbox_screenshot",
            "the sandbox's screen",
        )
        .query(
            "format",
            json!({"type": "string", "enum": ["png", "jpeg", "webp"]}),
            "image format",
        )
        .query(
            "quality",
            json!({"type": "integer", "minimum": 1, "maximum": 100}),
            "jpeg/webp quality",
        )
        .query(
            "scale",
            json!({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
            "downscale factor",
        )
        .answer("200", "the image", image)
        .json("409", "not running", err.clone()),
        &key,
    );
    let o = op(
        "post",
        controller::SANDBOX_COMPUTER,
        "sandbox_computer",
        "a computer-use action (Anthropic's or OpenAI's) or a batch, run by the sandbox's agent",
    )
    .json("409", "not running", err.clone());
    let o = computer_op(&mut d, o, &err);
    add(&mut d, o, &key);
    add(
        &mut d,
        op(
            "get",
            controller::SANDBOX_FILES,
            "sandbox_files_get",
            "download a file from the sandbox",
        )
        .required_query("path", string(), "absolute, or relative to the home")
        .answer(
            "200",
            "the bytes",
            json!({"application/octet-stream": {"schema": binary()}}),
        )
        .answer(
            "206",
            "the requested range",
            json!({"application/octet-stream": {"schema": binary()}}),
        )
        .json("409", "not running", err.clone()),
        &key,
    );
    let uploaded = d.schema::<UploadResult>();
    add(
        &mut d,
        op(
            "put",
            controller::SANDBOX_FILES,
            "sandbox_files_put",
            "upload a file to the sandbox",
        )
        .required_query("path", string(), "absolute, or relative to the home")
        .body("application/octet-stream", binary())
        .json("201", "written", uploaded)
        .json("409", "not running", err.clone()),
        &key,
    );

    // The viewer: API key or the viewer cookie.
    add(
        &mut d,
        op(
            "get",
            controller::VNC_INDEX,
            "sandbox_vnc_index",
            "the noVNC page",
        )
        .query("t", string(), "a one-time viewer token (sets the cookie)")
        .answer("303", "to the page", json!({})),
        &viewer,
    );
    add(
        &mut d,
        op(
            "get",
            controller::VNC_WS,
            "sandbox_vnc_ws",
            "noVNC's WebSocket",
        )
        .answer("101", "RFB over WebSocket", json!({})),
        &viewer,
    );
    add(
        &mut d,
        op(
            "get",
            controller::VNC_FILE,
            "sandbox_vnc_file",
            "noVNC's static files",
        )
        .answer("200", "the file", json!({"*/*": {"schema": binary()}})),
        &viewer,
    );
    add(
        &mut d,
        op(
            "get",
            controller::STREAM_MP4,
            "sandbox_stream_mp4",
            "the live screen as fragmented MP4",
        )
        .answer(
            "200",
            "the stream",
            json!({"video/mp4": {"schema": binary()}}),
        ),
        &viewer,
    );
    add(
        &mut d,
        op(
            "get",
            controller::STREAM,
            "sandbox_stream_ws",
            "the live screen over a WebSocket",
        )
        .answer("101", "fragmented MP4 in binary messages", json!({})),
        &viewer,
    );

    // Relays: the sandbox's agent (its native API, the agent's token added here) and the
    // preview of a port inside the sandbox (the API key or that port's cookie).
    relay_ops(
        &mut d,
        controller::SANDBOX_AGENT,
        "sandbox_agent",
        "the sandbox's agent /v1/{path} (see the agent's document)",
        &key,
        &err,
    );
    let preview = json!([{"apiKey": []}, {"previewCookie": []}]);
    for (path, id) in [
        (controller::SANDBOX_PORT, "sandbox_preview"),
        (controller::SANDBOX_PORT_ROOT, "sandbox_preview_root"),
        (SANDBOX_PORT_BARE, "sandbox_preview_bare"),
    ] {
        relay_ops(
            &mut d,
            path,
            id,
            "the preview of 127.0.0.1:{port} in the sandbox (HTTP, WebSocket)",
            &preview,
            &err,
        );
    }

    mcp_ops(
        &mut d,
        controller::SANDBOX_MCP,
        "sandbox_mcp",
        "the sandbox's MCP server (its agent's /mcp, relayed)",
        &key,
        &err,
    );
    mcp_ops(
        &mut d,
        controller::MCP,
        "controller_mcp",
        "MCP (Streamable HTTP): sandbox and lease tools",
        &key,
        &err,
    );

    let (port_url_req, port_url) = (
        d.schema::<wire::PortUrlRequest>(),
        d.schema::<wire::PortUrl>(),
    );
    add(
        &mut d,
        op(
            "post",
            controller::SANDBOX_PORT_URL,
            "sandbox_port_url",
            "a browser URL for a port's preview",
        )
        .json_body(port_url_req)
        .body_optional()
        .json("201", "the URL (it sets the port's cookie)", port_url)
        .json("409", "not running", err.clone()),
        &key,
    );

    // The session view: minted with the API key, then the API key or the session cookie.
    let session_url = d.schema::<wire::SessionUrl>();
    add(
        &mut d,
        op(
            "post",
            controller::SANDBOX_SESSION,
            "sandbox_session",
            "a one-time URL for the sandbox's session view",
        )
        .json(
            "200",
            "the URL (it sets the session cookie once opened)",
            session_url,
        ),
        &key,
    );
    let session = json!([{"apiKey": []}, {"sessionCookie": []}]);
    add(
        &mut d,
        op(
            "get",
            controller::SESSION_INDEX,
            "sandbox_session_page",
            "the session view: desktop, terminal, files, timeline, artifacts, episode",
        )
        .query(
            "t",
            string(),
            "a one-time session token (sets the cookie, then 303)",
        )
        .answer(
            "200",
            "the page",
            json!({"text/html": {"schema": string()}}),
        )
        .answer("303", "to the page, the cookie set", json!({})),
        &session,
    );
    add(
        &mut d,
        op(
            "get",
            controller::SESSION_PATH,
            "sandbox_session_path",
            "the session view's assets and its api/… routes (info, events, artifacts, \
             episode, and the agent's pty, fs/list, files and vnc/websockify)",
        )
        .answer(
            "200",
            "the asset or answer",
            json!({"*/*": {"schema": binary()}}),
        ),
        &session,
    );

    // Leases.
    let (acq, lease, renew) = (
        d.schema::<wire::AcquireLease>(),
        d.schema::<wire::Lease>(),
        d.schema::<wire::RenewLease>(),
    );
    add(
        &mut d,
        op(
            "post",
            controller::LEASES,
            "lease_acquire",
            "acquire a lease (idempotent per thread_id)",
        )
        .json_body(acq)
        .json("200", "the lease", lease.clone())
        .json("422", "valid but impossible", err.clone())
        .json("503", "no capacity", err.clone()),
        &key,
    );
    add(
        &mut d,
        op(
            "post",
            controller::LEASE_RENEW,
            "lease_renew",
            "extend a lease",
        )
        .json_body(renew)
        .json("200", "the lease", lease)
        .json("409", "released", err.clone()),
        &key,
    );
    add(
        &mut d,
        op(
            "delete",
            controller::LEASE,
            "lease_release",
            "release a lease (destroys its sandbox)",
        )
        .json(
            "200",
            "released",
            json!({"type": "object", "required": ["lease_id", "released"],
                   "properties": {"lease_id": string(), "released": boolean()}}),
        ),
        &key,
    );

    // Images, catalog, pools.
    let (build, job) = (d.schema::<wire::BuildImage>(), d.schema::<wire::ImageJob>());
    add(
        &mut d,
        op(
            "post",
            controller::IMAGES_BUILD,
            "image_build",
            "build an image (a job)",
        )
        .json_body(build)
        .json("200", "built already", job.clone())
        .json("202", "building", job.clone()),
        &key,
    );
    add(
        &mut d,
        op("get", controller::IMAGE, "image_job", "an image job").json("200", "the job", job),
        &key,
    );
    let catalog = d.schema::<wire::CatalogList>();
    add(
        &mut d,
        op("get", controller::CATALOG, "catalog", "the catalog")
            .query(
                "kind",
                json!({"type": "string", "enum": ["profile", "desktop_app", "desktop_app_bundle"]}),
                "what to list (default profile)",
            )
            .json("200", "the entries", catalog),
        &key,
    );
    let (pools, adjust) = (d.schema::<wire::PoolList>(), d.schema::<wire::AdjustPool>());
    add(
        &mut d,
        op("get", controller::POOLS, "pools", "the warm pools").json(
            "200",
            "the pools",
            pools.clone(),
        ),
        &key,
    );
    add(
        &mut d,
        op(
            "put",
            controller::POOL,
            "pool_adjust",
            "pause or resize a warm pool",
        )
        .json_body(adjust)
        .json("200", "the pools", pools),
        &key,
    );

    d.finish(
        json!({
            "title": "berth controller",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Sandboxes, runs, leases, images, the catalog and warm pools; \
                            X-Api-Key on every route but health, metrics, this document and \
                            the viewer's (which also take the viewer cookie).",
        }),
        json!({
            "apiKey": {"type": "apiKey", "in": "header", "name": "X-Api-Key"},
            "viewerCookie": {"type": "apiKey", "in": "cookie", "name": "berth_viewer"},
            "previewCookie": {"type": "apiKey", "in": "cookie", "name": "berth_port",
                              "description": "set by the URL of POST …/ports/{port}/url"},
            "sessionCookie": {"type": "apiKey", "in": "cookie", "name": "berth_session",
                              "description": "set by the URL of POST …/{id}/session"},
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

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

    /// `(module, NAME) → path` for every path constant of `routes.rs`.
    fn constants() -> BTreeMap<(String, String), String> {
        let src = include_str!("routes.rs");
        let mut out = BTreeMap::new();
        let mut module = String::new();
        for line in src.lines() {
            let t = line.trim();
            if let Some(m) = t
                .strip_prefix("pub mod ")
                .and_then(|m| m.strip_suffix(" {"))
            {
                if m != "nested" {
                    module = m.to_string();
                }
                continue;
            }
            let (name, value) = if let Some(rest) = t.strip_prefix("pub const ") {
                let Some((name, v)) = rest.split_once(": &str = ") else {
                    continue;
                };
                (name, v)
            } else if module == "native" && t.contains(" = \"") && !t.starts_with("$") {
                let (name, v) = t.split_once(" = ").unwrap();
                (name, v)
            } else {
                continue;
            };
            let Some(path) = value
                .trim_end_matches(';')
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
            else {
                continue;
            };
            let full = match (module.as_str(), t.starts_with("pub const ")) {
                ("native", false) => format!("/v1{path}"),
                _ => path.to_string(),
            };
            if module != "header" && name != "PREFIX" {
                out.insert((module.clone(), name.to_string()), full);
            }
        }
        out
    }

    /// The `.route(PATH, methods)` calls of a router source: `(path template, method)`.
    fn routes_in(
        src: &str,
        surface: &str,
        nested: bool,
        consts: &BTreeMap<(String, String), String>,
    ) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut rest = src;
        // `.route(PATH, methods)`, and `.route_service(PATH, svc)` (a tower service, e.g. an
        // MCP server: every method).
        let next = |rest: &str| {
            [".route(", ".route_service("]
                .into_iter()
                .filter_map(|n| rest.find(n).map(|at| (at, n)))
                .min()
        };
        while let Some((at, needle)) = next(rest) {
            rest = &rest[at + needle.len()..];
            let service = needle == ".route_service(";
            // The call's argument text, to its closing parenthesis.
            let mut depth = 1;
            let mut end = 0;
            for (i, c) in rest.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    end = i;
                    break;
                }
            }
            let args = &rest[..end];
            let (first, methods) = args.split_once(',').unwrap_or((args, ""));
            let first = first.trim();
            let path = if let Some(lit) = first.strip_prefix('"').and_then(|f| f.strip_suffix('"'))
            {
                match nested {
                    true => format!("/v1{lit}"),
                    false => lit.to_string(),
                }
            } else {
                // A constant: `routes::controller::SANDBOX`, `nested::EXEC`, `compat::FILE`, …
                // (possibly `.trim_end_matches('/')`-ed).
                let end = first
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                    .unwrap_or(first.len());
                let (first, tail) = first.split_at(end);
                let trim = tail.contains("trim_end_matches('/')");
                let name = first.rsplit("::").next().unwrap().to_string();
                let module = if first.contains("nested") || first.contains("native") {
                    "native"
                } else if first.contains("compat") {
                    "compat"
                } else if first.contains("controller") {
                    "controller"
                } else {
                    surface
                };
                let path = consts
                    .get(&(module.to_string(), name.clone()))
                    .unwrap_or_else(|| panic!("route constant {first} is not in routes.rs"));
                match trim {
                    true => path.trim_end_matches('/').to_string(),
                    false => path.clone(),
                }
            };
            // `any_service(svc)` (a tower service) is an `any` route.
            let methods = match service {
                true => "any()".to_string(),
                false => methods.replace("any_service(", "any("),
            };
            for m in ["get", "post", "put", "delete", "patch", "any"] {
                let needle = format!("{m}(");
                let found = methods.match_indices(&needle).any(|(i, _)| {
                    i == 0 || {
                        let before = methods.as_bytes()[i - 1];
                        !(before.is_ascii_alphanumeric() || before == b'_')
                    }
                });
                if found {
                    out.push((path.clone(), m.to_string()));
                }
            }
        }
        out
    }

    /// A router source file, the surface its bare constants belong to, and whether its
    /// literals are relative to the `/v1` nest.
    type Source = (PathBuf, &'static str, bool);

    fn sources(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                let p = e.path();
                if p.is_dir() {
                    out.extend(sources(&p));
                } else if p.extension().is_some_and(|x| x == "rs") {
                    out.push(p);
                }
            }
        }
        out
    }

    /// Every route the agent's and the controller's routers register is in their document,
    /// with its method, and every documented operation is registered: read from the routers'
    /// sources, constants resolved through `routes.rs`.
    #[test]
    fn every_registered_route_is_documented() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        if !root.join("agent/src/server.rs").exists() {
            println!("skipped: the workspace's router sources are not beside this crate");
            return;
        }
        let consts = constants();
        assert!(
            consts.len() > 60,
            "routes.rs parsed to {} constants",
            consts.len()
        );
        let surfaces: [(&str, Value, Vec<Source>); 2] = [
            (
                "agent",
                agent(),
                [
                    sources(&root.join("agent/src/api"))
                        .into_iter()
                        .map(|p| (p, "native", true))
                        .collect::<Vec<_>>(),
                    sources(&root.join("agent/src/compat"))
                        .into_iter()
                        .map(|p| (p, "compat", false))
                        .collect(),
                    sources(&root.join("agent/src/mcp"))
                        .into_iter()
                        .map(|p| (p, "native", false))
                        .collect(),
                    vec![(root.join("agent/src/server.rs"), "native", false)],
                ]
                .concat(),
            ),
            (
                "controller",
                controller(),
                [
                    sources(&root.join("controller/src/api")),
                    vec![root.join("controller/src/mcp.rs")],
                ]
                .concat()
                .into_iter()
                .filter(|p| p.exists())
                .map(|p| (p, "controller", false))
                .collect(),
            ),
        ];
        for (name, doc, files) in surfaces {
            let documented: BTreeSet<(String, String)> = operations(&doc)
                .into_iter()
                .map(|o| (o.path, o.method))
                .collect();
            let mut registered = BTreeSet::new();
            for (file, surface, nested) in &files {
                let src = std::fs::read_to_string(file).unwrap();
                for (path, method) in routes_in(&src, surface, *nested, &consts) {
                    registered.insert((openapi_path(&path), method));
                }
            }
            let missing: Vec<_> = registered
                .iter()
                .filter(|(p, m)| match m.as_str() {
                    // An `any` route (a proxy) is documented by at least its GET.
                    "any" => !documented.contains(&(p.clone(), "get".to_string())),
                    _ => !documented.contains(&(p.clone(), m.clone())),
                })
                .collect();
            let unserved: Vec<_> = documented
                .iter()
                .filter(|(p, m)| {
                    !registered.contains(&(p.clone(), m.clone()))
                        && !registered.contains(&(p.clone(), "any".to_string()))
                })
                .collect();
            println!(
                "{name}: {} routes registered, {} operations documented",
                registered.len(),
                documented.len()
            );
            assert!(
                missing.is_empty(),
                "{name}: registered but not documented: {missing:?}"
            );
            assert!(
                unserved.is_empty(),
                "{name}: documented but not registered: {unserved:?}"
            );
        }
    }
}
