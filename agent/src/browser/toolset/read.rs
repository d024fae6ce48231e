//! The page's reading ops: its accessibility tree, text, console and network entries, and a
//! script's value, each answered as text.

use serde_json::{Value, json};

use super::super::client::Request;
use super::plan::{Op, View};
use super::{LOAD_TIMEOUT, MAX_TEXT_ANSWER, PAGE_TEXT, PageCtl, entries, failed, page, stale};
use berth_protocol::toolset::one_line;

impl PageCtl<'_> {
    /// Answers a reading op; `run` sends nothing else here.
    pub(super) async fn read(
        &self,
        op: Op,
        view: &View,
        origin: (f64, f64),
    ) -> Result<String, String> {
        match op {
            Op::ReadPage {
                depth,
                filter,
                root,
            } => {
                let (ax, boxes, viewport) = self.page_tree(origin, view).await?;
                let p = page::Page::new(&ax, boxes, viewport);
                p.read(filter, depth, root).ok_or_else(|| match root {
                    Some(id) => stale(id),
                    None => failed(self.name),
                })
            }
            Op::Find(query) => {
                let (ax, boxes, viewport) = self.page_tree(origin, view).await?;
                let p = page::Page::new(&ax, boxes, viewport);
                Ok(p.find(&query))
            }
            Op::PageText => {
                let v = self.eval(PAGE_TEXT).await?;
                let text: String = v
                    .as_str()
                    .unwrap_or_default()
                    .chars()
                    .take(MAX_TEXT_ANSWER)
                    .collect();
                Ok(text)
            }
            Op::ReadConsole => Ok(self.read_console()),
            Op::ReadNetwork => Ok(self.read_network()),
            Op::Javascript(code) => self.javascript(code).await,
            // Not a reading op: `run` never sends one here.
            _ => Err(failed(self.name)),
        }
    }

    /// The console lines logged since the last read, taken from the page's log.
    fn read_console(&self) -> String {
        let (lines, dropped) = self.c.page(self.s, |l| {
            let d = std::mem::take(&mut l.console_dropped);
            (l.console.drain(..).collect::<Vec<_>>(), d)
        });
        entries(lines, dropped)
    }

    /// The page's requests, one line each.
    fn read_network(&self) -> String {
        // Every request is listed; a finished one only once, one still loading again
        // on the next read (with its outcome then).
        let (reqs, dropped) = self.c.page(self.s, |l| {
            let d = std::mem::take(&mut l.network_dropped);
            let all: Vec<_> = l.network.iter().cloned().collect();
            l.network.retain(|r| r.finished.is_none());
            (all, d)
        });
        let lines = reqs.iter().map(network_line).collect();
        entries(lines, dropped)
    }

    /// Runs `code` in the page (a promise awaited, at most 30 s) and answers its value as
    /// text; an exception it throws is the error.
    async fn javascript(&self, code: String) -> Result<String, String> {
        let v = self
            .c
            .call_within(
                "Runtime.evaluate",
                json!({"expression": code, "awaitPromise": true, "returnByValue": true,
                       "userGesture": true, "replMode": true}),
                Some(self.s),
                LOAD_TIMEOUT,
            )
            .await
            .map_err(|_| "The script did not finish within 30 s.".to_string())?;
        if let Some(d) = v.get("exceptionDetails") {
            let what = d["exception"]["description"]
                .as_str()
                .or(d["text"].as_str())
                .unwrap_or("an exception");
            let first = what.lines().next().unwrap_or_default();
            return Err(format!("The script threw: {}", one_line(first)));
        }
        let r = &v["result"];
        let text = match &r["value"] {
            Value::String(s) => s.clone(),
            Value::Null if r["type"] == "undefined" => "undefined".into(),
            Value::Null => r["description"].as_str().unwrap_or("null").to_string(),
            other => other.to_string(),
        };
        Ok(text)
    }
}

/// One request as `read_network` lists it: method, URL, outcome, type and time taken.
fn network_line(r: &Request) -> String {
    let status = match (&r.failed, r.status) {
        (Some(e), _) => format!("failed {e}"),
        (None, Some(s)) => s.to_string(),
        (None, None) => "pending".into(),
    };
    let ms = r
        .finished
        .map(|f| format!(" {:.0} ms", (f - r.started) * 1000.0))
        .unwrap_or_default();
    let mime = if r.mime.is_empty() {
        String::new()
    } else {
        format!(" {}", r.mime)
    };
    one_line(&format!("{} {} {status}{mime}{ms}", r.method, r.url))
}
