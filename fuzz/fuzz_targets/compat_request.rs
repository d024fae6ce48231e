//! The compat routes' body parsing: the `CompatJson` and `FormFields` extractors every
//! OSWorld-compatible handler takes its input from, and the Python semantics
//! (`shlex.split`, `expandvars`, `expanduser`) applied to the fields.
//!
//! Input: one control byte, a `Content-Type` line, then the body.
//! - control % 16: the body arrives in chunks of that many bytes (0: one chunk), as a client
//!   sending slowly would deliver it;
//! - control & 0x40: a `Content-Length` header is sent, the body's true length, or with
//!   control & 0x80 as well, one past the compat limit (the drained 413 path).
//! An empty Content-Type line sends no Content-Type header.
#![no_main]

use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use axum::response::Response;
use berth_agent::compat::python::{expanduser, expandvars, shlex_split};
use berth_agent::compat::{COMPAT_JSON_LIMIT, CompatJson, FormFields};
use berth_agent::http::extract::is_json;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime")
    })
}

struct Input<'a> {
    chunk: usize,
    length: Option<u64>,
    content_type: Option<&'a [u8]>,
    body: &'a [u8],
}

fn split(data: &[u8]) -> Option<Input<'_>> {
    let (&control, rest) = data.split_first()?;
    let nl = rest.iter().position(|&b| b == b'\n')?;
    let (ct, body) = (&rest[..nl], &rest[nl + 1..]);
    let length = (control & 0x40 != 0).then(|| {
        if control & 0x80 != 0 {
            COMPAT_JSON_LIMIT as u64 + 1
        } else {
            body.len() as u64
        }
    });
    Some(Input {
        chunk: usize::from(control % 16),
        length,
        content_type: (!ct.is_empty()).then_some(ct),
        body,
    })
}

/// The request a client would send to a compat route, its body streamed in chunks. `None`
/// when the Content-Type bytes cannot be a header value (hyper would have refused them).
fn request(input: &Input<'_>, path: &str) -> Option<Request> {
    let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = if input.chunk == 0 {
        vec![Ok(bytes::Bytes::copy_from_slice(input.body))]
    } else {
        input
            .body
            .chunks(input.chunk)
            .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
            .collect()
    };
    let mut b = Request::builder().method("POST").uri(path);
    if let Some(ct) = input.content_type {
        b = b.header(
            header::CONTENT_TYPE,
            header::HeaderValue::from_bytes(ct).ok()?,
        );
    }
    if let Some(len) = input.length {
        b = b.header(header::CONTENT_LENGTH, len);
    }
    b.body(Body::from_stream(futures_util::stream::iter(chunks)))
        .ok()
}

/// A compat rejection: a 4xx in the reference server's error shape, never a 5xx.
async fn assert_compat_error(resp: Response, allowed: &[StatusCode]) {
    let status = resp.status();
    assert!(
        allowed.contains(&status),
        "rejected with {status}, expected one of {allowed:?}"
    );
    assert_eq!(
        resp.headers().get(header::CONTENT_TYPE).unwrap(),
        "application/json"
    );
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .expect("the error body is in memory");
    let v: Value = serde_json::from_slice(&body).expect("the error body is JSON");
    assert_eq!(v["status"], "error", "{v}");
    assert!(v["message"].is_string(), "{v}");
}

/// The Content-Type as the extractors read it: a header that is not visible ASCII reads as
/// none.
fn content_type(input: &Input<'_>) -> String {
    input
        .content_type
        .and_then(|ct| header::HeaderValue::from_bytes(ct).ok())
        .and_then(|v| v.to_str().ok().map(str::to_string))
        .unwrap_or_default()
}

async fn compat_json(input: &Input<'_>) {
    let Some(req) = request(input, "/execute") else {
        return;
    };
    let ct = content_type(input);
    match CompatJson::from_request(req, &()).await {
        Ok(CompatJson(map)) => {
            assert!(is_json(&ct), "parsed a body declared {ct:?}");
            assert!(input.length.is_none_or(|l| l <= COMPAT_JSON_LIMIT as u64));
            let whole: Value = serde_json::from_slice(input.body).expect("the body parsed");
            assert_eq!(whole, Value::Object(map));
        }
        Err(resp) => {
            let want: &[StatusCode] = if !is_json(&ct) {
                &[StatusCode::UNSUPPORTED_MEDIA_TYPE]
            } else if input.length.is_some_and(|l| l > COMPAT_JSON_LIMIT as u64) {
                &[StatusCode::PAYLOAD_TOO_LARGE]
            } else {
                &[StatusCode::BAD_REQUEST]
            };
            assert_compat_error(resp, want).await;
        }
    }
}

async fn form_fields(input: &Input<'_>) {
    let Some(req) = request(input, "/file") else {
        return;
    };
    let ct = content_type(input).to_ascii_lowercase();
    let urlencoded = ct.starts_with("application/x-www-form-urlencoded");
    let multipart = ct.starts_with("multipart/form-data");
    match FormFields::from_request(req, &()).await {
        Ok(FormFields(fields)) => {
            if urlencoded {
                let segments = input
                    .body
                    .split(|&b| b == b'&')
                    .filter(|s| !s.is_empty())
                    .count();
                assert!(fields.len() <= segments);
                if input.body.is_ascii()
                    && !input.body.contains(&b'%')
                    && !input.body.contains(&b'+')
                {
                    // Nothing to decode: the fields are the pairs as sent, the first of each
                    // name kept (Flask's `request.form[name]`).
                    let mut want = HashMap::new();
                    for kv in std::str::from_utf8(input.body).unwrap().split('&') {
                        if kv.is_empty() {
                            continue;
                        }
                        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                        want.entry(k.to_string()).or_insert_with(|| v.to_string());
                    }
                    assert_eq!(fields, want);
                }
            } else if !multipart {
                assert!(fields.is_empty(), "fields from a body declared {ct:?}");
            }
        }
        Err(resp) => {
            assert!(urlencoded || multipart, "rejected a body declared {ct:?}");
            assert_compat_error(
                resp,
                &[StatusCode::BAD_REQUEST, StatusCode::PAYLOAD_TOO_LARGE],
            )
            .await;
        }
    }
}

/// What the handlers do with a field's text: `shlex.split` for a command without a shell,
/// `expandvars`/`expanduser` for paths.
fn python(text: &str) {
    if let Err(m) = shlex_split(text) {
        assert!(
            m == "No closing quotation" || m == "No escaped character",
            "{m}"
        );
    }
    // Unknown names stay as written.
    assert_eq!(expandvars(text, &|_| None), text);
    let known = expandvars(text, &|name| Some(format!("<{name}>")));
    if !text.contains('$') {
        assert_eq!(known, text);
    }
    // `~` and `~/…` are the sandbox home; a path not starting with `~` is left alone.
    let home = Path::new("/home/user");
    if !text.starts_with('~') {
        assert_eq!(expanduser(text, home, "user"), text);
    } else if text == "~" || text.starts_with("~/") {
        let out = expanduser(text, home, "user");
        assert_eq!(out, format!("/home/user{}", &text[1..]));
    }
}

fuzz_target!(|data: &[u8]| {
    let Some(input) = split(data) else {
        return;
    };
    runtime().block_on(async {
        compat_json(&input).await;
        form_fields(&input).await;
    });
    python(&String::from_utf8_lossy(input.body));
});
