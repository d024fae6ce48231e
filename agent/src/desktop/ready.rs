//! Strict readiness: the desktop is ready only when what a user touches works end to end —
//! the noVNC page is served and an RFB handshake completes through the agent's own relay, the
//! window manager owns its selection and the panel is mapped, the browser answers CDP, the TCP
//! relay answers `/json/version`, and a CDP round trip completes through the WebSocket relay.
//! The checks go through the agent's real listener, as a client would.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest};

use super::{BrowserStart, Desktop, Status, probe};
use crate::a11y::A11y;

const CHECK_TIMEOUT: Duration = Duration::from_secs(3);

pub use berth_protocol::desktop::ReadyReport as Report;

pub struct Readiness {
    desktop: Option<Arc<Desktop>>,
    /// The browser IDE (`--ide`): one more component, ready when its API answers.
    ide: Option<Arc<super::ide::Ide>>,
    a11y: Arc<A11y>,
    /// The latest results of the end-to-end checks.
    checks: watch::Sender<BTreeMap<&'static str, Status>>,
}

/// Where the checks reach the agent: its listener, its token, the CDP relay.
pub struct Loopback {
    pub listen: SocketAddr,
    pub token: String,
    pub cdp_listen: SocketAddr,
    /// Passes the guard of the observation routes while a person holds the controls (a probe
    /// is not the agent's input).
    pub probe_key: String,
}

fn loopback(addr: SocketAddr) -> SocketAddr {
    let mut a = addr;
    if a.ip().is_unspecified() {
        a.set_ip(if a.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    a
}

impl Readiness {
    /// `desktop`: what to check; without one there is nothing to wait for.
    pub fn new(
        desktop: Option<Arc<Desktop>>,
        ide: Option<Arc<super::ide::Ide>>,
        a11y: Arc<A11y>,
    ) -> Arc<Readiness> {
        let (checks, _) = watch::channel(BTreeMap::new());
        Arc::new(Readiness {
            desktop,
            ide,
            a11y,
            checks,
        })
    }

    /// Runs the end-to-end checks: every 50 ms while something fails, every 5 s while all pass,
    /// and at once whenever a component changes.
    pub fn start(self: &Arc<Self>, lb: Loopback) {
        let Some(desktop) = self.desktop.clone() else {
            return;
        };
        let me = self.clone();
        let a11y = self.a11y.clone();
        let lb = Arc::new(Loopback {
            listen: loopback(lb.listen),
            token: lb.token,
            cdp_listen: loopback(lb.cdp_listen),
            probe_key: lb.probe_key,
        });
        tokio::spawn(async move {
            let mut changed = desktop.changes();
            loop {
                let results = run_checks(&desktop, &a11y, &lb).await;
                let mut all_ok = true;
                me.checks.send_modify(|checks| {
                    for (name, r) in results {
                        let entry = checks
                            .entry(name)
                            .or_insert_with(|| super::new_status("down", "not checked yet"));
                        let (ok, reason) = match r {
                            Ok(()) => (true, "ok".to_string()),
                            Err(e) => (false, e),
                        };
                        all_ok &= ok;
                        if entry.ok != ok || entry.reason != reason {
                            entry.ok = ok;
                            entry.state = if ok { "up" } else { "down" }.into();
                            entry.reason = reason;
                            entry.since = crate::time::now_rfc3339();
                        }
                    }
                });
                // Components' own states are read live; the end-to-end checks repeat every
                // few seconds while all pass (once a second cost the agent 1 % of a core), at
                // once when a component changes, and every 50 ms while one fails: the browser
                // joins the accessibility bus a moment after its DevTools answer, and that
                // moment ends a cold start.
                let pause = if all_ok {
                    Duration::from_secs(5)
                } else {
                    Duration::from_millis(50)
                };
                let _ = tokio::time::timeout(pause, changed.changed()).await;
            }
        });
    }

    /// Components as they are this moment, with the latest end-to-end checks.
    pub fn report(&self) -> Report {
        let mut report = self.desktop_report();
        if let Some(ide) = &self.ide {
            let s = ide.status();
            report.ready &= s.ok;
            report.components.insert(ide.name().to_string(), s);
        }
        report
    }

    fn desktop_report(&self) -> Report {
        let Some(desktop) = &self.desktop else {
            return Report {
                ready: true,
                components: BTreeMap::new(),
            };
        };
        let mut components: BTreeMap<String, Status> = desktop
            .statuses()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        for name in CHECKS {
            let s = self
                .checks
                .borrow()
                .get(name)
                .cloned()
                .unwrap_or_else(|| super::new_status("down", "not checked yet"));
            components.insert(name.to_string(), s);
        }
        let ready = components.values().all(|s| s.ok);
        Report { ready, components }
    }

    /// The report now, or once ready if that happens within `wait`.
    pub async fn wait(&self, wait: Duration) -> Report {
        let deadline = tokio::time::Instant::now() + wait;
        let mut checks = self.checks.subscribe();
        let mut changed = self.desktop.as_ref().map(|d| d.changes());
        let mut ide_changed = self.ide.as_ref().map(|i| i.changes());
        loop {
            let r = self.report();
            if r.ready {
                return r;
            }
            let more = async {
                let desktop = async {
                    match &mut changed {
                        Some(c) => {
                            tokio::select! {
                                _ = checks.changed() => {}
                                _ = c.changed() => {}
                            }
                        }
                        None => std::future::pending::<()>().await,
                    }
                };
                let ide = async {
                    match &mut ide_changed {
                        Some(c) => {
                            let _ = c.changed().await;
                        }
                        None => std::future::pending::<()>().await,
                    }
                };
                tokio::select! {
                    _ = desktop => {}
                    _ = ide => {}
                }
            };
            if tokio::time::timeout_at(deadline, more).await.is_err() {
                return self.report();
            }
        }
    }
}

/// The end-to-end checks, beside the components' own states.
const CHECKS: [&str; 7] = [
    "novnc",
    "vnc",
    "window_manager",
    "browser_cdp",
    "cdp_relay",
    "cdp_ws_relay",
    "accessibility",
];

async fn timed(f: impl std::future::Future<Output = probe::Probe>) -> probe::Probe {
    tokio::time::timeout(CHECK_TIMEOUT, f)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {} s", CHECK_TIMEOUT.as_secs())))
}

async fn run_checks(
    desktop: &Arc<Desktop>,
    a11y: &A11y,
    lb: &Loopback,
) -> Vec<(&'static str, probe::Probe)> {
    let (novnc, vnc, wm, browser, relay, ws_relay, accessibility) = tokio::join!(
        timed(novnc_page(lb)),
        timed(rfb_through_relay(lb)),
        timed(window_manager(desktop)),
        timed(browser_cdp(desktop)),
        timed(tcp_relay(desktop, lb)),
        timed(ws_relay_round_trip(desktop, lb)),
        timed(accessibility_round_trip(desktop, a11y)),
    );
    let results = [novnc, vnc, wm, browser, relay, ws_relay, accessibility];
    CHECKS.into_iter().zip(results).collect()
}

async fn novnc_page(lb: &Loopback) -> probe::Probe {
    let page = format!("{}vnc.html", berth_protocol::routes::native::VNC_INDEX);
    let url = format!("http://{}{page}", lb.listen);
    let r = crate::browser::cdp::http()
        .get(&url)
        .bearer_auth(&lb.token)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !r.status().is_success() {
        return Err(format!("GET {page}: HTTP {}", r.status()));
    }
    let body = r.text().await.map_err(|e| e.to_string())?;
    if body.contains("noVNC") {
        Ok(())
    } else {
        Err(format!("{page} is not noVNC's page"))
    }
}

fn ws_request(
    lb: &Loopback,
    path: &str,
) -> Result<tungstenite::handshake::client::Request, String> {
    let mut req = format!("ws://{}{path}", lb.listen)
        .into_client_request()
        .map_err(|e| e.to_string())?;
    let auth = format!("Bearer {}", lb.token)
        .parse()
        .map_err(|_| "token is not a header value".to_string())?;
    req.headers_mut().insert("authorization", auth);
    let key = lb
        .probe_key
        .parse()
        .map_err(|_| "the probe key is not a header value".to_string())?;
    req.headers_mut()
        .insert(berth_protocol::routes::header::CONTROL_KEY, key);
    Ok(req)
}

async fn rfb_through_relay(lb: &Loopback) -> probe::Probe {
    let (mut ws, _) =
        tokio_tungstenite::connect_async(ws_request(lb, berth_protocol::routes::native::VNC_WS)?)
            .await
            .map_err(|e| format!("the VNC relay refused: {e}"))?;
    let mut got = Vec::new();
    while got.len() < 12 {
        match ws.next().await {
            Some(Ok(tungstenite::Message::Binary(b))) => got.extend_from_slice(&b),
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(format!("the VNC relay failed: {e}")),
            None => return Err("the VNC relay closed before the server's greeting".into()),
        }
    }
    let _ = ws.close(None).await;
    probe::check_rfb_greeting(&got[..12])
}

/// The session's window manager owns `WM_S0` and its panel is drawn (XFCE's panel window;
/// GNOME Shell's top bar and dock, which its own readiness checks through its extensions).
async fn window_manager(desktop: &Arc<Desktop>) -> probe::Probe {
    let session = desktop.session();
    let wm = session.window_manager().name();
    if !desktop.statuses().get(wm).is_some_and(|s| s.ok) {
        return Err(format!("{wm} is not up"));
    }
    let display = desktop.x_target();
    tokio::task::spawn_blocking(move || {
        probe::selection_owned(&display, "WM_S0", "window manager")?;
        match session.panel_class() {
            Some(class) => probe::window_mapped(&display, class),
            None => Ok(()),
        }
    })
    .await
    .unwrap_or_else(|e| Err(e.to_string()))
}

/// The AT-SPI registry answers and lists the application that is always there (what
/// `/accessibility` and `/terminal` read): the browser on XFCE, the shell on GNOME (whose
/// browser starts on demand).
async fn accessibility_round_trip(desktop: &Desktop, a11y: &A11y) -> probe::Probe {
    let on_demand = desktop.session().browser_start() == BrowserStart::OnDemand;
    if !on_demand {
        browser_known(desktop)?;
    }
    if !desktop.statuses().get("a11y-bus").is_some_and(|s| s.ok) {
        return Err("the AT-SPI bus launcher is not up".into());
    }
    let apps = a11y.applications().await.map_err(|e| e.to_string())?;
    let (found, what) = match on_demand {
        false => (
            apps.iter().any(|a| crate::a11y::is_browser(a)),
            "the browser",
        ),
        true => (apps.iter().any(|a| a == "gnome-shell"), "the shell"),
    };
    if found {
        Ok(())
    } else {
        Err(format!(
            "{what} is not on the accessibility bus (applications: {})",
            apps.join(", ")
        ))
    }
}

/// Whether a browser check has nothing to do: an on-demand browser that is idle (no client has
/// asked for it) passes them, as its own status does.
fn browser_idle(desktop: &Desktop) -> bool {
    desktop.devtools().is_none()
        && desktop
            .statuses()
            .get(super::Component::Browser.name())
            .is_some_and(|s| s.state == "idle")
}

/// The relays are only tried once the browser is up (they would only say it is not).
fn browser_known(desktop: &Desktop) -> Result<super::DevTools, String> {
    desktop
        .devtools()
        .ok_or_else(|| "the browser's DevTools endpoint is not known yet".to_string())
}

async fn browser_cdp(desktop: &Arc<Desktop>) -> probe::Probe {
    if browser_idle(desktop) {
        return Ok(());
    }
    let dt = browser_known(desktop)?;
    crate::browser::cdp::version(dt.port).await.map(|_| ())
}

async fn tcp_relay(desktop: &Arc<Desktop>, lb: &Loopback) -> probe::Probe {
    if browser_idle(desktop) {
        return Ok(());
    }
    browser_known(desktop)?;
    let v =
        crate::browser::cdp::get_json(&format!("http://{}/json/version", lb.cdp_listen)).await?;
    if v.get("webSocketDebuggerUrl").is_some() {
        Ok(())
    } else {
        Err("/json/version through the relay has no webSocketDebuggerUrl".into())
    }
}

async fn ws_relay_round_trip(desktop: &Arc<Desktop>, lb: &Loopback) -> probe::Probe {
    if browser_idle(desktop) {
        return Ok(());
    }
    browser_known(desktop)?;
    let mut cdp = crate::browser::cdp::Cdp::connect(ws_request(
        lb,
        berth_protocol::routes::native::BROWSER_CDP,
    )?)
    .await
    .map_err(|e| format!("the CDP relay: {e}"))?;
    let v = cdp
        .call("Browser.getVersion", serde_json::json!({}), None)
        .await;
    cdp.close().await;
    let v = v?;
    if v["product"].is_string() {
        Ok(())
    } else {
        Err(format!("Browser.getVersion answered {v}"))
    }
}
