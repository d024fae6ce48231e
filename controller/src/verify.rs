//! `berth verify desktop-osworld`: OSWorld's harness against a live deployment. A desktop
//! sandbox is created through the controller API (and always deleted: after a failure and on
//! Ctrl-C too), then the calls OSWorld's `PythonController` and `SetupController` make are sent
//! to the sandbox's compat endpoint shaped exactly as they send them, and each answer is held
//! to what the harness relies on. One row per check; any failure makes the exit status non-zero.
//!
//! Every call has a timeout (the harness's own where it sets one, a bound where it sets none)
//! and every answer is parsed defensively: an odd answer is a failed row, never a panic.

mod osworld;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use berth_protocol::controller::{ControllerClient, CreateSandbox, Sandbox};
use berth_protocol::lifecycle::SandboxStatus;
use berth_protocol::sync::Locked;
use clap::{Args, Subcommand};
use serde::Serialize;
use serde_json::json;

use osworld::{EXECUTE_TIMEOUT, Guest, Outcome};

/// Marks the sandboxes of one verify run, so one whose create was cut short is still found.
const RUN_LABEL: &str = "berth-verify";
/// A sandbox this command leaks (say it was SIGKILLed) expires on its own.
const SANDBOX_TTL_SECS: u64 = 1800;
/// For the calls the harness makes without a timeout (it would wait forever).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
const CONTROLLER_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Subcommand, Debug)]
pub enum VerifyCmd {
    /// Create a desktop sandbox, run OSWorld's harness calls against its compat endpoint
    /// (screenshot, platform, pyautogui through /execute, files, recording, accessibility,
    /// CDP), print a pass/fail table and delete the sandbox; exits non-zero on any failure.
    DesktopOsworld(DesktopOsworld),
}

#[derive(Args, Debug)]
pub struct DesktopOsworld {
    /// The controller's URL [default: $SANDBOX_GATEWAY_URL, else http://localhost:8780]
    #[arg(long, env = "BERTH_URL")]
    pub url: Option<String>,
    /// The controller's API key [default: $SANDBOX_API_KEY]
    #[arg(long, alias = "api-key", env = "BERTH_API_KEY", hide_env_values = true)]
    pub key: Option<String>,
    /// The desktop profile to create.
    #[arg(long, default_value = "desktop")]
    pub profile: String,
    /// The image to create it from [default: the controller's for the profile]
    #[arg(long)]
    pub image_ref: Option<String>,
    /// How long the new sandbox may take to be running.
    #[arg(long, default_value = "300s", value_parser = humantime::parse_duration)]
    pub create_timeout: Duration,
    /// Print only the report, as JSON, on stdout.
    #[arg(long)]
    pub json: bool,
    /// Check this existing sandbox instead of creating one; it is left as it is.
    #[arg(long, hide = true)]
    pub sandbox: Option<String>,
}

/// One check's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub name: &'static str,
    pub ok: bool,
    pub ms: u64,
    /// What was found: the reason on a failure, a short note on a pass.
    pub detail: String,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub passed: bool,
    pub interrupted: bool,
    pub sandbox: Option<String>,
    pub compat: Option<String>,
    pub cdp: Option<String>,
    pub checks: Vec<Row>,
}

pub async fn run(cmd: VerifyCmd) -> anyhow::Result<i32> {
    match cmd {
        VerifyCmd::DesktopOsworld(a) => desktop_osworld(a).await,
    }
}

async fn desktop_osworld(a: DesktopOsworld) -> anyhow::Result<i32> {
    let url = a
        .url
        .clone()
        .or_else(|| env_nonempty("SANDBOX_GATEWAY_URL"))
        .unwrap_or_else(|| berth_protocol::routes::controller::DEFAULT_URL.into());
    let key = a.key.clone().or_else(|| env_nonempty("SANDBOX_API_KEY"));
    let controller = ControllerClient::new(&url, key);
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .no_proxy()
        .build()?;
    let tag = crate::util::random_hex(6);
    let mut rows = Rows {
        rows: Vec::new(),
        progress: !a.json,
    };
    let created = Mutex::new(None);
    let mut sandbox = None;
    let interrupted = tokio::select! {
        () = checks(&mut rows, &mut sandbox, &created, &controller, &http, &a, &tag) => false,
        () = interrupt() => true,
    };
    if interrupted {
        rows.push(Row {
            name: "interrupted",
            ok: false,
            ms: 0,
            detail: "stopped by a signal before the checks ended".into(),
        });
    }
    let mut known = created.locked().clone();
    if a.sandbox.is_none() {
        let deleted = delete_ours(&mut rows, &controller, known.clone(), &tag).await;
        known = known.or(deleted.into_iter().next());
    }
    let report = Report {
        passed: !interrupted && rows.rows.iter().all(|r| r.ok),
        interrupted,
        sandbox: sandbox.as_ref().map(|s: &Sandbox| s.id.clone()).or(known),
        compat: sandbox.as_ref().and_then(|s| s.endpoints.compat.clone()),
        cdp: sandbox.as_ref().and_then(|s| s.endpoints.cdp.clone()),
        checks: rows.rows,
    };
    match a.json {
        true => println!("{}", serde_json::to_string_pretty(&report)?),
        false => print!("{}", table(&report)),
    }
    Ok(match (report.passed, interrupted) {
        (true, _) => 0,
        (false, true) => 130,
        (false, false) => 1,
    })
}

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Ctrl-C or SIGTERM; never, when neither can be watched.
async fn interrupt() {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        return std::future::pending().await;
    };
    tokio::select! {
        r = tokio::signal::ctrl_c() => if r.is_err() { std::future::pending::<()>().await },
        _ = term.recv() => {}
    }
}

struct Rows {
    rows: Vec<Row>,
    progress: bool,
}

impl Rows {
    fn push(&mut self, row: Row) {
        if self.progress {
            let mark = if row.ok { "pass" } else { "FAIL" };
            eprintln!("  {mark} {:<18} {:>6} ms  {}", row.name, row.ms, row.detail);
        }
        self.rows.push(row);
    }

    /// Runs one check within `limit`: its row, and what it found for later checks.
    async fn check<T>(
        &mut self,
        name: &'static str,
        limit: Duration,
        f: impl Future<Output = Outcome<T>>,
    ) -> Option<T> {
        let started = Instant::now();
        let outcome = tokio::time::timeout(limit, f)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {} s", limit.as_secs())));
        let ms = started.elapsed().as_millis() as u64;
        let (ok, value, detail) = match outcome {
            Ok((v, d)) => (true, Some(v), d),
            Err(d) => (false, None, d),
        };
        self.push(Row {
            name,
            ok,
            ms,
            detail,
        });
        value
    }
}

/// Every check, in the order a harness meets them. `sandbox` is filled in once it runs.
async fn checks(
    rows: &mut Rows,
    sandbox: &mut Option<Sandbox>,
    created: &Mutex<Option<String>>,
    controller: &ControllerClient,
    http: &reqwest::Client,
    a: &DesktopOsworld,
    tag: &str,
) {
    let Some(sb) = obtain_sandbox(rows, created, controller, a, tag).await else {
        return;
    };
    *sandbox = Some(sb.clone());
    let Some(base) = sb.endpoints.compat.clone() else {
        rows.push(Row {
            name: "compat endpoint",
            ok: false,
            ms: 0,
            detail: "the sandbox record has no endpoints.compat".into(),
        });
        return;
    };
    let g = Guest::new(&base, http.clone());
    let limit = CALL_TIMEOUT + Duration::from_secs(5);
    let (w, h) = screen_checks(rows, &g).await;
    file_checks(rows, &g, tag).await;
    let rec_limit = CALL_TIMEOUT * 2 + EXECUTE_TIMEOUT + Duration::from_secs(10);
    rows.check("recording", rec_limit, osworld::recording(&g, (w, h)))
        .await;
    rows.check("accessibility", limit, osworld::accessibility(&g))
        .await;
    let cdp = sb.endpoints.cdp.clone();
    rows.check("cdp /json/version", limit, osworld::cdp_version(http, cdp))
        .await;
    // Fidelity: what an agent sees, each item the image promises against what it shows.
    let state = rows
        .check("desktop state", limit, desktop_state(controller, &sb.id))
        .await;
    if let Some(state) = state {
        for row in fidelity_rows(&state) {
            rows.push(row);
        }
    }
}

/// The sandbox checked: the one named with `--sandbox`, else a new one (the first row either
/// way).
async fn obtain_sandbox(
    rows: &mut Rows,
    created: &Mutex<Option<String>>,
    controller: &ControllerClient,
    a: &DesktopOsworld,
    tag: &str,
) -> Option<Sandbox> {
    match &a.sandbox {
        Some(id) => {
            rows.check("sandbox", CONTROLLER_TIMEOUT, existing(controller, id))
                .await
        }
        None => {
            let limit = a.create_timeout + CONTROLLER_TIMEOUT;
            rows.check("sandbox", limit, create(controller, a, tag, created))
                .await
        }
    }
}

/// The screen and pointer checks; the screen's size (640x480 when it could not be read).
async fn screen_checks(rows: &mut Rows, g: &Guest) -> (u32, u32) {
    let limit = CALL_TIMEOUT + Duration::from_secs(5);
    let exec_limit = EXECUTE_TIMEOUT + Duration::from_secs(5);
    rows.check("platform", limit, osworld::platform(g)).await;
    let size = rows
        .check("screen_size", limit, osworld::screen_size(g))
        .await;
    rows.check("screenshot", limit, osworld::screenshot(g, size))
        .await;
    rows.check("python platform", exec_limit, osworld::python_platform(g))
        .await;
    // Odd numbers inside any screen, unlikely to be where the pointer already is.
    let (w, h) = size.unwrap_or((640, 480));
    let target = (w / 3 + 7, h / 3 + 5);
    rows.check("pyautogui moveTo", exec_limit, osworld::move_to(g, target))
        .await;
    rows.check(
        "cursor_position",
        limit,
        osworld::cursor_position(g, target),
    )
    .await;
    (w, h)
}

/// The file checks on a probe file of this run's, removed afterwards.
async fn file_checks(rows: &mut Rows, g: &Guest, tag: &str) {
    let limit = CALL_TIMEOUT + Duration::from_secs(5);
    let dir = format!("/tmp/berth-verify-{tag}");
    let file = format!("{dir}/probe-{tag}.bin");
    let content = osworld::probe_bytes(tag);
    rows.check("setup/upload", limit, osworld::upload(g, &file, &content))
        .await;
    rows.check("file", limit, osworld::download(g, &file, &content))
        .await;
    rows.check(
        "list_directory",
        limit,
        osworld::list_directory(g, &dir, &file),
    )
    .await;
    // Not a check: what the probe left in a sandbox that outlives this command.
    let _ = g
        .execute(json!({"command": ["rm", "-rf", dir], "shell": false}))
        .await;
}

/// `GET …/{id}/v1/desktop/state` through the controller.
async fn desktop_state(
    controller: &ControllerClient,
    id: &str,
) -> Outcome<berth_protocol::desktop::DesktopState> {
    let state = controller
        .agent(id)
        .desktop_state()
        .await
        .map_err(|e| format!("GET /v1/desktop/state: {e}"))?;
    let note = format!(
        "{} session, {} windows, {} of {} programs present",
        state.session,
        state.windows.len(),
        state.programs.values().filter(|p| **p).count(),
        state.programs.len()
    );
    Ok((state, note))
}

/// One `fidelity` row per item the image's expected state names (one passing row saying so
/// when the image states none).
fn fidelity_rows(state: &berth_protocol::desktop::DesktopState) -> Vec<Row> {
    if state.expected.is_none() {
        return vec![Row {
            name: "fidelity",
            ok: true,
            ms: 0,
            detail: format!(
                "the image states no expected desktop ({} session): nothing to hold it to",
                state.session
            ),
        }];
    }
    state
        .fidelity
        .iter()
        .map(|f| Row {
            name: "fidelity",
            ok: f.ok,
            ms: 0,
            detail: match f.ok {
                true => format!("{}: {}", f.item, f.actual),
                false => format!("{}: expected {}, found {}", f.item, f.expected, f.actual),
            },
        })
        .collect()
}

/// A new sandbox, polled until it runs. Its id is kept in `created` as soon as the controller
/// names it, so it is deleted whatever happens next.
async fn create(
    controller: &ControllerClient,
    a: &DesktopOsworld,
    tag: &str,
    created: &Mutex<Option<String>>,
) -> Outcome<Sandbox> {
    let started = Instant::now();
    let req = CreateSandbox {
        profile: a.profile.clone(),
        image_ref: a.image_ref.clone(),
        labels: BTreeMap::from([(RUN_LABEL.to_string(), tag.to_string())]),
        ttl_seconds: Some(SANDBOX_TTL_SECS),
        screen: None,
        egress: None,
        credentials: Vec::new(),
        human_control: None,
        logins: Vec::new(),
        limits: None,
    };
    let mut sb = bounded(controller.create_nowait(&req)).await?;
    *created.locked() = Some(sb.id.clone());
    let deadline = started + a.create_timeout;
    loop {
        match sb.status {
            SandboxStatus::Running => {
                let how = sb.claim.clone().unwrap_or_else(|| "new".into());
                let note = format!(
                    "{} running after {:.1} s ({how}, {})",
                    sb.id,
                    started.elapsed().as_secs_f64(),
                    sb.image_ref
                );
                return Ok((sb, note));
            }
            SandboxStatus::Pending | SandboxStatus::Starting => {}
            other => {
                return Err(format!(
                    "{} is {other}: {}",
                    sb.id,
                    sb.error.clone().unwrap_or_default()
                ));
            }
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{} still {} after {} s",
                sb.id,
                sb.status,
                a.create_timeout.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        // A controller that does not answer once is asked again until the deadline.
        if let Ok(now) = bounded(controller.get(&sb.id)).await {
            sb = now;
        }
    }
}

async fn existing(controller: &ControllerClient, id: &str) -> Outcome<Sandbox> {
    let sb = bounded(controller.get(id)).await?;
    match sb.status {
        SandboxStatus::Running => {
            let note = format!("existing sandbox {} ({})", sb.id, sb.image_ref);
            Ok((sb, note))
        }
        other => Err(format!(
            "{id} is {other}: {}",
            sb.error.clone().unwrap_or_default()
        )),
    }
}

/// Deletes the sandbox this run created, and any other carrying this run's label (a create
/// whose answer was lost or interrupted). Their ids.
async fn delete_ours(
    rows: &mut Rows,
    controller: &ControllerClient,
    known: Option<String>,
    tag: &str,
) -> Vec<String> {
    let label = [(RUN_LABEL.to_string(), tag.to_string())];
    let mut ids: Vec<String> = known.into_iter().collect();
    if let Ok(list) = bounded(controller.list(&label)).await {
        for sb in list.sandboxes {
            if !ids.contains(&sb.id) && sb.status != SandboxStatus::Stopped {
                ids.push(sb.id);
            }
        }
    }
    if ids.is_empty() {
        return ids;
    }
    rows.check("delete", CONTROLLER_TIMEOUT * 2, async {
        let mut failed = Vec::new();
        for id in &ids {
            if let Err(e) = bounded(controller.delete(id)).await {
                failed.push(format!("{id}: {e}"));
            }
        }
        match failed.is_empty() {
            true => Ok(((), format!("{} deleted", ids.join(", ")))),
            false => Err(failed.join("; ")),
        }
    })
    .await;
    ids
}

/// A controller call within `CONTROLLER_TIMEOUT`, its error as text.
async fn bounded<T>(
    f: impl Future<Output = berth_protocol::client::Result<T>>,
) -> Result<T, String> {
    match tokio::time::timeout(CONTROLLER_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(chain(&e)),
        Err(_) => Err(format!(
            "the controller did not answer within {} s",
            CONTROLLER_TIMEOUT.as_secs()
        )),
    }
}

/// An error and its causes, on one line (reqwest's own message leaves out why).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cause = c.source();
    }
    s
}

/// The human form of the report.
fn table(r: &Report) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let on = match (&r.sandbox, &r.compat) {
        (Some(id), Some(c)) => format!("sandbox {id}, compat {c}"),
        (Some(id), None) => format!("sandbox {id}"),
        _ => "no sandbox".into(),
    };
    let _ = writeln!(s, "berth verify desktop-osworld ({on})\n");
    let width = r
        .checks
        .iter()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let _ = writeln!(
        s,
        "{:<width$}  {:<6} {:>7}  DETAIL",
        "CHECK", "RESULT", "MS"
    );
    for c in &r.checks {
        let detail = c.detail.replace('\n', "\\n");
        let result = if c.ok { "pass" } else { "fail" };
        let _ = writeln!(s, "{:<width$}  {result:<6} {:>7}  {detail}", c.name, c.ms);
    }
    let failed: Vec<&str> = r.checks.iter().filter(|c| !c.ok).map(|c| c.name).collect();
    let _ = match failed.is_empty() {
        true => writeln!(
            s,
            "\nverify desktop-osworld: PASSED ({} checks)",
            r.checks.len()
        ),
        false => writeln!(
            s,
            "\nverify desktop-osworld: FAILED ({} of {} checks: {})",
            failed.len(),
            r.checks.len(),
            failed.join(", ")
        ),
    };
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_each_failed_check() {
        let row = |name, ok| Row {
            name,
            ok,
            ms: 3,
            detail: "line one\nline two".into(),
        };
        let r = Report {
            passed: false,
            interrupted: false,
            sandbox: Some("sb_1".into()),
            compat: None,
            cdp: None,
            checks: vec![row("platform", true), row("accessibility", false)],
        };
        let t = table(&r);
        let line = t.lines().find(|l| l.starts_with("accessibility")).unwrap();
        assert!(line.contains(" fail "), "{t}");
        assert!(line.contains("line one\\nline two"), "{t}");
        assert!(t.contains("FAILED (1 of 2 checks: accessibility)"), "{t}");
    }

    #[test]
    fn each_fidelity_item_is_a_row_that_names_the_difference() {
        use berth_protocol::desktop::{DesktopState, ExpectedDesktop};
        let plain = DesktopState {
            session: "xfce".into(),
            ..Default::default()
        };
        let rows = fidelity_rows(&plain);
        assert_eq!(rows.len(), 1);
        assert!(
            rows[0].ok && rows[0].detail.contains("no expected desktop"),
            "{rows:?}"
        );

        let mut state = DesktopState {
            session: "gnome".into(),
            lang: "en_US.UTF-8".into(),
            icon_theme: Some("Adwaita".into()),
            ..Default::default()
        };
        let expected = ExpectedDesktop {
            session: "gnome".into(),
            lang: "en_US.UTF-8".into(),
            icon_theme: Some("Yaru".into()),
            ..Default::default()
        };
        state.fidelity = state.compare(&expected);
        state.expected = Some(expected);
        let rows = fidelity_rows(&state);
        assert_eq!(rows.len(), 3, "{rows:?}");
        let bad: Vec<&Row> = rows.iter().filter(|r| !r.ok).collect();
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].detail, "icon theme: expected Yaru, found Adwaita");
    }
}
