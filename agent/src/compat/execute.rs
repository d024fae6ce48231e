//! `/execute`, `/setup/execute`, `/execute_with_verification`, `/setup/launch`, `/run_python`,
//! `/run_bash_script`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Number, Value, json};

use super::python::{self, truthy};
use super::{CompatJson, error, flask, text};
use crate::Agent;
use crate::exec::{Background, ExecError, Foreground, ForegroundOutcome, Prepared};
use crate::text::{py_number, py_repr_list, python_text};

const DEFAULT_TIMEOUT_S: u64 = 120;
const RUN_PYTHON_TIMEOUT: Duration = Duration::from_secs(30);
const VERIFY_COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// A compat `command` resolved the way `subprocess` would run it.
struct CompatCommand {
    program: Vec<String>,
    /// `str()` of what was passed to `subprocess.run` (a list prints as its repr, a string as
    /// itself): `TimeoutExpired` formats it with `%s`.
    subject: String,
    /// What `/setup/launch` prints.
    shown: String,
}

/// `command` + `shell` → argv, with `shlex.split` for strings without a shell and `~/`
/// expansion of list items.
fn parse_command(agent: &Agent, data: &Map<String, Value>) -> Result<CompatCommand, Reject> {
    let shell = data.get("shell").is_some_and(truthy);
    let default = if shell {
        Value::String(String::new())
    } else {
        Value::Array(Vec::new())
    };
    let command = data.get("command").cloned().unwrap_or(default);
    let expand = |s: String| {
        if s.starts_with("~/") {
            python::expanduser(&s, &agent.home, &agent.account_name)
        } else {
            s
        }
    };
    let list = |items: Vec<Value>| -> Result<Vec<String>, Reject> {
        items
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(expand(s)),
                other => Err(Reject(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "command list items must be strings, not {}",
                        python::type_name(&other)
                    ),
                )),
            })
            .collect()
    };
    match (command, shell) {
        (Value::String(s), true) => Ok(CompatCommand {
            program: vec!["/bin/sh".into(), "-c".into(), s.clone()],
            subject: s.clone(),
            shown: s,
        }),
        (Value::String(s), false) => {
            let argv = python::shlex_split(&s)
                .map_err(|m| Reject(StatusCode::INTERNAL_SERVER_ERROR, m))?;
            let argv: Vec<String> = argv.into_iter().map(expand).collect();
            Ok(CompatCommand {
                subject: py_repr_list(&argv),
                shown: argv.join(" "),
                program: argv,
            })
        }
        (Value::Array(items), shell) => {
            let argv = list(items)?;
            let repr = py_repr_list(&argv);
            if shell {
                let mut program = vec!["/bin/sh".to_string(), "-c".to_string()];
                program.extend(argv.iter().cloned());
                Ok(CompatCommand {
                    program,
                    shown: repr.clone(),
                    subject: repr,
                })
            } else {
                Ok(CompatCommand {
                    shown: argv.join(" "),
                    program: argv,
                    subject: repr,
                })
            }
        }
        (other, _) => Err(Reject(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "expected str, bytes or os.PathLike object, not {}",
                python::type_name(&other)
            ),
        )),
    }
}

/// `str(subprocess.TimeoutExpired)`: `Command '%s' timed out after %s seconds`, the command
/// and the timeout inserted with `%s` (no escaping; an int timeout stays an int).
fn timed_out(subject: &str, timeout: &str) -> String {
    format!("Command '{subject}' timed out after {timeout} seconds")
}

/// A positive number of seconds from `field` (default `default`), and how Python prints it.
fn seconds(
    data: &Map<String, Value>,
    field: &str,
    default: u64,
) -> Result<(Duration, String), Reject> {
    match data.get(field) {
        None | Some(Value::Null) => Ok((Duration::from_secs(default), default.to_string())),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(f) if f > 0.0 && f.is_finite() && f < 1e9 => {
                Ok((Duration::from_secs_f64(f), py_number(n)))
            }
            _ => Err(Reject(
                StatusCode::BAD_REQUEST,
                format!("{field} must be a positive number of seconds"),
            )),
        },
        Some(other) => Err(Reject(
            StatusCode::BAD_REQUEST,
            format!(
                "{field} must be a number of seconds, not {}",
                python::type_name(other)
            ),
        )),
    }
}

fn prepared(
    agent: &Agent,
    program: Vec<String>,
    cwd: Option<std::path::PathBuf>,
) -> Result<Prepared, Reject> {
    agent
        .commands
        .for_sandbox(program, cwd)
        .map_err(|e| Reject(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

/// Runs in the foreground; maps failures to the reference server's 500 bodies.
async fn run(
    agent: &Agent,
    program: Vec<String>,
    cwd: Option<std::path::PathBuf>,
    timeout: Duration,
    merge_stderr: bool,
) -> Result<ForegroundOutcome, RunFailure> {
    if program.is_empty() {
        return Err(RunFailure::Message("list index out of range".into()));
    }
    if program.iter().any(|a| a.contains('\0')) {
        return Err(RunFailure::Message("embedded null byte".into()));
    }
    let p = prepared(agent, program, cwd).map_err(RunFailure::Response)?;
    let out = agent
        .commands
        .run_foreground(
            p,
            Foreground {
                stdin: None,
                timeout: Some(timeout),
                merge_stderr,
            },
        )
        .await;
    match out {
        Ok(o) if o.timed_out => Err(RunFailure::Timeout),
        Ok(o) => Ok(o),
        Err(ExecError::Spawn(f)) => Err(RunFailure::Message(f.python_message())),
        Err(e) => Err(RunFailure::Message(e.to_string())),
    }
}

enum RunFailure {
    Timeout,
    Message(String),
    Response(Reject),
}

/// A compat error answer, `{"message", "status": "error"}`.
struct Reject(StatusCode, String);

impl IntoResponse for Reject {
    fn into_response(self) -> Response {
        error(self.0, self.1)
    }
}

fn outcome_json(o: &ForegroundOutcome) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("status".into(), json!("success"));
    m.insert("output".into(), json!(python_text(&o.stdout)));
    m.insert("error".into(), json!(python_text(&o.stderr)));
    m.insert("returncode".into(), json!(o.exit.python_returncode()));
    m
}

pub async fn execute(State(agent): State<Arc<Agent>>, CompatJson(data): CompatJson) -> Response {
    let cmd = match parse_command(&agent, &data) {
        Ok(c) => c,
        Err(r) => return r.into_response(),
    };
    let (timeout, shown_timeout) = match seconds(&data, "timeout", DEFAULT_TIMEOUT_S) {
        Ok(t) => t,
        Err(r) => return r.into_response(),
    };
    match run(&agent, cmd.program, None, timeout, false).await {
        Ok(o) => flask(StatusCode::OK, &Value::Object(outcome_json(&o))),
        Err(RunFailure::Timeout) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            timed_out(&cmd.subject, &shown_timeout),
        ),
        Err(RunFailure::Message(m)) => error(StatusCode::INTERNAL_SERVER_ERROR, m),
        Err(RunFailure::Response(r)) => r.into_response(),
    }
}

pub async fn execute_with_verification(
    State(agent): State<Arc<Agent>>,
    CompatJson(data): CompatJson,
) -> Response {
    let cmd = match parse_command(&agent, &data) {
        Ok(c) => c,
        Err(r) => return r.into_response(),
    };
    let plan = match verification_plan(&data) {
        Ok(p) => p,
        Err(r) => return r.into_response(),
    };
    let timeout = Duration::from_secs(DEFAULT_TIMEOUT_S);
    let outcome = match run(&agent, cmd.program, None, timeout, false).await {
        Ok(o) => o,
        Err(RunFailure::Timeout) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                timed_out(&cmd.subject, &DEFAULT_TIMEOUT_S.to_string()),
            );
        }
        Err(RunFailure::Message(m)) => return error(StatusCode::INTERNAL_SERVER_ERROR, m),
        Err(RunFailure::Response(r)) => return r.into_response(),
    };
    let mut body = outcome_json(&outcome);
    if plan.checks.is_empty() {
        return flask(StatusCode::OK, &Value::Object(body));
    }
    if verify(&agent, &plan, &mut body).await {
        return flask(StatusCode::OK, &Value::Object(body));
    }
    body.insert("status".into(), json!("verification_failed"));
    body.insert("verification".into(), json!("failed"));
    body.insert("wait_time".into(), plan.max_wait_value);
    flask(StatusCode::INTERNAL_SERVER_ERROR, &Value::Object(body))
}

/// What `/execute_with_verification` checks once the command ran, and for how long.
struct VerificationPlan {
    /// `window_exists` and `command_success`, when given.
    checks: Map<String, Value>,
    /// `max_wait_time` as sent: a failed verification echoes it as its `wait_time`.
    max_wait_value: Value,
    max_wait: Duration,
    /// Between two rounds of checks.
    interval: Duration,
}

/// Reads `verification`, `max_wait_time` and `check_interval`; a 400 for a bad one.
fn verification_plan(data: &Map<String, Value>) -> Result<VerificationPlan, Reject> {
    let checks = match data.get("verification") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => {
            return Err(Reject(
                StatusCode::BAD_REQUEST,
                format!(
                    "verification must be an object, not {}",
                    python::type_name(other)
                ),
            ));
        }
    };
    let max_wait_value = data
        .get("max_wait_time")
        .cloned()
        .unwrap_or(Value::Number(Number::from(10)));
    let max_wait = match max_wait_value.as_f64() {
        Some(f) if f >= 0.0 && f.is_finite() && f < 1e7 => Duration::from_secs_f64(f),
        _ => {
            return Err(Reject(
                StatusCode::BAD_REQUEST,
                "max_wait_time must be a number of seconds".into(),
            ));
        }
    };
    let interval = match data.get("check_interval").map(Value::as_f64) {
        None => Duration::from_secs(1),
        Some(Some(f)) if f >= 0.0 && f.is_finite() && f < 1e7 => Duration::from_secs_f64(f),
        Some(_) => {
            return Err(Reject(
                StatusCode::BAD_REQUEST,
                "check_interval must be a number of seconds".into(),
            ));
        }
    };
    Ok(VerificationPlan {
        checks,
        max_wait_value,
        max_wait,
        interval,
    })
}

/// Runs the checks every interval until they all pass (then notes that and the time it took
/// in `body` and answers true) or the wait is over.
async fn verify(agent: &Agent, plan: &VerificationPlan, body: &mut Map<String, Value>) -> bool {
    let started = Instant::now();
    while started.elapsed() < plan.max_wait {
        let mut passed = true;
        if let Some(title) = plan.checks.get("window_exists") {
            passed &= window_exists(agent, title).await;
        }
        if let Some(check) = plan.checks.get("command_success") {
            passed &= command_succeeds(agent, check).await;
        }
        if passed {
            body.insert("verification".into(), json!("passed"));
            body.insert("wait_time".into(), json!(started.elapsed().as_secs_f64()));
            return true;
        }
        tokio::time::sleep(
            plan.interval
                .min(plan.max_wait.saturating_sub(started.elapsed())),
        )
        .await;
    }
    false
}

async fn window_exists(agent: &Agent, title: &Value) -> bool {
    match title.as_str() {
        Some(t) => super::display::window_exists(agent, t).await,
        None => false,
    }
}

async fn command_succeeds(agent: &Agent, check: &Value) -> bool {
    let Some(script) = check.as_str() else {
        return false;
    };
    let program = vec!["/bin/sh".to_string(), "-c".to_string(), script.to_string()];
    matches!(
        run(agent, program, None, VERIFY_COMMAND_TIMEOUT, false).await,
        Ok(o) if o.exit.code == Some(0)
    )
}

pub async fn launch(State(agent): State<Arc<Agent>>, CompatJson(data): CompatJson) -> Response {
    let cmd = match parse_command(&agent, &data) {
        Ok(c) => c,
        Err(r) => return r.into_response(),
    };
    if cmd.program.is_empty() {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "list index out of range");
    }
    // Checked before the spawn, as `run` does; a 400 here (the reference's `Popen` answered a
    // 500 for its ValueError).
    if cmd.program.iter().any(|a| a.contains('\0')) {
        return error(StatusCode::BAD_REQUEST, "embedded null byte");
    }
    let p = match prepared(&agent, cmd.program, None) {
        Ok(p) => p,
        Err(r) => return r.into_response(),
    };
    // Launched programs are background commands: tracked, their output kept, ended on
    // shutdown.
    let started = agent
        .commands
        .start_background(p, Background::default())
        .await;
    match started {
        Ok(_) => text(
            StatusCode::OK,
            format!("{} launched successfully", cmd.shown),
        ),
        Err(ExecError::Spawn(f)) => error(StatusCode::INTERNAL_SERVER_ERROR, f.python_message()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

pub async fn run_python(State(agent): State<Arc<Agent>>, CompatJson(data): CompatJson) -> Response {
    let code = match data.get("code") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(v) if truthy(v) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("code must be a string, not {}", python::type_name(v)),
            );
        }
        _ => return error(StatusCode::BAD_REQUEST, "Code not supplied!"),
    };
    let mut hex = [0u8; 16];
    let _ = getrandom::fill(&mut hex);
    let name: String = hex.iter().map(|b| format!("{b:02x}")).collect();
    let path = std::path::PathBuf::from(format!("/tmp/python_exec_{name}.py"));
    if let Err(e) = write_script(&agent, &path, code.as_bytes(), 0o644) {
        return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    }
    let python = if std::path::Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3".to_string()
    } else {
        "python3".to_string()
    };
    let result = run(
        &agent,
        vec![python, path.to_string_lossy().into_owned()],
        None,
        RUN_PYTHON_TIMEOUT,
        false,
    )
    .await;
    let _ = std::fs::remove_file(&path);
    match result {
        Ok(o) => {
            let stdout = python_text(&o.stdout);
            let stderr = python_text(&o.stderr);
            let rc = o.exit.python_returncode();
            let mut message = stdout.clone();
            if !stderr.is_empty() {
                message = if message.is_empty() {
                    stderr.clone()
                } else {
                    format!("{message}\n{stderr}")
                };
            }
            let mut err = stderr;
            if rc != 0 && err.is_empty() {
                err = format!("Process exited with code {rc}");
                message = err.clone();
            }
            flask(
                StatusCode::OK,
                &json!({
                    "status": if rc == 0 { "success" } else { "error" },
                    "message": message,
                    "need_more": false,
                    "output": stdout,
                    "error": err,
                    "return_code": rc,
                }),
            )
        }
        Err(RunFailure::Timeout) => flask(
            StatusCode::INTERNAL_SERVER_ERROR,
            &json!({
                "status": "error",
                "message": "Execution timeout: Code took too long to execute",
                "error": "TimeoutExpired",
                "need_more": false,
                "output": null,
            }),
        ),
        Err(RunFailure::Message(m)) => error(StatusCode::INTERNAL_SERVER_ERROR, m),
        Err(RunFailure::Response(r)) => r.into_response(),
    }
}

pub async fn run_bash_script(
    State(agent): State<Arc<Agent>>,
    CompatJson(data): CompatJson,
) -> Response {
    let script = match script_param(&data) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let (timeout, shown_timeout) = match seconds(&data, "timeout", 100) {
        Ok(t) => t,
        Err(r) => return r.into_response(),
    };
    let cwd = match working_dir_param(&agent, &data) {
        Ok(d) => d,
        Err(r) => return r.into_response(),
    };
    let content = if script.contains("#!/bin/bash") {
        script
    } else {
        format!("#!/bin/bash\n\n{script}")
    };
    let path = std::path::PathBuf::from(format!("/tmp/tmp{}.sh", temp_name()));
    if let Err(e) = write_script(&agent, &path, content.as_bytes(), 0o755) {
        return BashFailure(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Failed to execute script: {e}"),
        )
        .into_response();
    }
    let shell = if std::path::Path::new("/bin/bash").exists() {
        "/bin/bash"
    } else {
        "sh"
    };
    let result = run(
        &agent,
        vec![shell.to_string(), path.to_string_lossy().into_owned()],
        cwd,
        timeout,
        true,
    )
    .await;
    let _ = std::fs::remove_file(&path);
    bash_script_answer(result, &shown_timeout)
}

/// A `/run_bash_script` error answer:
/// `{"status": "error", "output", "error": "", "returncode": -1}`.
struct BashFailure(StatusCode, String);

impl IntoResponse for BashFailure {
    fn into_response(self) -> Response {
        flask(
            self.0,
            &json!({"status": "error", "output": self.1, "error": "", "returncode": -1}),
        )
    }
}

/// The `script` field: a non-empty string.
fn script_param(data: &Map<String, Value>) -> Result<String, BashFailure> {
    match data.get("script") {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(v) if truthy(v) => Err(BashFailure(
            StatusCode::BAD_REQUEST,
            format!("script must be a string, not {}", python::type_name(v)),
        )),
        _ => Err(BashFailure(
            StatusCode::BAD_REQUEST,
            "Script not supplied!".into(),
        )),
    }
}

/// The `working_dir` field, `~` expanded; it must be an existing directory.
fn working_dir_param(
    agent: &Agent,
    data: &Map<String, Value>,
) -> Result<Option<std::path::PathBuf>, BashFailure> {
    match data.get("working_dir") {
        Some(Value::String(d)) if !d.is_empty() => {
            let expanded = python::expanduser(d, &agent.home, &agent.account_name);
            if !std::path::Path::new(&expanded).is_dir() {
                return Err(BashFailure(
                    StatusCode::BAD_REQUEST,
                    format!("Working directory does not exist: {expanded}"),
                ));
            }
            Ok(Some(std::path::PathBuf::from(expanded)))
        }
        Some(v) if truthy(v) => Err(BashFailure(
            StatusCode::BAD_REQUEST,
            format!("working_dir must be a string, not {}", python::type_name(v)),
        )),
        _ => Ok(None),
    }
}

/// `/run_bash_script`'s answer for how the script's run ended.
fn bash_script_answer(
    result: Result<ForegroundOutcome, RunFailure>,
    shown_timeout: &str,
) -> Response {
    match result {
        Ok(o) => {
            let rc = o.exit.python_returncode();
            flask(
                StatusCode::OK,
                &json!({
                    "status": if rc == 0 { "success" } else { "error" },
                    "output": python_text(&o.stdout),
                    "error": "",
                    "returncode": rc,
                }),
            )
        }
        Err(RunFailure::Timeout) => BashFailure(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Script execution timed out after {shown_timeout} seconds"),
        )
        .into_response(),
        Err(RunFailure::Message(m)) => BashFailure(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Failed to execute script: {m}"),
        )
        .into_response(),
        Err(RunFailure::Response(r)) => r.into_response(),
    }
}

/// Writes a temporary script readable by the sandbox user.
fn write_script(
    agent: &Agent,
    path: &std::path::Path,
    content: &[u8],
    mode: u32,
) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    f.write_all(content)?;
    agent.files.chown(path);
    Ok(())
}

/// Eight characters like `tempfile`'s names.
fn temp_name() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789_";
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    b.iter()
        .map(|x| ALPHABET[*x as usize % ALPHABET.len()] as char)
        .collect()
}
