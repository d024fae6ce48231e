//! Following a sequence-numbered source live, over a WebSocket or server-sent events.
//!
//! Followers pull: each one reads the source from its own cursor, so the producer never waits
//! for anyone and one follower never waits for another. A follower whose send does not
//! complete within its stall limit is dropped with `{"lagged": true, "resume_from_seq": N}`
//! (delivered after whatever was already in flight, if the client reads again); reconnecting with `from_seq=N` replays from there (the source keeps everything up to its
//! cap), and clients drop duplicates by `seq`.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::sync::{mpsc, watch};

/// Default time a send may take before the follower counts as lagging.
pub const DEFAULT_STALL: Duration = Duration::from_secs(10);
/// After a stall, how long the lagged notice may wait for the client to read again before the
/// connection is dropped unannounced.
const LAG_NOTICE_TIMEOUT: Duration = Duration::from_secs(60);
const KEEPALIVE: Duration = Duration::from_secs(15);

/// What a followed source hands out from a cursor.
pub struct Batch {
    /// Each message's JSON text with the sequence number it starts at.
    pub messages: Vec<(u64, String)>,
    pub next: u64,
    /// The source has ended: this is the last message.
    pub end: Option<String>,
}

pub trait Followable: Send + Sync + 'static {
    fn batch(&self, cursor: u64) -> Batch;
    fn subscribe(&self) -> watch::Receiver<u64>;
    /// Counts live followers (for the source's stats); the guard uncounts on drop.
    fn attach(&self) -> Option<Box<dyn Send>> {
        None
    }
    /// A follower was dropped for lagging.
    fn lagged(&self) {}
}

pub trait FollowSink: Send {
    /// Sends one message; `false` when the client is gone.
    fn send(&mut self, text: String) -> impl Future<Output = bool> + Send;
    fn ping(&mut self) -> impl Future<Output = bool> + Send;
    /// Resolves when the client closed its side.
    fn closed(&mut self) -> impl Future<Output = ()> + Send;
    fn finish(self) -> impl Future<Output = ()> + Send;
}

/// Runs one follower until the source ends, the client leaves, or the follower lags.
pub async fn drive<F: Followable, S: FollowSink>(
    src: Arc<F>,
    from: u64,
    mut sink: S,
    stall: Duration,
) {
    let _attached = src.attach();
    let mut changes = src.subscribe();
    let mut cursor = from;
    loop {
        changes.borrow_and_update();
        let batch = src.batch(cursor);
        let progressed = !batch.messages.is_empty();
        for (seq, text) in batch.messages {
            match tokio::time::timeout(stall, sink.send(text)).await {
                Ok(true) => {}
                Ok(false) => return,
                Err(_) => {
                    tracing::debug!(seq, ?stall, "follower stalled; dropping it as lagged");
                    src.lagged();
                    // Lagging: read nothing more for this follower. The notice queues behind
                    // what is already in flight, so a client that reads again gets it in order.
                    let lag = json!({"lagged": true, "resume_from_seq": seq}).to_string();
                    if let Ok(true) = tokio::time::timeout(LAG_NOTICE_TIMEOUT, sink.send(lag)).await
                    {
                        sink.finish().await;
                    }
                    return;
                }
            }
        }
        cursor = batch.next;
        if let Some(end) = batch.end {
            let _ = tokio::time::timeout(stall, sink.send(end)).await;
            sink.finish().await;
            return;
        }
        if progressed {
            continue;
        }
        tokio::select! {
            r = changes.changed() => if r.is_err() { return },
            _ = sink.closed() => return,
            _ = tokio::time::sleep(KEEPALIVE) => {
                match tokio::time::timeout(stall, sink.ping()).await {
                    Ok(true) => {}
                    _ => return,
                }
            }
        }
    }
}

/// A follower on a WebSocket: text frames out; anything the client sends is drained.
pub struct WsSink {
    tx: futures_util::stream::SplitSink<WebSocket, Message>,
    closed: tokio::sync::oneshot::Receiver<()>,
    is_closed: bool,
}

impl WsSink {
    pub fn new(socket: WebSocket) -> WsSink {
        let (tx, mut rx) = socket.split();
        let (closed_tx, closed) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            while let Some(Ok(m)) = rx.next().await {
                if matches!(m, Message::Close(_)) {
                    break;
                }
            }
            let _ = closed_tx.send(());
        });
        WsSink {
            tx,
            closed,
            is_closed: false,
        }
    }
}

impl FollowSink for WsSink {
    async fn send(&mut self, text: String) -> bool {
        self.tx.send(Message::Text(text.into())).await.is_ok()
    }

    async fn ping(&mut self) -> bool {
        self.tx
            .send(Message::Ping(Default::default()))
            .await
            .is_ok()
    }

    async fn closed(&mut self) {
        if self.is_closed {
            return std::future::pending().await;
        }
        let _ = (&mut self.closed).await;
        self.is_closed = true;
    }

    async fn finish(mut self) {
        let _ =
            tokio::time::timeout(Duration::from_secs(1), self.tx.send(Message::Close(None))).await;
    }
}

/// A follower on server-sent events: one `data:` line per message.
pub struct SseSink {
    tx: mpsc::Sender<Result<SseEvent, Infallible>>,
}

impl FollowSink for SseSink {
    async fn send(&mut self, text: String) -> bool {
        self.tx
            .send(Ok(SseEvent::default().data(text)))
            .await
            .is_ok()
    }

    async fn ping(&mut self) -> bool {
        self.tx
            .send(Ok(SseEvent::default().comment("keepalive")))
            .await
            .is_ok()
    }

    async fn closed(&mut self) {
        self.tx.closed().await
    }

    async fn finish(self) {}
}

/// Starts an SSE follower and returns its response.
pub fn sse<F: Followable>(src: Arc<F>, from: u64, stall: Duration) -> Response {
    // Capacity 1: a send completes only once the body stream took the previous event, so a
    // stuck client shows up as a stalled send.
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(drive(src, from, SseSink { tx }, stall));
    let stream = tokio_stream_from(rx);
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEPALIVE))
        .into_response()
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Whether the client asked for server-sent events.
pub fn wants_sse(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"))
}

/// Parses an optional `stall_ms` query value.
pub fn stall(ms: Option<u64>) -> Duration {
    ms.map(Duration::from_millis)
        .unwrap_or(DEFAULT_STALL)
        .max(Duration::from_millis(10))
}
