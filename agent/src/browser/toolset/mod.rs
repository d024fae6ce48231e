//! Anthropic's browser toolset (`browser_toolset_20260801`) run in the guest, over CDP to the
//! desktop's own Chromium: a model turn's `tool_use` blocks for the `browser` family run in
//! order and answered with the `tool_result` blocks the `anthropic` SDK's pipeline builds around
//! a driver — the member's content, the lines for dialogs the page opened, and the
//! `browser_state` block (the tabs, the active one marked, tabs opened and downloads since the
//! last block); an `is_error` result at the first failure, and "not executed" for every later
//! call of the turn.
//!
//! - Tabs are the browser's page targets, named by their target id; the active tab is the one
//!   the toolset last opened or switched to (or a tab a page opened during a call).
//! - Element references are `ref_<backend node id>`, from `read_page` and `find`: valid while
//!   the document lives, stale after a navigation.
//! - Coordinates are in the toolset's screenshot pixels: the viewport fitted to the model's
//!   image limits, mapped back to CSS pixels.
//! - Input goes through CDP's input events, so it reaches the tab it names even when another
//!   window covers it.
//! - Error texts are fixed phrases; the only page text in them is a script's own exception.

mod input;
pub mod keys;
pub mod page;
pub mod plan;
mod read;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use berth_protocol::toolset::{
    BROWSER_FAMILY, BROWSER_MEMBERS, BROWSER_NOT_EXECUTED, BROWSER_TOOLSET_TYPE, BrowserResult,
    BrowserToolsetInfo, acknowledgment, bounded_line, bounded_url, browser_member, image_block,
    invalid_input, one_line, text_block, tool_result, unavailable_member,
};
use serde_json::{Value, json};

use super::client::{Client, Dialog};
use crate::desktop::Desktop;
use keys::Chord;
use plan::{Nav, Op, Target, View};

/// How long a turn waits for a browser that is starting.
const BROWSER_WAIT: Duration = Duration::from_secs(30);
/// How long a navigation may take to load.
const LOAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a page may take to draw after an action.
const FRAME_TIMEOUT: Duration = Duration::from_secs(1);
/// The most characters `get_page_text` answers.
const MAX_TEXT_ANSWER: usize = 100_000;
/// The most dialog lines a result carries (then a count of the rest), and a message's length.
const DIALOG_LINES: usize = 3;
const DIALOG_MESSAGE: usize = 200;

/// The browser toolset of one agent: its configuration and its connection to the browser.
pub struct BrowserToolset {
    enabled: Vec<String>,
    driver: tokio::sync::Mutex<Driver>,
}

#[derive(Default)]
struct Driver {
    conn: Option<Conn>,
    /// Tab ids in the order they were first seen.
    order: Vec<String>,
    active: Option<String>,
    /// State changes a failed call drained, for the next block.
    held: Vec<Value>,
    /// Dismissed dialogs not yet told (a tab member's result has no text to tell them in).
    dialogs: Vec<Dialog>,
}

struct Conn {
    client: Arc<Client>,
    browser_path: String,
    /// Attached page sessions by tab id.
    sessions: HashMap<String, String>,
}

#[derive(Debug, Clone)]
struct Tab {
    id: String,
    title: String,
    url: String,
}

/// What a member produced, before it is rendered.
enum Outcome {
    Done,
    Navigated {
        url: String,
        title: String,
        status: Option<i64>,
    },
    Image(String),
    Text(String),
}

/// A turn's answer.
pub struct TurnAnswer {
    pub content: Vec<Value>,
    /// The first failure's text.
    pub error: Option<String>,
}

impl BrowserToolset {
    /// A toolset serving the default members and the optional ones named in `enabled`.
    pub fn new(enabled: &[String]) -> Result<BrowserToolset, String> {
        berth_protocol::toolset::check_browser_enable(enabled)?;
        Ok(BrowserToolset {
            enabled: enabled.iter().filter(|n| !n.is_empty()).cloned().collect(),
            driver: Default::default(),
        })
    }

    pub fn serves(&self, name: &str) -> bool {
        BROWSER_MEMBERS
            .iter()
            .any(|(n, _, on)| *n == name && (*on || self.enabled.iter().any(|e| e == name)))
    }

    /// The members served, in the SDK's order.
    pub fn members(&self) -> Vec<String> {
        BROWSER_MEMBERS
            .iter()
            .filter(|(n, _, _)| self.serves(n))
            .map(|(n, _, _)| n.to_string())
            .collect()
    }

    /// The `tools[]` entry and the active tab's viewport.
    pub async fn info(&self, desktop: &Arc<Desktop>) -> Result<BrowserToolsetInfo, String> {
        let mut d = self.driver.lock().await;
        let c = d.connect(desktop).await?;
        d.tabs(&c).await?;
        let tab = match d.active.clone() {
            Some(t) => t,
            None => d.open_tab(&c).await?,
        };
        let session = d.session(&c, &tab).await?;
        let (view, _) = layout(&c, &session).await?;
        let mut configs = serde_json::Map::new();
        for name in &self.enabled {
            configs.insert(name.clone(), json!({"enabled": true}));
        }
        let mut tool = json!({"type": BROWSER_TOOLSET_TYPE});
        if !configs.is_empty() {
            tool["configs"] = Value::Object(configs);
        }
        Ok(BrowserToolsetInfo {
            tool,
            members: self.members(),
            viewport_width_px: view.viewport.0.round() as u32,
            viewport_height_px: view.viewport.1.round() as u32,
            screenshot_width_px: view.shot.0,
            screenshot_height_px: view.shot.1,
        })
    }

    /// Runs a turn's calls (from `toolset_input::calls`) in order, stopping at the first
    /// failure. One turn runs at a time.
    pub async fn run_turn(&self, desktop: &Arc<Desktop>, calls: &[Value]) -> TurnAnswer {
        let mut d = self.driver.lock().await;
        let mut answer = TurnAnswer {
            content: Vec::with_capacity(calls.len()),
            error: None,
        };
        let mut waited = 0.0;
        for call in calls {
            if answer.error.is_some() {
                answer
                    .content
                    .push(tool_result(call, json!(BROWSER_NOT_EXECUTED), true));
                continue;
            }
            let (content, failed) = d.call(self, desktop, call, &mut waited).await;
            let is_error = failed.is_some();
            answer
                .content
                .push(tool_result(call, Value::Array(content), is_error));
            answer.error = failed;
        }
        answer
    }
}

fn browser_down() -> String {
    "The browser is not running.".into()
}

fn failed(name: &str) -> String {
    format!("The {name} action could not be performed in the browser.")
}

fn stale(id: i64) -> String {
    format!(
        "ref_{id} names no element on this page (references go stale when the page changes): \
         read the page again."
    )
}

impl Driver {
    async fn connect(&mut self, desktop: &Arc<Desktop>) -> Result<Arc<Client>, String> {
        let dt = desktop
            .browser(BROWSER_WAIT)
            .await
            .ok_or_else(browser_down)?;
        if let Some(c) = &self.conn
            && !c.client.is_closed()
            && c.browser_path == dt.browser_path
        {
            return Ok(c.client.clone());
        }
        let client = Client::connect(&format!("ws://127.0.0.1:{}{}", dt.port, dt.browser_path))
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "browser toolset: no CDP connection");
                browser_down()
            })?;
        // Downloads keep the browser's own folder; their progress is reported.
        let _ = client
            .call(
                "Browser.setDownloadBehavior",
                json!({"behavior": "default", "eventsEnabled": true}),
                None,
            )
            .await;
        self.conn = Some(Conn {
            client: client.clone(),
            browser_path: dt.browser_path,
            sessions: HashMap::new(),
        });
        Ok(client)
    }

    /// The open tabs in the order first seen; the active one kept if it is still open.
    async fn tabs(&mut self, c: &Client) -> Result<Vec<Tab>, String> {
        let v = c
            .call("Target.getTargets", json!({}), None)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "browser toolset: Target.getTargets failed");
                browser_down()
            })?;
        let found: Vec<Tab> = v["targetInfos"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[])
            .iter()
            .filter(|t| t["type"] == "page")
            .filter(|t| {
                let url = t["url"].as_str().unwrap_or_default();
                !url.starts_with("devtools://") && !url.starts_with("chrome-extension://")
            })
            .map(|t| Tab {
                id: t["targetId"].as_str().unwrap_or_default().to_string(),
                title: t["title"].as_str().unwrap_or_default().to_string(),
                url: t["url"].as_str().unwrap_or_default().to_string(),
            })
            .collect();
        self.order.retain(|id| found.iter().any(|t| &t.id == id));
        for t in &found {
            if !self.order.contains(&t.id) {
                self.order.push(t.id.clone());
            }
        }
        if let Some(conn) = &mut self.conn {
            conn.sessions
                .retain(|id, _| found.iter().any(|t| &t.id == id));
        }
        if !self.active.as_ref().is_some_and(|a| self.order.contains(a)) {
            self.active = self.order.last().cloned();
        }
        let mut tabs = Vec::with_capacity(found.len());
        for id in &self.order {
            if let Some(t) = found.iter().find(|t| &t.id == id) {
                tabs.push(t.clone());
            }
        }
        Ok(tabs)
    }

    /// Opens a blank tab in front and makes it active.
    async fn open_tab(&mut self, c: &Client) -> Result<String, String> {
        let v = c
            .call("Target.createTarget", json!({"url": "about:blank"}), None)
            .await
            .map_err(|_| failed("new_tab"))?;
        let id = v["targetId"]
            .as_str()
            .ok_or_else(|| failed("new_tab"))?
            .to_string();
        if !self.order.contains(&id) {
            self.order.push(id.clone());
        }
        self.active = Some(id.clone());
        Ok(id)
    }

    /// The page session of a tab, attached (and its events on) the first time.
    async fn session(&mut self, c: &Client, tab: &str) -> Result<String, String> {
        let conn = self.conn.as_mut().ok_or_else(browser_down)?;
        if let Some(s) = conn.sessions.get(tab) {
            return Ok(s.clone());
        }
        let v = c
            .call(
                "Target.attachToTarget",
                json!({"targetId": tab, "flatten": true}),
                None,
            )
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "browser toolset: Target.attachToTarget failed");
                browser_down()
            })?;
        let s = v["sessionId"]
            .as_str()
            .ok_or_else(browser_down)?
            .to_string();
        for method in ["Page.enable", "Runtime.enable", "Network.enable"] {
            let _ = c.call(method, json!({}), Some(&s)).await;
        }
        conn.sessions.insert(tab.to_string(), s.clone());
        Ok(s)
    }

    /// One call: its content and, when it failed, the failure's text.
    async fn call(
        &mut self,
        toolset: &BrowserToolset,
        desktop: &Arc<Desktop>,
        call: &Value,
        waited: &mut f64,
    ) -> (Vec<Value>, Option<String>) {
        let name = call["name"].as_str().unwrap_or_default();
        let input = call.get("input").cloned().unwrap_or(Value::Null);
        let c = match self.connect(desktop).await {
            Ok(c) => c,
            Err(e) => return (vec![text_block(e.clone())], Some(e)),
        };
        let before = match self.tabs(&c).await {
            Ok(t) => t,
            Err(e) => return (vec![text_block(e.clone())], Some(e)),
        };
        let result = self.run(toolset, &c, name, &input, &before, waited).await;
        let after = self.tabs(&c).await.unwrap_or_default();
        let (dialogs, downloads) = c.take_notices();
        self.dialogs.extend(dialogs);
        let mut changes = std::mem::take(&mut self.held);
        let opened: Vec<String> = after
            .iter()
            .filter(|t| !before.iter().any(|b| b.id == t.id))
            .map(|t| t.id.clone())
            .collect();
        if result.is_ok() {
            for id in &opened {
                changes.push(json!({"type": "tab_opened", "tab_id": id}));
            }
            // A tab a page opened comes to the front, as in the browser's window.
            if name != "new_tab"
                && let Some(id) = opened.last()
            {
                self.active = Some(id.clone());
            }
        }
        changes.extend(downloads);
        let changes = merge_changes(changes, &after);
        match result {
            Ok(outcome) => {
                let kind = browser_member(name).unwrap_or(BrowserResult::StateOnly);
                let block = state_block(&after, self.active.as_deref(), &changes);
                if kind == BrowserResult::StateOnly {
                    return (vec![block], None);
                }
                let mut content = render(kind, &input, outcome);
                content.extend(dialog_lines(&std::mem::take(&mut self.dialogs)));
                content.push(block);
                (content, None)
            }
            Err(e) => {
                self.held = changes;
                let mut content = vec![text_block(e.clone())];
                content.extend(dialog_lines(&std::mem::take(&mut self.dialogs)));
                (content, Some(e))
            }
        }
    }

    async fn run(
        &mut self,
        toolset: &BrowserToolset,
        c: &Arc<Client>,
        name: &str,
        input: &Value,
        tabs: &[Tab],
        waited: &mut f64,
    ) -> Result<Outcome, String> {
        if browser_member(name).is_some() && !toolset.serves(name) {
            return Err(unavailable_member(BROWSER_FAMILY, name));
        }
        // The tab the call names, else the active one (a blank one when none is open).
        let named = input["tab_id"].as_str().filter(|t| !t.is_empty());
        let tab_members = matches!(name, "switch_tab" | "close_tab" | "new_tab" | "list_tabs");
        let tab = match named {
            Some(t) if !tab_members => {
                if !tabs.iter().any(|x| x.id == t) {
                    return Err(invalid_input(
                        BROWSER_FAMILY,
                        name,
                        "tab_id: no open tab has this id",
                    ));
                }
                Some(t.to_string())
            }
            _ => self.active.clone(),
        };
        let (session, view, origin) = if tab_members {
            (None, View::of(1.0, 1.0), (0.0, 0.0))
        } else {
            let tab = match tab {
                Some(t) => t,
                None => self.open_tab(c).await?,
            };
            let session = self.session(c, &tab).await?;
            let (view, origin) = layout(c, &session).await?;
            (Some(session), view, origin)
        };
        let op = plan::plan(name, input, &view)?;
        *waited += op.waits();
        if *waited > plan::MAX_WAIT_SECS {
            return Err(invalid_input(
                BROWSER_FAMILY,
                name,
                "duration: the turn's waits would pass 60 seconds",
            ));
        }
        let Some(session) = session else {
            return self.tab_op(c, op, tabs).await;
        };
        let page = PageCtl {
            c,
            s: &session,
            name,
        };
        page.run(op, &view, origin).await
    }

    async fn tab_op(&mut self, c: &Arc<Client>, op: Op, tabs: &[Tab]) -> Result<Outcome, String> {
        match op {
            Op::NewTab => {
                self.open_tab(c).await?;
            }
            Op::ListTabs => {}
            Op::SwitchTab(id) => {
                if !tabs.iter().any(|t| t.id == id) {
                    return Err(
                        "No open tab has this tab_id: call list_tabs to see the tabs.".into(),
                    );
                }
                c.call("Target.activateTarget", json!({"targetId": id}), None)
                    .await
                    .map_err(|_| failed("switch_tab"))?;
                self.active = Some(id);
            }
            Op::CloseTab(id) => {
                if !tabs.iter().any(|t| t.id == id) {
                    return Err(
                        "No open tab has this tab_id: call list_tabs to see the tabs.".into(),
                    );
                }
                // The browser quits with its last tab: a blank one takes its place.
                if tabs.len() == 1 {
                    self.open_tab(c).await?;
                }
                c.call("Target.closeTarget", json!({"targetId": id}), None)
                    .await
                    .map_err(|_| failed("close_tab"))?;
                let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
                while self.tabs(c).await?.iter().any(|t| t.id == id) {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(failed("close_tab"));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                if self.active.as_deref() == Some(id.as_str()) || self.active.is_none() {
                    self.active = self.order.last().cloned();
                }
                if let Some(a) = self.active.clone() {
                    let _ = c
                        .call("Target.activateTarget", json!({"targetId": a}), None)
                        .await;
                }
            }
            _ => return Err(failed("tab")),
        }
        Ok(Outcome::Done)
    }
}

/// The viewport (CSS pixels) and its scroll offset.
async fn layout(c: &Client, session: &str) -> Result<(View, (f64, f64)), String> {
    let m = c
        .call("Page.getLayoutMetrics", json!({}), Some(session))
        .await
        .map_err(|_| browser_down())?;
    let vv = &m["cssVisualViewport"];
    let w = vv["clientWidth"].as_f64().unwrap_or(1.0);
    let h = vv["clientHeight"].as_f64().unwrap_or(1.0);
    Ok((
        View::of(w, h),
        (
            vv["pageX"].as_f64().unwrap_or_default(),
            vv["pageY"].as_f64().unwrap_or_default(),
        ),
    ))
}

/// One page's session, driven.
struct PageCtl<'a> {
    c: &'a Client,
    s: &'a str,
    name: &'a str,
}

impl PageCtl<'_> {
    async fn cdp(&self, method: &str, params: Value) -> Result<Value, String> {
        self.c
            .call(method, params, Some(self.s))
            .await
            .map_err(|_| failed(self.name))
    }

    async fn eval(&self, expression: &str) -> Result<Value, String> {
        let v = self
            .cdp(
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true}),
            )
            .await?;
        Ok(v["result"]["value"].clone())
    }

    async fn mouse(
        &self,
        kind: &str,
        (x, y): (f64, f64),
        button: &str,
        buttons: u32,
        count: u32,
        modifiers: u32,
    ) -> Result<(), String> {
        self.cdp(
            "Input.dispatchMouseEvent",
            json!({"type": kind, "x": x, "y": y, "button": button, "buttons": buttons,
                   "clickCount": count, "modifiers": modifiers}),
        )
        .await
        .map(|_| ())
    }

    /// Where an element is, scrolled into view: its centre in the viewport.
    async fn point_of(&self, id: i64) -> Result<(f64, f64), String> {
        let _ = self
            .c
            .call(
                "DOM.scrollIntoViewIfNeeded",
                json!({"backendNodeId": id}),
                Some(self.s),
            )
            .await;
        let q = self
            .c
            .call(
                "DOM.getContentQuads",
                json!({"backendNodeId": id}),
                Some(self.s),
            )
            .await
            .map_err(|_| stale(id))?;
        let quad: Vec<f64> = q["quads"][0]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default();
        if quad.len() != 8 {
            return Err(format!("ref_{id} is not shown on the page."));
        }
        let x = (quad[0] + quad[2] + quad[4] + quad[6]) / 4.0;
        let y = (quad[1] + quad[3] + quad[5] + quad[7]) / 4.0;
        Ok((x, y))
    }

    async fn resolve(&self, t: &Target) -> Result<(f64, f64), String> {
        match t {
            Target::Point(x, y) => Ok((*x, *y)),
            Target::Ref(id) => self.point_of(*id).await,
        }
    }

    async fn object(&self, id: i64) -> Result<String, String> {
        let v = self
            .c
            .call(
                "DOM.resolveNode",
                json!({"backendNodeId": id}),
                Some(self.s),
            )
            .await
            .map_err(|_| stale(id))?;
        v["object"]["objectId"]
            .as_str()
            .map(String::from)
            .ok_or_else(|| stale(id))
    }

    async fn key_event(&self, kind: &str, k: &keys::KeyDef, modifiers: u32) -> Result<(), String> {
        let mut e = json!({"type": kind, "key": k.key, "code": k.code,
                           "windowsVirtualKeyCode": k.key_code, "modifiers": modifiers});
        if kind == "keyDown"
            && let Some(t) = &k.text
        {
            e["text"] = t.clone().into();
            e["unmodifiedText"] = t.clone().into();
        }
        self.cdp("Input.dispatchKeyEvent", e).await.map(|_| ())
    }

    async fn chord_down(&self, ch: &Chord) -> Result<(), String> {
        let mut bits = 0;
        for (k, bit) in ch.held.iter().zip(modifier_bits_of(ch)) {
            bits |= bit;
            self.key_event("rawKeyDown", k, bits).await?;
        }
        let kind = if ch.key.text.is_some() {
            "keyDown"
        } else {
            "rawKeyDown"
        };
        self.key_event(kind, &ch.key, ch.modifiers).await
    }

    async fn chord_up(&self, ch: &Chord) -> Result<(), String> {
        self.key_event("keyUp", &ch.key, ch.modifiers).await?;
        let mut bits = ch.modifiers;
        for (k, bit) in ch.held.iter().zip(modifier_bits_of(ch)).rev() {
            bits &= !bit;
            self.key_event("keyUp", k, bits).await?;
        }
        Ok(())
    }

    /// After an action: two frames drawn, and a navigation it started loaded.
    async fn settle(&self, navigations: u64) {
        let _ = self
            .c
            .call_within(
                "Runtime.evaluate",
                json!({"expression": "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))",
                       "awaitPromise": true}),
                Some(self.s),
                FRAME_TIMEOUT,
            )
            .await;
        if self.c.page(self.s, |l| l.navigations) != navigations {
            let _ = self.loaded(Duration::from_secs(10)).await;
        }
    }

    /// Waits (at most `within`) for the document to finish loading.
    async fn loaded(&self, within: Duration) -> Result<(), ()> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let state = self
                .c
                .call_within(
                    "Runtime.evaluate",
                    json!({"expression": "document.readyState", "returnByValue": true}),
                    Some(self.s),
                    within,
                )
                .await;
            if state.is_ok_and(|v| v["result"]["value"] == "complete") {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn navigate(&self, nav: Nav) -> Result<Outcome, String> {
        let navigations = self.c.page(self.s, |l| l.navigations);
        match nav {
            Nav::Url(url) => {
                let v = self
                    .c
                    .call_within(
                        "Page.navigate",
                        json!({"url": url}),
                        Some(self.s),
                        LOAD_TIMEOUT,
                    )
                    .await
                    .map_err(|_| "The page did not answer in time.".to_string())?;
                if let Some(e) = v["errorText"].as_str() {
                    return Err(format!("Navigation failed: {}.", one_line(e)));
                }
            }
            Nav::Reload => {
                self.cdp("Page.reload", json!({})).await?;
            }
            Nav::Back | Nav::Forward => {
                let h = self.cdp("Page.getNavigationHistory", json!({})).await?;
                let at = h["currentIndex"].as_i64().unwrap_or_default();
                let to = if nav == Nav::Back { at - 1 } else { at + 1 };
                let entry = h["entries"]
                    .as_array()
                    .and_then(|e| usize::try_from(to).ok().and_then(|i| e.get(i)))
                    .ok_or_else(|| {
                        format!(
                            "There is no page to go {} to.",
                            if nav == Nav::Back { "back" } else { "forward" }
                        )
                    })?;
                self.cdp(
                    "Page.navigateToHistoryEntry",
                    json!({"entryId": entry["id"]}),
                )
                .await?;
            }
        }
        // The new document, then its load (a slow page is answered as it stands).
        let deadline = tokio::time::Instant::now() + LOAD_TIMEOUT;
        while self.c.page(self.s, |l| l.navigations) == navigations
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = self
            .loaded(deadline.saturating_duration_since(tokio::time::Instant::now()))
            .await;
        let v = self
            .eval(
                "(() => { const n = performance.getEntriesByType('navigation')[0]; \
                 return [location.href, document.title, n && n.responseStatus ? n.responseStatus : 0]; })()",
            )
            .await?;
        let url = v[0].as_str().unwrap_or_default().to_string();
        // Only an HTTP response has a status (the browser reports 200 for a file or data URL).
        let http = url.starts_with("http://") || url.starts_with("https://");
        Ok(Outcome::Navigated {
            title: v[1].as_str().unwrap_or_default().to_string(),
            status: v[2].as_i64().filter(|s| *s > 0 && http),
            url,
        })
    }

    async fn capture(&self, clip: Option<(f64, f64, f64, f64, f64)>) -> Result<Outcome, String> {
        let mut p = json!({"format": "png"});
        if let Some((x, y, w, h, scale)) = clip {
            p["clip"] = json!({"x": x, "y": y, "width": w, "height": h, "scale": scale});
        }
        let v = self
            .c
            .call("Page.captureScreenshot", p, Some(self.s))
            .await
            .map_err(|_| "The page could not be captured.".to_string())?;
        v["data"]
            .as_str()
            .map(|d| Outcome::Image(d.to_string()))
            .ok_or_else(|| "The page could not be captured.".to_string())
    }

    /// The page's accessibility tree, its layout boxes and the viewport, for `read_page` and
    /// `find`.
    async fn page_tree(
        &self,
        origin: (f64, f64),
        view: &View,
    ) -> Result<(Value, HashMap<i64, page::Rect>, page::Rect), String> {
        let ax = self.cdp("Accessibility.getFullAXTree", json!({})).await?;
        let snap = self
            .cdp("DOMSnapshot.captureSnapshot", json!({"computedStyles": []}))
            .await?;
        let viewport = (origin.0, origin.1, view.viewport.0, view.viewport.1);
        Ok((ax, page::boxes(&snap), viewport))
    }

    async fn run(&self, op: Op, view: &View, origin: (f64, f64)) -> Result<Outcome, String> {
        let navigations = self.c.page(self.s, |l| l.navigations);
        let acted = match op {
            Op::Navigate(nav) => return self.navigate(nav).await,
            Op::Screenshot => {
                let (w, h) = view.viewport;
                let s = view.scale();
                let clip = (s < 1.0).then_some((origin.0, origin.1, w, h, s));
                return self.capture(clip).await;
            }
            Op::Zoom((x, y, w, h), (ow, _)) => {
                return self
                    .capture(Some((origin.0 + x, origin.1 + y, w, h, ow as f64 / w)))
                    .await;
            }
            Op::ReadPage { .. }
            | Op::Find(_)
            | Op::PageText
            | Op::ReadConsole
            | Op::ReadNetwork
            | Op::Javascript(_) => return self.read(op, view, origin).await.map(Outcome::Text),
            Op::Wait(secs) => {
                tokio::time::sleep(Duration::from_secs_f64(secs)).await;
                false
            }
            Op::NewTab | Op::ListTabs | Op::SwitchTab(_) | Op::CloseTab(_) => {
                return Err(failed(self.name));
            }
            input => {
                self.act(input).await?;
                true
            }
        };
        if acted {
            self.settle(navigations).await;
        }
        Ok(Outcome::Done)
    }
}

/// The bits of a chord's held modifiers, in order.
fn modifier_bits_of(ch: &Chord) -> Vec<u32> {
    ch.held
        .iter()
        .map(|k| match k.key.as_str() {
            "Alt" => 1,
            "Control" => 2,
            "Meta" => 4,
            _ => 8,
        })
        .collect()
}

fn entries(lines: Vec<String>, dropped: u64) -> String {
    let mut out = String::new();
    if dropped > 0 {
        out.push_str(&format!("({dropped} earlier entries were dropped)\n"));
    }
    out.push_str(&lines.join("\n"));
    out
}

/// Sets a form element's value as a person would leave it: a checkbox or radio by a boolean,
/// a select by an option's value or text, a text field through the element's own setter (so
/// frameworks that track it see the change), each with `input` and `change` fired.
const SET_VALUE: &str = r#"function (v) {
  const el = this;
  const tag = (el.tagName || '').toLowerCase();
  const fire = () => {
    el.dispatchEvent(new Event('input', { bubbles: true }));
    el.dispatchEvent(new Event('change', { bubbles: true }));
  };
  if (el.disabled) return 'the element is disabled';
  if (tag === 'input' && (el.type === 'checkbox' || el.type === 'radio')) {
    if (typeof v !== 'boolean') return 'a checkbox or radio button takes true or false';
    if (el.checked !== v) { el.checked = v; fire(); }
    return '';
  }
  if (tag === 'select') {
    const s = String(v);
    const opts = Array.from(el.options);
    const o = opts.find(o => o.value === s) || opts.find(o => o.text.trim() === s.trim());
    if (!o) return 'no option has this value or text';
    el.value = o.value; fire();
    return '';
  }
  if (tag === 'input' || tag === 'textarea') {
    const proto = tag === 'input' ? HTMLInputElement.prototype : HTMLTextAreaElement.prototype;
    Object.getOwnPropertyDescriptor(proto, 'value').set.call(el, String(v));
    fire();
    return '';
  }
  if (el.isContentEditable) { el.textContent = String(v); fire(); return ''; }
  return 'the element takes no value';
}"#;

/// The page's visible text, its article or main content first when it has one.
const PAGE_TEXT: &str = "(() => { \
  const main = document.querySelector('article, main, [role=main]'); \
  const root = main && main.innerText.trim().length > 200 ? main : document.body; \
  return root ? root.innerText : ''; })()";

/// A member's content from what it produced.
fn render(kind: BrowserResult, input: &Value, outcome: Outcome) -> Vec<Value> {
    match (kind, outcome) {
        (BrowserResult::Ack(t), _) => vec![text_block(acknowledgment(t, input))],
        (BrowserResult::Navigate, Outcome::Navigated { url, title, status }) => {
            let mut line = format!("Navigated to {}", bounded_url(&url));
            if !title.is_empty() {
                line.push_str(&format!(" — {}", bounded_line(&title)));
            }
            if let Some(s) = status {
                line.push_str(&format!(" (HTTP {s})"));
            }
            vec![text_block(line)]
        }
        (BrowserResult::Image, Outcome::Image(data)) => vec![image_block(data, "image/png")],
        (BrowserResult::Text, Outcome::Text(t)) => {
            vec![text_block(if t.is_empty() { "(empty)".into() } else { t })]
        }
        _ => Vec::new(),
    }
}

/// The `browser_state` block: every tab (the active one marked), and the changes if any.
fn state_block(tabs: &[Tab], active: Option<&str>, changes: &[Value]) -> Value {
    let tabs: Vec<Value> = tabs
        .iter()
        .map(|t| {
            json!({"tab_id": t.id, "title": bounded_line(&t.title), "url": bounded_url(&t.url),
                   "active": Some(t.id.as_str()) == active})
        })
        .collect();
    let mut block = json!({"type": "browser_state", "tabs": tabs});
    if !changes.is_empty() {
        block["state_changes"] = Value::Array(changes.to_vec());
    }
    block
}

/// The changes one block may carry: a `tab_opened` once a tab and only for an open tab, the
/// latest change of each download.
fn merge_changes(changes: Vec<Value>, tabs: &[Tab]) -> Vec<Value> {
    let is_download = |c: &Value| {
        c["type"]
            .as_str()
            .is_some_and(|t| t.starts_with("download_"))
    };
    let mut latest = HashMap::new();
    for (i, c) in changes.iter().enumerate() {
        if is_download(c) {
            latest.insert(c["download_id"].to_string(), i);
        }
    }
    let mut opened = Vec::new();
    let mut kept = Vec::new();
    for (i, mut c) in changes.into_iter().enumerate() {
        if c["type"] == "tab_opened" {
            let id = c["tab_id"].as_str().unwrap_or_default().to_string();
            if !tabs.iter().any(|t| t.id == id) || opened.contains(&id) {
                continue;
            }
            opened.push(id);
        } else if is_download(&c) {
            if latest[&c["download_id"].to_string()] != i {
                continue;
            }
            c["url"] = bounded_url(c["url"].as_str().unwrap_or_default()).into();
        }
        kept.push(c);
    }
    kept
}

/// A line for each dismissed dialog (at most a few, then a count), as the SDK words them.
fn dialog_lines(dialogs: &[Dialog]) -> Vec<Value> {
    let mut lines = Vec::new();
    for d in dialogs.iter().take(DIALOG_LINES) {
        let kind: String = one_line(&d.kind).trim().chars().take(20).collect();
        let kind = if kind.is_empty() {
            "dialog".to_string()
        } else {
            kind
        };
        let article = if kind
            .chars()
            .next()
            .is_some_and(|c| "aeiouAEIOU".contains(c))
        {
            "An"
        } else {
            "A"
        };
        let noun = if kind == "dialog" {
            kind.clone()
        } else {
            format!("{kind} dialog")
        };
        let mut message: String = one_line(&d.message).trim().to_string();
        if message.chars().count() > DIALOG_MESSAGE {
            message = message.chars().take(DIALOG_MESSAGE).collect::<String>() + "…";
        }
        let quoted = if message.is_empty() {
            String::new()
        } else {
            format!(" {}", serde_json::to_string(&message).unwrap_or_default())
        };
        lines.push(text_block(format!(
            "{article} {noun}{quoted} was dismissed."
        )));
    }
    if dialogs.len() > DIALOG_LINES {
        lines.push(text_block(format!(
            "{} more dialogs were dismissed.",
            dialogs.len() - DIALOG_LINES
        )));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tab(id: &str) -> Tab {
        Tab {
            id: id.into(),
            title: "T\nitle".into(),
            url: "http://a.test/".into(),
        }
    }

    #[test]
    fn blocks_and_changes_are_the_sdks() {
        let tabs = [tab("A"), tab("B")];
        let changes = merge_changes(
            vec![
                json!({"type": "tab_opened", "tab_id": "B"}),
                json!({"type": "tab_opened", "tab_id": "B"}),
                json!({"type": "tab_opened", "tab_id": "gone"}),
                json!({"type": "download_started", "download_id": "d", "url": "http://a.test/f"}),
                json!({"type": "download_completed", "download_id": "d", "url": "http://a.test/f"}),
            ],
            &tabs,
        );
        assert_eq!(
            changes,
            vec![
                json!({"type": "tab_opened", "tab_id": "B"}),
                json!({"type": "download_completed", "download_id": "d", "url": "http://a.test/f"}),
            ]
        );
        let block = state_block(&tabs, Some("B"), &[]);
        assert_eq!(
            block,
            json!({"type": "browser_state", "tabs": [
                {"tab_id": "A", "title": "T itle", "url": "http://a.test/", "active": false},
                {"tab_id": "B", "title": "T itle", "url": "http://a.test/", "active": true}]})
        );
    }

    #[test]
    fn dialog_lines_are_the_sdks() {
        let d = |kind: &str, message: &str| Dialog {
            kind: kind.into(),
            message: message.into(),
        };
        let lines = dialog_lines(&[
            d("confirm", "Delete everything?"),
            d("alert", ""),
            d("prompt", "x"),
            d("alert", "y"),
        ]);
        let text: Vec<&str> = lines.iter().map(|l| l["text"].as_str().unwrap()).collect();
        assert_eq!(
            text,
            [
                "A confirm dialog \"Delete everything?\" was dismissed.",
                "An alert dialog was dismissed.",
                "A prompt dialog \"x\" was dismissed.",
                "1 more dialogs were dismissed."
            ]
        );
    }

    #[test]
    fn results_render_as_the_sdk_does() {
        let nav = render(
            BrowserResult::Navigate,
            &json!({}),
            Outcome::Navigated {
                url: "http://a.test/".into(),
                title: "Home".into(),
                status: Some(200),
            },
        );
        assert_eq!(
            nav,
            vec![text_block("Navigated to http://a.test/ — Home (HTTP 200)")]
        );
        assert_eq!(
            render(
                BrowserResult::Text,
                &json!({}),
                Outcome::Text(String::new())
            ),
            vec![text_block("(empty)")]
        );
        assert_eq!(
            render(
                browser_member("scroll").unwrap(),
                &json!({"scroll_direction": "up"}),
                Outcome::Done
            ),
            vec![text_block("Scrolled up.")]
        );
        let t = BrowserToolset::new(&["read_console".into()]).unwrap();
        assert!(t.serves("read_console") && !t.serves("javascript_exec") && t.serves("navigate"));
        assert_eq!(t.members().len(), 28);
        assert!(BrowserToolset::new(&["navigate".into()]).is_err());
    }
}
