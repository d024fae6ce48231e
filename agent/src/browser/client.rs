//! A long-lived CDP connection to the desktop's browser for the browser toolset: calls answered
//! by id while a reader task takes every message, so the page's events are seen as they happen —
//! a dialog is dismissed at once (a page blocked on `alert()` would hang every later call),
//! console and network entries are kept per page, downloads and navigations counted.
//!
//! Everything kept is bounded: at most [`MAX_PENDING`] calls in flight, [`MAX_ENTRIES`] console
//! and network entries a page (the oldest dropped, and counted), [`MAX_NOTICES`] dialogs and
//! downloads waiting to be reported.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_protocol::sync::Locked;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;

/// Calls in flight at once.
pub const MAX_PENDING: usize = 64;
/// Console or network entries kept per page.
pub const MAX_ENTRIES: usize = 1000;
/// Dialogs and download changes kept until reported.
pub const MAX_NOTICES: usize = 100;
/// The longest a CDP call may take unless its caller says otherwise.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// A page dialog the reader dismissed.
#[derive(Debug, Clone, PartialEq)]
pub struct Dialog {
    pub kind: String,
    pub message: String,
}

/// What a page did that the toolset reports or reads later.
#[derive(Debug, Default)]
pub struct PageLog {
    pub console: VecDeque<String>,
    pub console_dropped: u64,
    pub network: VecDeque<Request>,
    pub network_dropped: u64,
    /// Main-frame navigations (new documents and same-document ones).
    pub navigations: u64,
    /// `load` events of the main frame.
    pub loads: u64,
}

/// One network request as `read_network` lists it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Request {
    pub id: String,
    pub method: String,
    pub url: String,
    pub status: Option<i64>,
    pub mime: String,
    pub started: f64,
    pub finished: Option<f64>,
    pub failed: Option<String>,
}

#[derive(Default)]
struct Shared {
    pending: HashMap<u64, oneshot::Sender<Result<Value, String>>>,
    /// By CDP session id.
    pages: HashMap<String, PageLog>,
    dialogs: VecDeque<Dialog>,
    downloads: VecDeque<Value>,
    /// Download URLs by guid, for the progress events that do not carry one.
    download_urls: HashMap<String, String>,
}

pub struct Client {
    out: mpsc::Sender<Message>,
    next_id: AtomicU64,
    shared: Arc<Mutex<Shared>>,
    closed: Arc<AtomicBool>,
}

fn lock(m: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    m.locked()
}

fn push_bounded<T>(q: &mut VecDeque<T>, item: T, max: usize) -> bool {
    let dropped = q.len() >= max;
    if dropped {
        q.pop_front();
    }
    q.push_back(item);
    dropped
}

impl Client {
    /// Connects to the browser target at `url` (`ws://…/devtools/browser/<id>`).
    pub async fn connect(url: &str) -> Result<Arc<Client>, String> {
        let (ws, _) = tokio::time::timeout(CALL_TIMEOUT, tokio_tungstenite::connect_async(url))
            .await
            .map_err(|_| "the browser did not answer".to_string())?
            .map_err(|e| format!("the browser refused the connection: {e}"))?;
        let (mut sink, mut stream) = ws.split();
        let (out, mut rx) = mpsc::channel::<Message>(MAX_PENDING);
        let shared = Arc::new(Mutex::new(Shared::default()));
        let closed = Arc::new(AtomicBool::new(false));
        let client = Arc::new(Client {
            out: out.clone(),
            next_id: AtomicU64::new(1),
            shared: shared.clone(),
            closed: closed.clone(),
        });
        tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                if sink.send(m).await.is_err() {
                    break;
                }
            }
        });
        let dismisser = Arc::downgrade(&client);
        tokio::spawn(async move {
            while let Some(Ok(m)) = stream.next().await {
                let Message::Text(t) = m else { continue };
                let Ok(v) = serde_json::from_str::<Value>(t.as_str()) else {
                    continue;
                };
                if let Some(id) = v.get("id").and_then(Value::as_u64) {
                    let answer = match v.get("error") {
                        Some(e) => Err(e["message"].as_str().unwrap_or("error").to_string()),
                        None => Ok(v.get("result").cloned().unwrap_or(Value::Null)),
                    };
                    if let Some(tx) = lock(&shared).pending.remove(&id) {
                        let _ = tx.send(answer);
                    }
                    continue;
                }
                let method = v["method"].as_str().unwrap_or_default();
                let session = v["sessionId"].as_str().unwrap_or_default().to_string();
                if method == "Page.javascriptDialogOpening" {
                    // Answered from here: the call that made the page open it may be waiting.
                    if let Some(c) = dismisser.upgrade() {
                        let accept = v["params"]["type"] == "beforeunload";
                        c.send_only(
                            "Page.handleJavaScriptDialog",
                            json!({"accept": accept}),
                            Some(&session),
                        );
                    }
                }
                record_event(&mut lock(&shared), method, &session, &v["params"]);
            }
            closed.store(true, Ordering::SeqCst);
            // Every call still waiting learns the connection is gone.
            lock(&shared).pending.clear();
        });
        Ok(client)
    }

    /// Ends the connection (a close frame; the reader then stops).
    pub async fn close(&self) {
        let _ = self.out.send(Message::Close(None)).await;
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    fn message(&self, id: u64, method: &str, params: Value, session: Option<&str>) -> Message {
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = s.into();
        }
        Message::text(msg.to_string())
    }

    /// Sends without waiting for the answer (the reader drops it).
    fn send_only(&self, method: &str, params: Value, session: Option<&str>) {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let _ = self.out.try_send(self.message(id, method, params, session));
    }

    /// `method` on the browser, or on an attached page's `session`: its `result`.
    pub async fn call(
        &self,
        method: &str,
        params: Value,
        session: Option<&str>,
    ) -> Result<Value, String> {
        self.call_within(method, params, session, CALL_TIMEOUT)
            .await
    }

    pub async fn call_within(
        &self,
        method: &str,
        params: Value,
        session: Option<&str>,
        timeout: Duration,
    ) -> Result<Value, String> {
        if self.is_closed() {
            return Err("the browser connection closed".into());
        }
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = oneshot::channel();
        {
            let mut s = lock(&self.shared);
            if s.pending.len() >= MAX_PENDING {
                return Err("too many browser calls at once".into());
            }
            s.pending.insert(id, tx);
        }
        let message = self.message(id, method, params, session);
        // The send is inside the deadline too: a writer stuck on a full socket times out.
        let answer = tokio::time::timeout(timeout, async {
            if self.out.send(message).await.is_err() {
                return Err("the browser connection closed".to_string());
            }
            rx.await
                .unwrap_or_else(|_| Err("the browser connection closed".into()))
        })
        .await;
        lock(&self.shared).pending.remove(&id);
        answer.unwrap_or_else(|_| Err(format!("{method} timed out")))
    }

    /// Reads (and may change) a page's log.
    pub fn page<R>(&self, session: &str, f: impl FnOnce(&mut PageLog) -> R) -> R {
        f(lock(&self.shared)
            .pages
            .entry(session.to_string())
            .or_default())
    }

    pub fn forget_page(&self, session: &str) {
        lock(&self.shared).pages.remove(session);
    }

    /// The dialogs dismissed and download changes seen since the last call, taken.
    pub fn take_notices(&self) -> (Vec<Dialog>, Vec<Value>) {
        let mut s = lock(&self.shared);
        (
            s.dialogs.drain(..).collect(),
            s.downloads.drain(..).collect(),
        )
    }
}

/// Folds one event into what is kept. Pure but for its target.
fn record_event(s: &mut Shared, method: &str, session: &str, p: &Value) {
    match method {
        "Page.javascriptDialogOpening" => {
            push_bounded(
                &mut s.dialogs,
                Dialog {
                    kind: text(&p["type"]),
                    message: text(&p["message"]),
                },
                MAX_NOTICES,
            );
        }
        "Page.frameNavigated" if p["frame"]["parentId"].is_null() => {
            s.pages.entry(session.into()).or_default().navigations += 1;
        }
        "Page.navigatedWithinDocument" => {
            s.pages.entry(session.into()).or_default().navigations += 1;
        }
        "Page.loadEventFired" => {
            s.pages.entry(session.into()).or_default().loads += 1;
        }
        "Runtime.consoleAPICalled" => push_console(s, session, console_call_line(p)),
        "Runtime.exceptionThrown" => push_console(s, session, exception_line(p)),
        "Network.requestWillBeSent" => record_request(s, session, p),
        "Network.responseReceived" | "Network.loadingFinished" | "Network.loadingFailed" => {
            record_request_outcome(s, method, session, p)
        }
        "Browser.downloadWillBegin" => record_download_start(s, p),
        "Browser.downloadProgress" => record_download_progress(s, p),
        "Target.detachedFromTarget" => {
            if let Some(id) = p["sessionId"].as_str() {
                s.pages.remove(id);
            }
        }
        _ => {}
    }
}

/// A string field of an event, empty when absent.
fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// A `console.*` call as one line: `[type] args…`.
fn console_call_line(p: &Value) -> String {
    let args: Vec<String> = p["args"]
        .as_array()
        .map(|a| a.iter().map(remote_text).collect())
        .unwrap_or_default();
    format!("[{}] {}", text(&p["type"]), args.join(" "))
}

/// An uncaught exception as one console line.
fn exception_line(p: &Value) -> String {
    let d = &p["exceptionDetails"];
    let what = d["exception"]["description"]
        .as_str()
        .or(d["text"].as_str())
        .unwrap_or("exception");
    format!("[exception] {what}")
}

/// Keeps a console line in the page's log (the oldest dropped, and counted, when full).
fn push_console(s: &mut Shared, session: &str, line: String) {
    let log = s.pages.entry(session.into()).or_default();
    if push_bounded(&mut log.console, line, MAX_ENTRIES) {
        log.console_dropped += 1;
    }
}

/// Keeps a request the page is about to send (the oldest dropped, and counted, when full).
fn record_request(s: &mut Shared, session: &str, p: &Value) {
    let r = Request {
        id: text(&p["requestId"]),
        method: text(&p["request"]["method"]),
        url: text(&p["request"]["url"]),
        started: p["timestamp"].as_f64().unwrap_or_default(),
        ..Default::default()
    };
    let log = s.pages.entry(session.into()).or_default();
    if push_bounded(&mut log.network, r, MAX_ENTRIES) {
        log.network_dropped += 1;
    }
}

/// Notes a kept request's response, finish or failure.
fn record_request_outcome(s: &mut Shared, method: &str, session: &str, p: &Value) {
    let id = p["requestId"].as_str().unwrap_or_default();
    let log = s.pages.entry(session.into()).or_default();
    if let Some(r) = log.network.iter_mut().rev().find(|r| r.id == id) {
        match method {
            "Network.responseReceived" => {
                r.status = p["response"]["status"].as_i64();
                r.mime = text(&p["response"]["mimeType"]);
            }
            "Network.loadingFinished" => r.finished = p["timestamp"].as_f64(),
            _ => {
                r.finished = p["timestamp"].as_f64();
                r.failed = Some(text(&p["errorText"]));
            }
        }
    }
}

/// A download began: its URL kept for the progress events (which lack it), the change noted.
fn record_download_start(s: &mut Shared, p: &Value) {
    let guid = text(&p["guid"]);
    let url = text(&p["url"]);
    if s.download_urls.len() < MAX_NOTICES {
        s.download_urls.insert(guid.clone(), url.clone());
    }
    push_bounded(
        &mut s.downloads,
        json!({"type": "download_started", "download_id": guid, "url": url}),
        MAX_NOTICES,
    );
}

/// A download completed or was cancelled: the change noted with its URL (other progress is
/// not kept).
fn record_download_progress(s: &mut Shared, p: &Value) {
    let guid = text(&p["guid"]);
    let change = match p["state"].as_str() {
        Some("completed") => json!({"type": "download_completed", "download_id": guid,
            "size_bytes": p["receivedBytes"].as_u64()}),
        Some("canceled") => json!({"type": "download_failed", "download_id": guid,
            "error": "canceled"}),
        _ => return,
    };
    let mut change = change;
    change["url"] = s.download_urls.remove(&guid).unwrap_or_default().into();
    if change["size_bytes"].is_null()
        && let Some(o) = change.as_object_mut()
    {
        o.remove("size_bytes");
    }
    push_bounded(&mut s.downloads, change, MAX_NOTICES);
}

/// A console argument as text: its value, or its description for an object.
fn remote_text(v: &Value) -> String {
    match v.get("value") {
        Some(Value::String(s)) => s.clone(),
        Some(other) if !other.is_null() => other.to_string(),
        _ => v["description"]
            .as_str()
            .or(v["unserializableValue"].as_str())
            .or(v["type"].as_str())
            .unwrap_or_default()
            .to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_kept_bounded_and_per_page() {
        let mut s = Shared::default();
        for i in 0..(MAX_ENTRIES + 5) {
            record_event(
                &mut s,
                "Runtime.consoleAPICalled",
                "p1",
                &json!({"type": "log", "args": [{"type": "string", "value": format!("n{i}")},
                        {"type": "number", "value": 3}]}),
            );
        }
        let log = &s.pages["p1"];
        assert_eq!(log.console.len(), MAX_ENTRIES);
        assert_eq!(log.console_dropped, 5);
        assert_eq!(
            log.console.back().unwrap(),
            &format!("[log] n{} 3", MAX_ENTRIES + 4)
        );
        record_event(
            &mut s,
            "Network.requestWillBeSent",
            "p2",
            &json!({"requestId": "r1", "timestamp": 1.0,
                    "request": {"method": "GET", "url": "http://a.test/"}}),
        );
        record_event(
            &mut s,
            "Network.responseReceived",
            "p2",
            &json!({"requestId": "r1", "response": {"status": 404, "mimeType": "text/html"}}),
        );
        let r = &s.pages["p2"].network[0];
        assert_eq!((r.status, r.mime.as_str()), (Some(404), "text/html"));
        record_event(
            &mut s,
            "Page.frameNavigated",
            "p2",
            &json!({"frame": {"id": "f", "parentId": "main"}}),
        );
        assert_eq!(
            s.pages["p2"].navigations, 0,
            "a child frame is not the page"
        );
        record_event(
            &mut s,
            "Browser.downloadWillBegin",
            "",
            &json!({"guid": "g", "url": "http://a.test/f.zip"}),
        );
        record_event(
            &mut s,
            "Browser.downloadProgress",
            "",
            &json!({"guid": "g", "state": "completed", "receivedBytes": 10}),
        );
        assert_eq!(
            s.downloads[1],
            json!({"type": "download_completed", "download_id": "g",
                   "url": "http://a.test/f.zip", "size_bytes": 10})
        );
        record_event(
            &mut s,
            "Page.javascriptDialogOpening",
            "p2",
            &json!({"type": "confirm", "message": "Sure?"}),
        );
        assert_eq!(s.dialogs[0].kind, "confirm");
    }
}
