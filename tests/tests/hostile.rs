//! Hostile input on every route that takes input: the agent's compat root routes and native
//! `/v1` (a process sandbox with a desktop) and the controller's (process provider). One table
//! of rows `(name, target, method, path, headers, body, expected status)`; each row is sent over
//! a raw HTTP/1.1 connection with a deadline and must answer its expected status with the error
//! body of its surface (native and controller: `{"error": {"code", "message"}}`; compat: the
//! reference's JSON or text), never a 5xx the book does not name for that case, never a hang;
//! both processes must still answer after every row. Counts by status class are printed.

use std::time::{Duration, Instant};

use berth_tests::controller::{API_KEY, ControllerProcess};
use berth_tests::{AgentOptions, AgentProcess, TOKEN, host_port, wait_for};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Which server and surface a row goes to.
#[derive(Clone, Copy, PartialEq, Debug)]
enum To {
    /// The agent's OSWorld-compatible root routes (no token).
    Compat,
    /// The agent's `/v1` (bearer token added).
    Native,
    /// The controller (`X-Api-Key` added).
    Ctl,
}

/// The status a row must answer.
#[derive(Clone, Copy, Debug)]
enum Want {
    /// Exactly this status.
    Is(u16),
    /// Any 4xx.
    Client,
}

/// A row's body.
#[derive(Clone, Copy)]
enum B {
    None,
    Raw(&'static [u8]),
    /// A JSON object of this many bytes (past a route's limit), sent with a Content-Length.
    Big(usize),
    /// The same, sent chunked (no declared length).
    BigChunked(usize),
}

/// Content types.
const JSON: &str = "application/json";
const TEXT: &str = "text/plain";
const FORM: &str = "application/x-www-form-urlencoded";
const MULTI: &str = "multipart/form-data; boundary=XyZ";
/// No Content-Type header at all.
const NONE: &str = "";

/// The compat limit (16 MiB) and the native and controller JSON limits (4 MiB), plus a margin.
const COMPAT_OVER: usize = (16 << 20) + 4096;
const NATIVE_OVER: usize = (4 << 20) + 4096;

/// Per-request deadline: nothing here should take more than a few seconds.
const DEADLINE: Duration = Duration::from_secs(20);

struct Row {
    name: &'static str,
    to: To,
    method: &'static str,
    path: &'static str,
    content_type: &'static str,
    body: B,
    want: Want,
}

const fn row(
    name: &'static str,
    to: To,
    method: &'static str,
    path: &'static str,
    content_type: &'static str,
    body: B,
    want: Want,
) -> Row {
    Row {
        name,
        to,
        method,
        path,
        content_type,
        body,
        want,
    }
}

use B::{Big, BigChunked, Raw};
use To::{Compat as C, Ctl as K, Native as N};
use Want::{Client as X4, Is};

/// `{id}` in a controller path is the test's sandbox, `{cmd}` and `{pty}` in an agent path the
/// test's background command and terminal.
fn table() -> Vec<Row> {
    vec![
        // ---- compat: JSON routes ------------------------------------------------------------
        row("execute malformed", C, "POST", "/execute", JSON, Raw(b"{\"command\": ["), Is(400)),
        row("execute empty", C, "POST", "/execute", JSON, B::None, Is(400)),
        row("execute array body", C, "POST", "/execute", JSON, Raw(b"[1, 2]"), Is(400)),
        row("execute null body", C, "POST", "/execute", JSON, Raw(b"null"), Is(400)),
        row("execute item not str", C, "POST", "/execute", JSON, Raw(br#"{"command": ["echo", 5]}"#), Is(400)),
        // The reference's `subprocess.run(5)` TypeError inside its try: a 500 JSON (spec §2 #1).
        row("execute command int", C, "POST", "/execute", JSON, Raw(br#"{"command": 5}"#), Is(500)),
        row("execute timeout str", C, "POST", "/execute", JSON, Raw(br#"{"command": ["true"], "timeout": "5"}"#), Is(400)),
        row("execute timeout neg", C, "POST", "/execute", JSON, Raw(br#"{"command": ["true"], "timeout": -1}"#), Is(400)),
        // docs/src/agent/osworld-api.md: `{}` is the reference's 500 `list index out of range`.
        row("execute missing command", C, "POST", "/execute", JSON, Raw(b"{}"), Is(500)),
        // Deviation 10 (docs/src/agent/osworld-api.md): the reference's `embedded null byte` 500 for /execute.
        row("execute NUL arg", C, "POST", "/execute", JSON, Raw(br#"{"command": ["echo", "a\u0000b"]}"#), Is(500)),
        row("execute invalid utf8", C, "POST", "/execute", JSON, Raw(b"{\"command\": [\"echo\", \"\xff\xfe\"]}"), Is(400)),
        row("execute text/plain", C, "POST", "/execute", TEXT, Raw(br#"{"command": ["true"]}"#), Is(415)),
        row("execute no content-type", C, "POST", "/execute", NONE, Raw(br#"{"command": ["true"]}"#), Is(415)),
        row("execute form", C, "POST", "/execute", FORM, Raw(b"command=true"), Is(415)),
        row("execute oversize", C, "POST", "/execute", JSON, Big(COMPAT_OVER), Is(413)),
        row("execute oversize chunked", C, "POST", "/execute", JSON, BigChunked(COMPAT_OVER), Is(413)),
        row("setup/execute malformed", C, "POST", "/setup/execute", JSON, Raw(b"{,}"), Is(400)),
        row("setup/execute wrong ct", C, "POST", "/setup/execute", TEXT, Raw(b"{}"), Is(415)),
        row("setup/execute oversize", C, "POST", "/setup/execute", JSON, Big(COMPAT_OVER), Is(413)),
        row("ewv malformed", C, "POST", "/execute_with_verification", JSON, Raw(b"{\"a\""), Is(400)),
        row("ewv verification list", C, "POST", "/execute_with_verification", JSON, Raw(br#"{"command": ["true"], "verification": []}"#), Is(400)),
        row("ewv max_wait str", C, "POST", "/execute_with_verification", JSON, Raw(br#"{"command": ["true"], "max_wait_time": "x"}"#), Is(400)),
        row("ewv interval NaN-ish", C, "POST", "/execute_with_verification", JSON, Raw(br#"{"command": ["true"], "verification": {"window_exists": "x"}, "check_interval": -5}"#), Is(400)),
        row("ewv item not str", C, "POST", "/setup/execute_with_verification", JSON, Raw(br#"{"command": [null]}"#), Is(400)),
        row("ewv wrong ct", C, "POST", "/setup/execute_with_verification", NONE, Raw(b"{}"), Is(415)),
        row("ewv oversize", C, "POST", "/setup/execute_with_verification", JSON, Big(COMPAT_OVER), Is(413)),
        row("launch malformed", C, "POST", "/setup/launch", JSON, Raw(b"{\"command\": \"x"), Is(400)),
        row("launch NUL", C, "POST", "/setup/launch", JSON, Raw(br#"{"command": ["true\u0000"]}"#), Is(400)),
        row("launch item not str", C, "POST", "/setup/launch", JSON, Raw(br#"{"command": [{}]}"#), Is(400)),
        row("launch invalid utf8", C, "POST", "/setup/launch", JSON, Raw(b"{\"command\": \"\xc3\x28\"}"), Is(400)),
        row("launch empty", C, "POST", "/setup/launch", JSON, B::None, Is(400)),
        row("launch wrong ct", C, "POST", "/setup/launch", TEXT, Raw(b"{}"), Is(415)),
        row("launch oversize", C, "POST", "/setup/launch", JSON, Big(COMPAT_OVER), Is(413)),
        row("run_python malformed", C, "POST", "/run_python", JSON, Raw(b"{'code': 1}"), Is(400)),
        row("run_python code int", C, "POST", "/run_python", JSON, Raw(br#"{"code": 7}"#), Is(400)),
        row("run_python code list", C, "POST", "/run_python", JSON, Raw(br#"{"code": ["print(1)"]}"#), Is(400)),
        row("run_python missing", C, "POST", "/run_python", JSON, Raw(b"{}"), Is(400)),
        row("run_python empty", C, "POST", "/run_python", JSON, B::None, Is(400)),
        row("run_python wrong ct", C, "POST", "/run_python", FORM, Raw(b"code=1"), Is(415)),
        row("run_python oversize", C, "POST", "/run_python", JSON, Big(COMPAT_OVER), Is(413)),
        row("run_bash malformed", C, "POST", "/run_bash_script", JSON, Raw(b"{\"script\": }"), Is(400)),
        row("run_bash script obj", C, "POST", "/run_bash_script", JSON, Raw(br#"{"script": {"a": 1}}"#), Is(400)),
        row("run_bash timeout str", C, "POST", "/run_bash_script", JSON, Raw(br#"{"script": "true", "timeout": "10"}"#), Is(400)),
        row("run_bash working_dir int", C, "POST", "/run_bash_script", JSON, Raw(br#"{"script": "true", "working_dir": 3}"#), Is(400)),
        row("run_bash working_dir ..", C, "POST", "/run_bash_script", JSON, Raw(br#"{"script": "true", "working_dir": "../../../../no-such-berth-dir/.."}"#), Is(400)),
        row("run_bash working_dir NUL", C, "POST", "/run_bash_script", JSON, Raw(br#"{"script": "true", "working_dir": "/tmp\u0000"}"#), Is(400)),
        row("run_bash missing", C, "POST", "/run_bash_script", JSON, Raw(b"{}"), Is(400)),
        row("run_bash wrong ct", C, "POST", "/run_bash_script", NONE, Raw(b"{}"), Is(415)),
        row("run_bash oversize", C, "POST", "/run_bash_script", JSON, Big(COMPAT_OVER), Is(413)),
        row("list_directory malformed", C, "POST", "/list_directory", JSON, Raw(b"{\"path\""), Is(400)),
        row("list_directory path int", C, "POST", "/list_directory", JSON, Raw(br#"{"path": 1}"#), Is(400)),
        row("list_directory missing", C, "POST", "/list_directory", JSON, Raw(b"{}"), Is(400)),
        row("list_directory NUL", C, "POST", "/list_directory", JSON, Raw(br#"{"path": "/tmp\u0000/x"}"#), Is(400)),
        row("list_directory ..", C, "POST", "/list_directory", JSON, Raw(br#"{"path": "../../../../no-such-berth-dir/../.."}"#), Is(400)),
        row("list_directory invalid utf8", C, "POST", "/list_directory", JSON, Raw(b"{\"path\": \"/\xff\"}"), Is(400)),
        row("list_directory wrong ct", C, "POST", "/list_directory", TEXT, Raw(br#"{"path": "/"}"#), Is(415)),
        row("list_directory oversize", C, "POST", "/list_directory", JSON, Big(COMPAT_OVER), Is(413)),
        row("download_file malformed", C, "POST", "/setup/download_file", JSON, Raw(b"{]"), Is(400)),
        row("download_file missing", C, "POST", "/setup/download_file", JSON, Raw(br#"{"url": "http://127.0.0.1:9/"}"#), Is(400)),
        row("download_file types", C, "POST", "/setup/download_file", JSON, Raw(br#"{"url": 1, "path": []}"#), Is(400)),
        row("download_file NUL", C, "POST", "/setup/download_file", JSON, Raw(br#"{"url": "http://127.0.0.1:9/", "path": "/tmp/a\u0000b"}"#), Is(400)),
        row("download_file wrong ct", C, "POST", "/setup/download_file", NONE, Raw(b"{}"), Is(415)),
        row("download_file oversize", C, "POST", "/setup/download_file", JSON, Big(COMPAT_OVER), Is(413)),
        row("activate_window malformed", C, "POST", "/setup/activate_window", JSON, Raw(b"{\"window_name\": tru"), Is(400)),
        row("activate_window name int", C, "POST", "/setup/activate_window", JSON, Raw(br#"{"window_name": 3}"#), Is(400)),
        row("activate_window missing", C, "POST", "/setup/activate_window", JSON, Raw(b"{}"), Is(400)),
        row("activate_window NUL", C, "POST", "/setup/activate_window", JSON, Raw(br#"{"window_name": "a\u0000b"}"#), Is(200)),
        row("activate_window wrong ct", C, "POST", "/setup/activate_window", FORM, Raw(b"window_name=x"), Is(415)),
        row("activate_window oversize", C, "POST", "/setup/activate_window", JSON, Big(COMPAT_OVER), Is(413)),
        row("close_window malformed", C, "POST", "/setup/close_window", JSON, Raw(b"{{"), Is(400)),
        row("close_window name list", C, "POST", "/setup/close_window", JSON, Raw(br#"{"window_name": ["x"]}"#), Is(400)),
        row("close_window missing", C, "POST", "/setup/close_window", JSON, Raw(b"{}"), Is(400)),
        row("close_window empty", C, "POST", "/setup/close_window", JSON, B::None, Is(400)),
        row("close_window oversize", C, "POST", "/setup/close_window", JSON, Big(COMPAT_OVER), Is(413)),
        row("open_file malformed", C, "POST", "/setup/open_file", JSON, Raw(b"{\"path\": 1,}"), Is(400)),
        row("open_file path int", C, "POST", "/setup/open_file", JSON, Raw(br#"{"path": 5}"#), Is(400)),
        row("open_file missing", C, "POST", "/setup/open_file", JSON, Raw(b"{}"), Is(400)),
        row("open_file NUL", C, "POST", "/setup/open_file", JSON, Raw(br#"{"path": "/etc/hostname\u0000.txt"}"#), Is(400)),
        row("open_file ..", C, "POST", "/setup/open_file", JSON, Raw(br#"{"path": "../../../../no-such-berth-dir/../x"}"#), Is(404)),
        row("open_file wrong ct", C, "POST", "/setup/open_file", TEXT, Raw(b"{}"), Is(415)),
        row("open_file oversize", C, "POST", "/setup/open_file", JSON, Big(COMPAT_OVER), Is(413)),
        row("change_wallpaper malformed", C, "POST", "/setup/change_wallpaper", JSON, Raw(b"{\"path\":"), Is(400)),
        row("change_wallpaper path int", C, "POST", "/setup/change_wallpaper", JSON, Raw(br#"{"path": 2}"#), Is(400)),
        row("change_wallpaper missing", C, "POST", "/setup/change_wallpaper", JSON, Raw(b"{}"), Is(400)),
        row("change_wallpaper NUL", C, "POST", "/setup/change_wallpaper", JSON, Raw(br#"{"path": "/etc/hostname\u0000"}"#), Is(400)),
        row("change_wallpaper ..", C, "POST", "/setup/change_wallpaper", JSON, Raw(br#"{"path": "../../../../no-such-berth-dir/x.png"}"#), Is(404)),
        row("change_wallpaper wrong ct", C, "POST", "/setup/change_wallpaper", NONE, Raw(b"{}"), Is(415)),
        row("change_wallpaper oversize", C, "POST", "/setup/change_wallpaper", JSON, Big(COMPAT_OVER), Is(413)),
        // ---- compat: form routes ------------------------------------------------------------
        row("file missing", C, "POST", "/file", FORM, Raw(b"other=1"), Is(400)),
        row("file empty", C, "POST", "/file", FORM, B::None, Is(400)),
        row("file json body", C, "POST", "/file", JSON, Raw(br#"{"file_path": "/etc/hostname"}"#), Is(400)),
        row("file NUL", C, "POST", "/file", FORM, Raw(b"file_path=/etc/hostname%00.x"), Is(400)),
        row("file ..", C, "POST", "/file", FORM, Raw(b"file_path=../../../../no-such-berth-dir/../x"), Is(404)),
        row("file invalid utf8", C, "POST", "/file", FORM, Raw(b"file_path=/tmp/%FF%FE"), Is(404)),
        row("file raw invalid utf8", C, "POST", "/file", FORM, Raw(b"file_path=/tmp/\xff\xfe"), Is(404)),
        row("file multipart cut", C, "POST", "/file", MULTI, Raw(b"--XyZ\r\nContent-Disposition: form-data; name=\"file_path\"\r\n\r\n/etc/hos"), Is(400)),
        row("file oversize", C, "POST", "/file", FORM, Big(COMPAT_OVER), Is(413)),
        row("file oversize chunked", C, "POST", "/file", FORM, BigChunked(COMPAT_OVER), Is(413)),
        row("upload missing", C, "POST", "/setup/upload", MULTI, Raw(b"--XyZ--\r\n"), Is(400)),
        row("upload json", C, "POST", "/setup/upload", JSON, Raw(br#"{"file_path": "/tmp/x"}"#), Is(400)),
        row("upload empty", C, "POST", "/setup/upload", NONE, B::None, Is(400)),
        row("upload NUL path", C, "POST", "/setup/upload", MULTI, Raw(b"--XyZ\r\nContent-Disposition: form-data; name=\"file_path\"\r\n\r\n/tmp/a\x00b\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file_data\"; filename=\"x\"\r\n\r\nhi\r\n--XyZ--\r\n"), Is(400)),
        row("upload .. path", C, "POST", "/setup/upload", MULTI, Raw(b"--XyZ\r\nContent-Disposition: form-data; name=\"file_path\"\r\n\r\n/proc/../proc/self/no-such-dir/x\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file_data\"; filename=\"x\"\r\n\r\nhi\r\n--XyZ--\r\n"), Is(500)),
        row("upload cut", C, "POST", "/setup/upload", MULTI, Raw(b"--XyZ\r\nContent-Disposition: form-data; name=\"file_path\"\r\n\r\n/tmp/berth-hostile-upload\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file_data\"; filename=\"x\"\r\n\r\nhalf"), Is(400)),
        row("window_size missing", C, "POST", "/window_size", FORM, Raw(b"x=1"), Is(400)),
        row("window_size json", C, "POST", "/window_size", JSON, Raw(br#"{"app_class_name": "x"}"#), Is(400)),
        row("window_size NUL", C, "POST", "/window_size", FORM, Raw(b"app_class_name=a%00b"), Is(404)),
        row("window_size invalid utf8", C, "POST", "/window_size", FORM, Raw(b"app_class_name=%FF"), Is(404)),
        row("window_size oversize", C, "POST", "/window_size", FORM, Big(COMPAT_OVER), Is(413)),
        // ---- compat: routes that read no body ignore a hostile one ---------------------------
        row("screen_size garbage body", C, "POST", "/screen_size", JSON, Raw(b"{\xff"), Is(200)),
        row("desktop_path garbage body", C, "POST", "/desktop_path", JSON, Raw(b"[[["), Is(200)),
        row("wallpaper garbage body", C, "POST", "/wallpaper", TEXT, Raw(b"\x00\xff"), Is(200)),
        // No wallpaper set (XFCE's backdrops and GNOME's picture-uri emptied): the book's 404, where
        // an unset picture-uri (`''`) was read as the path "" and answered 500.
        row("unset the wallpaper", C, "POST", "/execute", JSON, Raw(br#"{"shell": true, "command": "for p in $(xfconf-query -c xfce4-desktop -l | grep last-image); do xfconf-query -c xfce4-desktop -p $p -s ''; done; gsettings set org.gnome.desktop.background picture-uri ''; gsettings get org.gnome.desktop.background picture-uri"}"#), Is(200)),
        row("wallpaper unset", C, "POST", "/wallpaper", NONE, B::None, Is(404)),
        row("end_recording garbage body", C, "POST", "/end_recording", JSON, Raw(b"{"), Is(400)),
        row("screenshot hostile query", C, "GET", "/screenshot?x=%00&y=%FF", NONE, B::None, Is(200)),
        row("terminal hostile query", C, "GET", "/terminal?%00=%FF", NONE, B::None, Is(200)),
        // ---- compat: paths ------------------------------------------------------------------
        row("compat .. in path", C, "POST", "/setup/../execute", JSON, Raw(b"{}"), Is(404)),
        row("compat encoded .. in path", C, "POST", "/setup/%2e%2e/execute", JSON, Raw(b"{}"), Is(404)),
        row("compat NUL in path", C, "GET", "/platform%00", NONE, B::None, Is(404)),
        row("compat invalid utf8 in path", C, "GET", "/%FF%FE", NONE, B::None, Is(404)),
        row("compat wrong method", C, "GET", "/execute", NONE, B::None, Is(405)),
        // ---- native /v1 ---------------------------------------------------------------------
        row("v1 exec malformed", N, "POST", "/v1/exec", JSON, Raw(b"{\"argv\": ["), Is(400)),
        row("v1 exec argv str", N, "POST", "/v1/exec", JSON, Raw(br#"{"argv": "ls"}"#), Is(400)),
        row("v1 exec timeout str", N, "POST", "/v1/exec", JSON, Raw(br#"{"argv": ["true"], "timeout_ms": "5"}"#), Is(400)),
        row("v1 exec env list", N, "POST", "/v1/exec", JSON, Raw(br#"{"argv": ["true"], "env": ["A=1"]}"#), Is(400)),
        row("v1 exec missing", N, "POST", "/v1/exec", JSON, Raw(b"{}"), Is(400)),
        row("v1 exec NUL argv", N, "POST", "/v1/exec", JSON, Raw(br#"{"argv": ["echo", "a\u0000"]}"#), Is(400)),
        row("v1 exec NUL env", N, "POST", "/v1/exec", JSON, Raw(br#"{"argv": ["true"], "env": {"A\u0000": "1"}}"#), Is(400)),
        row("v1 exec cwd ..", N, "POST", "/v1/exec", JSON, Raw(br#"{"argv": ["true"], "cwd": "../../../../no-such-berth-dir/.."}"#), X4),
        row("v1 exec invalid utf8", N, "POST", "/v1/exec", JSON, Raw(b"{\"shell\": \"\xff\"}"), Is(400)),
        row("v1 exec empty", N, "POST", "/v1/exec", JSON, B::None, Is(400)),
        row("v1 exec text/plain", N, "POST", "/v1/exec", TEXT, Raw(br#"{"argv": ["true"]}"#), Is(415)),
        // `curl -d` sends JSON labelled a form, or a client sends no type: read as JSON.
        row("v1 exec no ct", N, "POST", "/v1/exec", NONE, Raw(br#"{"argv": ["true"]}"#), Is(200)),
        row("v1 exec curl -d", N, "POST", "/v1/exec", FORM, Raw(br#"{"argv": ["true"]}"#), Is(200)),
        row("v1 exec oversize", N, "POST", "/v1/exec", JSON, Big(NATIVE_OVER), Is(413)),
        row("v1 exec oversize chunked", N, "POST", "/v1/exec", JSON, BigChunked(NATIVE_OVER), Is(413)),
        row("v1 commands NUL id", N, "GET", "/v1/commands/%00", NONE, B::None, Is(404)),
        row("v1 commands invalid utf8 id", N, "GET", "/v1/commands/%FF", NONE, B::None, X4),
        row("v1 commands .. id", N, "GET", "/v1/commands/..%2F..%2Fetc", NONE, B::None, Is(404)),
        row("v1 output from_seq str", N, "GET", "/v1/commands/{cmd}/output?from_seq=x", NONE, B::None, Is(400)),
        row("v1 output from_seq neg", N, "GET", "/v1/commands/{cmd}/output?from_seq=-1", NONE, B::None, Is(400)),
        row("v1 output invalid utf8 q", N, "GET", "/v1/commands/{cmd}/output?from_seq=%FF", NONE, B::None, Is(400)),
        row("v1 stdin malformed", N, "POST", "/v1/commands/{cmd}/stdin", JSON, Raw(b"{\"data\""), Is(400)),
        row("v1 stdin data int", N, "POST", "/v1/commands/{cmd}/stdin", JSON, Raw(br#"{"data": 1}"#), Is(400)),
        row("v1 stdin b64 bad", N, "POST", "/v1/commands/{cmd}/stdin", JSON, Raw(br#"{"data_b64": "!!!"}"#), Is(400)),
        row("v1 stdin wrong ct", N, "POST", "/v1/commands/{cmd}/stdin", TEXT, Raw(b"hi"), Is(415)),
        row("v1 stdin oversize", N, "POST", "/v1/commands/{cmd}/stdin", JSON, Big(NATIVE_OVER), Is(413)),
        row("v1 signal bogus", N, "POST", "/v1/commands/{cmd}/signal", JSON, Raw(br#"{"signal": "NOPE"}"#), Is(400)),
        row("v1 signal list", N, "POST", "/v1/commands/{cmd}/signal", JSON, Raw(br#"{"signal": []}"#), Is(400)),
        row("v1 signal missing", N, "POST", "/v1/commands/{cmd}/signal", JSON, Raw(b"{}"), Is(400)),
        row("v1 signal NUL", N, "POST", "/v1/commands/{cmd}/signal", JSON, Raw(br#"{"signal": "TERM\u0000"}"#), Is(400)),
        row("v1 signal out of range", N, "POST", "/v1/commands/{cmd}/signal", JSON, Raw(br#"{"signal": 99999}"#), Is(400)),
        row("v1 pty malformed", N, "POST", "/v1/pty", JSON, Raw(b"{\"cmd\": ["), Is(400)),
        row("v1 pty cols str", N, "POST", "/v1/pty", JSON, Raw(br#"{"cols": "80"}"#), Is(400)),
        row("v1 pty cols overflow", N, "POST", "/v1/pty", JSON, Raw(br#"{"cols": 70000}"#), Is(400)),
        row("v1 pty cmd str", N, "POST", "/v1/pty", JSON, Raw(br#"{"cmd": "sh"}"#), Is(400)),
        row("v1 pty NUL cmd", N, "POST", "/v1/pty", JSON, Raw(br#"{"cmd": ["sh\u0000"]}"#), Is(400)),
        row("v1 pty cwd ..", N, "POST", "/v1/pty", JSON, Raw(br#"{"cmd": ["true"], "cwd": "../../../../no-such-berth-dir"}"#), X4),
        row("v1 pty wrong ct", N, "POST", "/v1/pty", TEXT, Raw(b"{}"), Is(415)),
        row("v1 pty oversize", N, "POST", "/v1/pty", JSON, Big(NATIVE_OVER), Is(413)),
        row("v1 pty NUL id", N, "GET", "/v1/pty/%00", NONE, B::None, Is(404)),
        row("v1 pty invalid utf8 id", N, "DELETE", "/v1/pty/%FF%FE", NONE, B::None, X4),
        row("v1 resize malformed", N, "POST", "/v1/pty/{pty}/resize", JSON, Raw(b"{"), Is(400)),
        row("v1 resize missing", N, "POST", "/v1/pty/{pty}/resize", JSON, Raw(b"{}"), Is(400)),
        row("v1 resize neg", N, "POST", "/v1/pty/{pty}/resize", JSON, Raw(br#"{"cols": -1, "rows": 5}"#), Is(400)),
        row("v1 resize wrong ct", N, "POST", "/v1/pty/{pty}/resize", TEXT, Raw(br#"{"cols": 80, "rows": 24}"#), Is(415)),
        row("v1 resize oversize", N, "POST", "/v1/pty/{pty}/resize", JSON, Big(NATIVE_OVER), Is(413)),
        row("v1 attach bad query", N, "GET", "/v1/pty/{pty}/attach?cols=x", NONE, B::None, X4),
        row("v1 files missing path", N, "GET", "/v1/files", NONE, B::None, Is(400)),
        row("v1 files NUL path", N, "GET", "/v1/files?path=/etc/hostname%00", NONE, B::None, Is(400)),
        row("v1 files ..", N, "GET", "/v1/files?path=../../../../no-such-berth-dir/../x", NONE, B::None, Is(404)),
        row("v1 files invalid utf8", N, "GET", "/v1/files?path=/tmp/%FF", NONE, B::None, Is(404)),
        row("v1 files dir", N, "GET", "/v1/files?path=/", NONE, B::None, Is(400)),
        row("v1 upload NUL path", N, "PUT", "/v1/files?path=/tmp/a%00b", TEXT, Raw(b"hi"), Is(400)),
        row("v1 upload bad mode", N, "PUT", "/v1/files?path=/tmp/berth-hostile-mode&mode=999", TEXT, Raw(b"hi"), Is(400)),
        row("v1 upload mode huge", N, "PUT", "/v1/files?path=/tmp/berth-hostile-mode&mode=77777777777777777777", TEXT, Raw(b"hi"), Is(400)),
        row("v1 upload into /proc", N, "PUT", "/v1/files?path=/proc/berth-hostile/x", TEXT, Raw(b"hi"), X4),
        row("v1 upload missing path", N, "PUT", "/v1/files", TEXT, Raw(b"hi"), Is(400)),
        row("v1 fs list NUL", N, "GET", "/v1/fs/list?path=%00", NONE, B::None, Is(400)),
        row("v1 fs list depth str", N, "GET", "/v1/fs/list?path=/tmp&depth=x", NONE, B::None, Is(400)),
        row("v1 fs list depth neg", N, "GET", "/v1/fs/list?path=/tmp&depth=-1", NONE, B::None, Is(400)),
        row("v1 fs list ..", N, "GET", "/v1/fs/list?path=../../../../no-such-berth-dir", NONE, B::None, Is(404)),
        row("v1 fs stat missing", N, "GET", "/v1/fs/stat", NONE, B::None, Is(400)),
        row("v1 fs stat invalid utf8", N, "GET", "/v1/fs/stat?path=%FF%FE", NONE, B::None, Is(404)),
        row("v1 fs delete NUL", N, "DELETE", "/v1/fs?path=/tmp/x%00", NONE, B::None, Is(400)),
        row("v1 fs delete recursive str", N, "DELETE", "/v1/fs?path=/tmp/no-such-berth&recursive=maybe", NONE, B::None, Is(400)),
        row("v1 fs delete ..", N, "DELETE", "/v1/fs?path=../../../../no-such-berth-dir", NONE, B::None, Is(404)),
        row("v1 mkdir malformed", N, "POST", "/v1/fs/mkdir", JSON, Raw(b"{\"path\": "), Is(400)),
        row("v1 mkdir path int", N, "POST", "/v1/fs/mkdir", JSON, Raw(br#"{"path": 1}"#), Is(400)),
        row("v1 mkdir missing", N, "POST", "/v1/fs/mkdir", JSON, Raw(b"{}"), Is(400)),
        row("v1 mkdir NUL", N, "POST", "/v1/fs/mkdir", JSON, Raw(br#"{"path": "/tmp/a\u0000"}"#), Is(400)),
        row("v1 mkdir in /proc", N, "POST", "/v1/fs/mkdir", JSON, Raw(br#"{"path": "/proc/../proc/berth-hostile"}"#), X4),
        row("v1 mkdir invalid utf8", N, "POST", "/v1/fs/mkdir", JSON, Raw(b"{\"path\": \"/tmp/\xff\"}"), Is(400)),
        row("v1 mkdir empty", N, "POST", "/v1/fs/mkdir", JSON, B::None, Is(400)),
        // A real form is read as the JSON it is not: a 400 saying so.
        row("v1 mkdir form", N, "POST", "/v1/fs/mkdir", FORM, Raw(b"path=/tmp/x"), Is(400)),
        row("v1 mkdir wrong ct", N, "POST", "/v1/fs/mkdir", TEXT, Raw(br#"{"path": "/tmp/x"}"#), Is(415)),
        row("v1 mkdir oversize", N, "POST", "/v1/fs/mkdir", JSON, Big(NATIVE_OVER), Is(413)),
        row("v1 mkdir oversize chunked", N, "POST", "/v1/fs/mkdir", JSON, BigChunked(NATIVE_OVER), Is(413)),
        row("v1 move malformed", N, "POST", "/v1/fs/move", JSON, Raw(b"{\"from\"}"), Is(400)),
        row("v1 move missing to", N, "POST", "/v1/fs/move", JSON, Raw(br#"{"from": "/tmp/x"}"#), Is(400)),
        row("v1 move NUL", N, "POST", "/v1/fs/move", JSON, Raw(br#"{"from": "/tmp/a\u0000", "to": "/tmp/b"}"#), Is(400)),
        row("v1 move ..", N, "POST", "/v1/fs/move", JSON, Raw(br#"{"from": "../../../../no-such-berth-dir/x", "to": "/tmp/berth-hostile-y"}"#), Is(404)),
        row("v1 move wrong ct", N, "POST", "/v1/fs/move", TEXT, Raw(b"{}"), Is(415)),
        row("v1 move oversize", N, "POST", "/v1/fs/move", JSON, Big(NATIVE_OVER), Is(413)),
        row("v1 watch NUL", N, "GET", "/v1/fs/watch?path=%00", NONE, B::None, Is(400)),
        row("v1 watch missing", N, "GET", "/v1/fs/watch?path=../../../../no-such-berth-dir", NONE, B::None, Is(404)),
        row("v1 screenshot format", N, "GET", "/v1/screenshot?format=gif%00", NONE, B::None, Is(400)),
        row("v1 screenshot scale str", N, "GET", "/v1/screenshot?scale=big", NONE, B::None, Is(400)),
        row("v1 screenshot scale huge", N, "GET", "/v1/screenshot?scale=100000", NONE, B::None, Is(400)),
        row("v1 screenshot scale zero", N, "GET", "/v1/screenshot?scale=0", NONE, B::None, Is(400)),
        row("v1 screenshot region huge", N, "GET", "/v1/screenshot?region=0,0,100000000,100000000", NONE, B::None, Is(400)),
        row("v1 screenshot region bad", N, "GET", "/v1/screenshot?region=1,2,x", NONE, B::None, Is(400)),
        row("v1 screenshot quality", N, "GET", "/v1/screenshot?format=jpeg&quality=1000", NONE, B::None, Is(400)),
        row("v1 screenshot settle day", N, "GET", "/v1/screenshot?settle_ms=86400000&timeout_ms=86400000", NONE, B::None, Is(400)),
        row("v1 input malformed", N, "POST", "/v1/input", JSON, Raw(b"{\"actions\": [{]}"), Is(400)),
        row("v1 input actions obj", N, "POST", "/v1/input", JSON, Raw(br#"{"actions": {}}"#), Is(400)),
        row("v1 input unknown action", N, "POST", "/v1/input", JSON, Raw(br#"{"actions": [{"type": "explode"}]}"#), Is(400)),
        row("v1 input x str", N, "POST", "/v1/input", JSON, Raw(br#"{"actions": [{"type": "move", "x": "1", "y": 1}]}"#), Is(400)),
        row("v1 input missing", N, "POST", "/v1/input", JSON, Raw(b"{}"), Is(400)),
        row("v1 input NUL text", N, "POST", "/v1/input", JSON, Raw(br#"{"actions": [{"type": "key", "key": "a\u0000"}]}"#), Is(400)),
        row("v1 input settle day", N, "POST", "/v1/input", JSON, Raw(br#"{"actions": [], "screenshot_after": {"settle_ms": 86400000, "timeout_ms": 86400000}}"#), Is(400)),
        row("v1 input wrong ct", N, "POST", "/v1/input", TEXT, Raw(b"{}"), Is(415)),
        row("v1 input oversize", N, "POST", "/v1/input", JSON, Big(NATIVE_OVER), Is(413)),
        row("v1 clipboard malformed", N, "PUT", "/v1/clipboard", JSON, Raw(b"{\"text\": \""), Is(400)),
        row("v1 clipboard text int", N, "PUT", "/v1/clipboard", JSON, Raw(br#"{"text": 1}"#), Is(400)),
        row("v1 clipboard missing", N, "PUT", "/v1/clipboard", JSON, Raw(b"{}"), Is(400)),
        row("v1 clipboard wrong ct", N, "PUT", "/v1/clipboard", TEXT, Raw(b"hello"), Is(415)),
        row("v1 clipboard oversize", N, "PUT", "/v1/clipboard", JSON, Big(NATIVE_OVER), Is(413)),
        row("v1 computer malformed", N, "POST", "/v1/computer", JSON, Raw(b"{\"action\": "), Is(400)),
        row("v1 computer action int", N, "POST", "/v1/computer", JSON, Raw(br#"{"action": 1}"#), Is(400)),
        row("v1 computer missing", N, "POST", "/v1/computer", JSON, Raw(b"{}"), Is(400)),
        row("v1 computer coordinate str", N, "POST", "/v1/computer", JSON, Raw(br#"{"action": "mouse_move", "coordinate": "1,2"}"#), Is(400)),
        row("v1 computer coordinate neg", N, "POST", "/v1/computer", JSON, Raw(br#"{"action": "left_click", "coordinate": [-5, -5]}"#), Is(400)),
        row("v1 computer scale zero", N, "POST", "/v1/computer", JSON, Raw(br#"{"action": "screenshot", "display_width_px": 0, "display_height_px": 0}"#), Is(400)),
        row("v1 computer key NUL", N, "POST", "/v1/computer", JSON, Raw(br#"{"action": "key", "text": "\u0000"}"#), Is(400)),
        row("v1 computer wait forever", N, "POST", "/v1/computer", JSON, Raw(br#"{"action": "wait", "duration": 1e12}"#), Is(400)),
        row("v1 computer wrong ct", N, "POST", "/v1/computer", TEXT, Raw(b"{}"), Is(415)),
        row("v1 computer oversize", N, "POST", "/v1/computer", JSON, Big(NATIVE_OVER), Is(413)),
        row("v1 recordings malformed", N, "POST", "/v1/recordings", JSON, Raw(b"{\"fps\": "), Is(400)),
        row("v1 recordings fps str", N, "POST", "/v1/recordings", JSON, Raw(br#"{"fps": "x"}"#), Is(400)),
        row("v1 recordings wrong ct", N, "POST", "/v1/recordings", TEXT, Raw(b"{}"), Is(415)),
        row("v1 recordings oversize", N, "POST", "/v1/recordings", JSON, Big(NATIVE_OVER), Is(413)),
        row("v1 recordings NUL id", N, "GET", "/v1/recordings/%00", NONE, B::None, Is(404)),
        row("v1 recordings .. file", N, "GET", "/v1/recordings/..%2F..%2Ftoken/file", NONE, B::None, Is(404)),
        row("v1 viewer-tokens malformed", N, "POST", "/v1/viewer-tokens", JSON, Raw(b"{\"ttl_seconds\": }"), Is(400)),
        row("v1 viewer-tokens ttl str", N, "POST", "/v1/viewer-tokens", JSON, Raw(br#"{"ttl_seconds": "60"}"#), Is(400)),
        row("v1 viewer-tokens ttl neg", N, "POST", "/v1/viewer-tokens", JSON, Raw(br#"{"ttl_seconds": -60}"#), Is(400)),
        row("v1 viewer-tokens ttl huge", N, "POST", "/v1/viewer-tokens", JSON, Raw(br#"{"ttl_seconds": 1e300}"#), Is(400)),
        row("v1 viewer-tokens wrong ct", N, "POST", "/v1/viewer-tokens", TEXT, Raw(b"{}"), Is(415)),
        row("v1 viewer-tokens oversize", N, "POST", "/v1/viewer-tokens", JSON, Big(NATIVE_OVER), Is(413)),
        row("v1 ready wait str", N, "GET", "/v1/ready?wait=forever", NONE, B::None, Is(400)),
        row("v1 ready wait NUL", N, "GET", "/v1/ready?wait=%00", NONE, B::None, Is(400)),
        row("v1 events from_seq str", N, "GET", "/v1/events?from_seq=abc", NONE, B::None, Is(400)),
        row("v1 events limit neg", N, "GET", "/v1/events?limit=-1", NONE, B::None, Is(400)),
        row("v1 events invalid utf8", N, "GET", "/v1/events?follow=%FF", NONE, B::None, Is(400)),
        row("v1 vnc ..", N, "GET", "/v1/vnc/..%2F..%2F..%2Fetc%2Fpasswd", NONE, B::None, X4),
        row("v1 vnc NUL", N, "GET", "/v1/vnc/vnc.html%00", NONE, B::None, Is(404)),
        row("v1 vnc invalid utf8", N, "GET", "/v1/vnc/%FF", NONE, B::None, X4),
        row("v1 cdp target ..", N, "GET", "/v1/browser/cdp/page/..%2F..%2Fjson", NONE, B::None, Is(404)),
        row("v1 cdp target invalid utf8", N, "GET", "/v1/browser/cdp/page/%FF", NONE, B::None, X4),
        row("v1 .. in path", N, "GET", "/v1/fs/../files?path=/etc/hostname", NONE, B::None, Is(404)),
        row("v1 NUL in path", N, "GET", "/v1/display%00", NONE, B::None, Is(404)),
        row("v1 wrong method", N, "PATCH", "/v1/exec", JSON, Raw(b"{}"), Is(405)),
        // ---- controller -------------------------------------------------------------------
        row("create malformed", K, "POST", "/sandbox/sandboxes/v1", JSON, Raw(b"{\"profile\": "), Is(400)),
        row("create profile int", K, "POST", "/sandbox/sandboxes/v1", JSON, Raw(br#"{"profile": 1}"#), Is(400)),
        row("create labels list", K, "POST", "/sandbox/sandboxes/v1", JSON, Raw(br#"{"profile": "ide", "labels": ["a"]}"#), Is(400)),
        row("create ttl neg", K, "POST", "/sandbox/sandboxes/v1", JSON, Raw(br#"{"profile": "ide", "ttl_seconds": -1}"#), Is(400)),
        row("create missing", K, "POST", "/sandbox/sandboxes/v1", JSON, Raw(b"{}"), Is(400)),
        row("create NUL profile", K, "POST", "/sandbox/sandboxes/v1", JSON, Raw(br#"{"profile": "ide\u0000"}"#), Is(400)),
        row("create .. profile", K, "POST", "/sandbox/sandboxes/v1", JSON, Raw(br#"{"profile": "../ide"}"#), Is(400)),
        row("create .. image_ref", K, "POST", "/sandbox/sandboxes/v1?wait=false", JSON, Raw(br#"{"profile": "ide", "image_ref": "../../../../etc/passwd"}"#), Is(422)),
        row("create invalid utf8", K, "POST", "/sandbox/sandboxes/v1", JSON, Raw(b"{\"profile\": \"\xff\"}"), Is(400)),
        row("create empty", K, "POST", "/sandbox/sandboxes/v1", JSON, B::None, Is(400)),
        row("create text/plain", K, "POST", "/sandbox/sandboxes/v1", TEXT, Raw(br#"{"profile": "nope"}"#), X4),
        row("create no ct", K, "POST", "/sandbox/sandboxes/v1", NONE, Raw(br#"{"profile": "nope"}"#), X4),
        row("create oversize", K, "POST", "/sandbox/sandboxes/v1", JSON, Big(NATIVE_OVER), Is(413)),
        row("create oversize chunked", K, "POST", "/sandbox/sandboxes/v1", JSON, BigChunked(NATIVE_OVER), Is(413)),
        row("create wait str", K, "POST", "/sandbox/sandboxes/v1?wait=maybe", JSON, Raw(br#"{"profile": "nope"}"#), Is(400)),
        row("create wait invalid utf8", K, "POST", "/sandbox/sandboxes/v1?wait=%FF", JSON, Raw(br#"{"profile": "nope"}"#), Is(400)),
        row("list label without =", K, "GET", "/sandbox/sandboxes/v1?label=%00", NONE, B::None, Is(400)),
        row("list unknown param", K, "GET", "/sandbox/sandboxes/v1?x=%FF", NONE, B::None, Is(400)),
        row("list bogus status", K, "GET", "/sandbox/sandboxes/v1?status=%00", NONE, B::None, Is(400)),
        row("show NUL id", K, "GET", "/sandbox/sandboxes/v1/%00", NONE, B::None, Is(404)),
        row("show invalid utf8 id", K, "GET", "/sandbox/sandboxes/v1/%FF%FE", NONE, B::None, X4),
        row("show .. id", K, "GET", "/sandbox/sandboxes/v1/..%2F..%2Fetc", NONE, B::None, Is(404)),
        row("delete invalid utf8 id", K, "DELETE", "/sandbox/sandboxes/v1/%C3%28", NONE, B::None, X4),
        row("exec malformed", K, "POST", "/sandbox/sandboxes/v1/{id}/exec", JSON, Raw(b"{\"command\": ["), Is(400)),
        row("exec command int", K, "POST", "/sandbox/sandboxes/v1/{id}/exec", JSON, Raw(br#"{"command": 1}"#), Is(400)),
        row("exec env list", K, "POST", "/sandbox/sandboxes/v1/{id}/exec", JSON, Raw(br#"{"command": ["true"], "env": ["A"]}"#), Is(400)),
        row("exec timeout str", K, "POST", "/sandbox/sandboxes/v1/{id}/exec", JSON, Raw(br#"{"command": ["true"], "timeout_ms": "1"}"#), Is(400)),
        row("exec missing", K, "POST", "/sandbox/sandboxes/v1/{id}/exec", JSON, Raw(b"{}"), Is(400)),
        row("exec NUL arg", K, "POST", "/sandbox/sandboxes/v1/{id}/exec", JSON, Raw(br#"{"command": ["echo", "a\u0000b"]}"#), Is(400)),
        row("exec NUL env", K, "POST", "/sandbox/sandboxes/v1/{id}/exec", JSON, Raw(br#"{"command": ["true"], "env": {"A\u0000": "x"}}"#), Is(400)),
        row("exec NUL run_id", K, "POST", "/sandbox/sandboxes/v1/{id}/exec", JSON, Raw(br#"{"command": ["true"], "run_id": "r\u0000"}"#), Is(400)),
        row("exec .. run_id", K, "POST", "/sandbox/sandboxes/v1/{id}/exec", JSON, Raw(br#"{"command": ["true"], "run_id": "../../x"}"#), Is(400)),
        row("exec invalid utf8", K, "POST", "/sandbox/sandboxes/v1/{id}/exec", JSON, Raw(b"{\"command\": \"\xff\"}"), Is(400)),
        row("exec empty", K, "POST", "/sandbox/sandboxes/v1/{id}/exec", JSON, B::None, Is(400)),
        row("exec wrong ct", K, "POST", "/sandbox/sandboxes/v1/{id}/exec", TEXT, Raw(br#"{"command": ["true"]}"#), X4),
        row("exec oversize", K, "POST", "/sandbox/sandboxes/v1/{id}/exec", JSON, Big(NATIVE_OVER), Is(413)),
        row("exec unknown sandbox", K, "POST", "/sandbox/sandboxes/v1/%00/exec", JSON, Raw(br#"{"command": ["true"]}"#), Is(404)),
        row("run NUL id", K, "GET", "/sandbox/sandboxes/v1/{id}/runs/%00", NONE, B::None, Is(404)),
        row("run invalid utf8 id", K, "GET", "/sandbox/sandboxes/v1/{id}/runs/%FF", NONE, B::None, X4),
        row("run output from_seq str", K, "GET", "/sandbox/sandboxes/v1/{id}/runs/x/output?from_seq=x", NONE, B::None, Is(400)),
        row("run output from_seq neg", K, "GET", "/sandbox/sandboxes/v1/{id}/runs/x/output?from_seq=-5", NONE, B::None, Is(400)),
        row("events from_seq str", K, "GET", "/sandbox/sandboxes/v1/{id}/events?from_seq=%FF", NONE, B::None, Is(400)),
        row("events limit str", K, "GET", "/sandbox/sandboxes/v1/{id}/events?limit=x", NONE, B::None, Is(400)),
        row("events unknown param", K, "GET", "/sandbox/sandboxes/v1/{id}/events?x=1", NONE, B::None, Is(400)),
        row("computer malformed", K, "POST", "/sandbox/sandboxes/v1/{id}/computer", JSON, Raw(b"{\"action\""), Is(400)),
        row("computer action int", K, "POST", "/sandbox/sandboxes/v1/{id}/computer", JSON, Raw(br#"{"action": 1}"#), Is(400)),
        row("computer oversize", K, "POST", "/sandbox/sandboxes/v1/{id}/computer", JSON, Big(NATIVE_OVER), Is(413)),
        row("files NUL path", K, "GET", "/sandbox/sandboxes/v1/{id}/files?path=/etc/hostname%00", NONE, B::None, Is(400)),
        row("files .. path", K, "GET", "/sandbox/sandboxes/v1/{id}/files?path=../../../../no-such-berth-dir/x", NONE, B::None, Is(404)),
        row("files missing path", K, "GET", "/sandbox/sandboxes/v1/{id}/files", NONE, B::None, Is(400)),
        row("files put NUL path", K, "PUT", "/sandbox/sandboxes/v1/{id}/files?path=/tmp/a%00", TEXT, Raw(b"x"), Is(400)),
        row("vnc ..", K, "GET", "/sandbox/sandboxes/v1/{id}/vnc/..%2F..%2Fetc%2Fpasswd", NONE, B::None, X4),
        row("lease malformed", K, "POST", "/sandbox/v1/leases", JSON, Raw(b"{\"thread_id\": 1,"), Is(400)),
        row("lease thread int", K, "POST", "/sandbox/v1/leases", JSON, Raw(br#"{"thread_id": 1, "profile": "ide"}"#), Is(400)),
        row("lease missing", K, "POST", "/sandbox/v1/leases", JSON, Raw(br#"{"profile": "ide"}"#), Is(400)),
        row("lease NUL profile", K, "POST", "/sandbox/v1/leases", JSON, Raw(br#"{"thread_id": "t\u0000", "profile": "nope\u0000"}"#), Is(400)),
        row("lease invalid utf8", K, "POST", "/sandbox/v1/leases", JSON, Raw(b"{\"thread_id\": \"\xff\", \"profile\": \"ide\"}"), Is(400)),
        row("lease empty", K, "POST", "/sandbox/v1/leases", JSON, B::None, Is(400)),
        row("lease wrong ct", K, "POST", "/sandbox/v1/leases", FORM, Raw(b"thread_id=t&profile=ide"), X4),
        row("lease oversize", K, "POST", "/sandbox/v1/leases", JSON, Big(NATIVE_OVER), Is(413)),
        row("renew malformed", K, "POST", "/sandbox/v1/leases/nope/renew", JSON, Raw(b"{"), Is(400)),
        row("renew ttl str", K, "POST", "/sandbox/v1/leases/nope/renew", JSON, Raw(br#"{"ttl_seconds": "60"}"#), Is(400)),
        row("renew ttl neg", K, "POST", "/sandbox/v1/leases/nope/renew", JSON, Raw(br#"{"ttl_seconds": -60}"#), Is(400)),
        row("renew ttl float huge", K, "POST", "/sandbox/v1/leases/nope/renew", JSON, Raw(br#"{"ttl_seconds": 1e30}"#), Is(400)),
        row("renew missing", K, "POST", "/sandbox/v1/leases/nope/renew", JSON, Raw(b"{}"), Is(400)),
        row("renew unknown lease", K, "POST", "/sandbox/v1/leases/%00/renew", JSON, Raw(br#"{"ttl_seconds": 60}"#), Is(404)),
        row("renew oversize", K, "POST", "/sandbox/v1/leases/nope/renew", JSON, Big(NATIVE_OVER), Is(413)),
        row("release invalid utf8 id", K, "DELETE", "/sandbox/v1/leases/%FF", NONE, B::None, X4),
        row("build malformed", K, "POST", "/sandbox/sandboxes/v1/images/build", JSON, Raw(b"{\"profile\""), Is(400)),
        row("build profile list", K, "POST", "/sandbox/sandboxes/v1/images/build", JSON, Raw(br#"{"profile": ["desktop"]}"#), Is(400)),
        row("build apps str", K, "POST", "/sandbox/sandboxes/v1/images/build", JSON, Raw(br#"{"profile": "desktop", "apps": "x"}"#), Is(400)),
        row("build missing", K, "POST", "/sandbox/sandboxes/v1/images/build", JSON, Raw(b"{}"), Is(400)),
        row("build NUL profile", K, "POST", "/sandbox/sandboxes/v1/images/build", JSON, Raw(br#"{"profile": "desktop\u0000"}"#), X4),
        row("build .. bundle", K, "POST", "/sandbox/sandboxes/v1/images/build", JSON, Raw(br#"{"profile": "desktop", "bundle": "../../osworld"}"#), X4),
        row("build oversize", K, "POST", "/sandbox/sandboxes/v1/images/build", JSON, Big(NATIVE_OVER), Is(413)),
        row("image job NUL", K, "GET", "/sandbox/sandboxes/v1/images/%00", NONE, B::None, Is(404)),
        row("image job invalid utf8", K, "GET", "/sandbox/sandboxes/v1/images/%FF", NONE, B::None, X4),
        row("catalog kind NUL", K, "GET", "/sandbox/v1/catalog?kind=%00", NONE, B::None, Is(400)),
        row("catalog kind invalid utf8", K, "GET", "/sandbox/v1/catalog?kind=%FF", NONE, B::None, Is(400)),
        row("catalog unknown param", K, "GET", "/sandbox/v1/catalog?x=1", NONE, B::None, Is(400)),
        row("pool malformed", K, "PUT", "/sandbox/v1/pools/ide", JSON, Raw(b"{\"size\": }"), Is(400)),
        row("pool size str", K, "PUT", "/sandbox/v1/pools/ide", JSON, Raw(br#"{"size": "5"}"#), Is(400)),
        row("pool size neg", K, "PUT", "/sandbox/v1/pools/ide", JSON, Raw(br#"{"size": -1}"#), Is(400)),
        row("pool size huge", K, "PUT", "/sandbox/v1/pools/ide", JSON, Raw(br#"{"size": 99999999}"#), Is(400)),
        row("pool unknown field", K, "PUT", "/sandbox/v1/pools/ide", JSON, Raw(br#"{"sizes": 1}"#), Is(400)),
        row("pool NUL profile", K, "PUT", "/sandbox/v1/pools/%00", JSON, Raw(br#"{"size": 1}"#), Is(404)),
        row("pool invalid utf8 profile", K, "PUT", "/sandbox/v1/pools/%FF", JSON, Raw(br#"{"size": 1}"#), X4),
        row("pool wrong ct", K, "PUT", "/sandbox/v1/pools/ide", TEXT, Raw(br#"{"size": 1}"#), X4),
        row("pool oversize", K, "PUT", "/sandbox/v1/pools/ide", JSON, Big(NATIVE_OVER), Is(413)),
        row("ctl .. in path", K, "GET", "/sandbox/v1/../v1/catalog", NONE, B::None, Is(404)),
        row("ctl NUL in path", K, "GET", "/sandbox/v1/catalog%00", NONE, B::None, Is(404)),
        row("ctl wrong method", K, "PATCH", "/sandbox/sandboxes/v1", JSON, Raw(b"{}"), Is(405)),
    ]
}

/// An answer read off the wire.
struct Answer {
    status: u16,
    content_type: String,
    body: Vec<u8>,
}

/// The body of a `Big` row: a JSON object of `n` bytes (a form body of `n` bytes parses too).
fn big_body(n: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(n);
    b.extend_from_slice(b"{\"a\": \"");
    b.resize(n - 2, b'x');
    b.extend_from_slice(b"\"}");
    b
}

/// One request on its own connection (`Connection: close`), written and read concurrently so a
/// server that answers before reading the whole body is heard; `Err` on a reset or a timeout.
async fn send(
    addr: &str,
    method: &str,
    target: &str,
    headers: &[(String, String)],
    body: &B,
) -> Result<Answer, String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut rd, mut wr) = stream.into_split();
    let mut head = format!("{method} {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    let (bytes, chunked) = match *body {
        B::None => (Vec::new(), false),
        B::Raw(b) => (b.to_vec(), false),
        B::Big(n) => (big_body(n), false),
        B::BigChunked(n) => (big_body(n), true),
    };
    if chunked {
        head.push_str("Transfer-Encoding: chunked\r\n\r\n");
    } else {
        head.push_str(&format!("Content-Length: {}\r\n\r\n", bytes.len()));
    }
    let writer = tokio::spawn(async move {
        wr.write_all(head.as_bytes()).await?;
        if chunked {
            for c in bytes.chunks(64 << 10) {
                wr.write_all(format!("{:x}\r\n", c.len()).as_bytes())
                    .await?;
                wr.write_all(c).await?;
                wr.write_all(b"\r\n").await?;
            }
            wr.write_all(b"0\r\n\r\n").await?;
        } else {
            wr.write_all(&bytes).await?;
        }
        wr.flush().await?;
        // Keep the write half open until the answer is read (dropping it would half-close).
        std::future::pending::<()>().await;
        Ok::<_, std::io::Error>(wr)
    });
    let mut raw = Vec::new();
    let read = tokio::time::timeout(DEADLINE, rd.read_to_end(&mut raw)).await;
    writer.abort();
    match read {
        Err(_) => return Err(format!("no complete answer in {DEADLINE:?}")),
        Ok(Err(e)) if raw.is_empty() => return Err(format!("read: {e}")),
        Ok(_) => {}
    }
    parse(&raw)
}

fn parse(raw: &[u8]) -> Result<Answer, String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("no HTTP head in {:?}", String::from_utf8_lossy(raw)))?;
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line in {head:?}"))?;
    let mut content_type = String::new();
    let mut chunked = false;
    for l in lines {
        let (k, v) = l.split_once(':').unwrap_or((l, ""));
        match k.trim().to_ascii_lowercase().as_str() {
            "content-type" => content_type = v.trim().to_string(),
            "transfer-encoding" => chunked = v.to_ascii_lowercase().contains("chunked"),
            _ => {}
        }
    }
    let mut body = raw[end + 4..].to_vec();
    if chunked {
        let mut out = Vec::new();
        let mut rest = &body[..];
        while let Some(nl) = rest.windows(2).position(|w| w == b"\r\n") {
            let len = usize::from_str_radix(
                String::from_utf8_lossy(&rest[..nl])
                    .split(';')
                    .next()
                    .unwrap_or("")
                    .trim(),
                16,
            )
            .unwrap_or(0);
            if len == 0 || rest.len() < nl + 2 + len {
                break;
            }
            out.extend_from_slice(&rest[nl + 2..nl + 2 + len]);
            rest = &rest[(nl + 4 + len).min(rest.len())..];
        }
        body = out;
    }
    Ok(Answer {
        status,
        content_type,
        body,
    })
}

/// Whether an error answer carries its surface's documented error body.
fn error_body_ok(to: To, path: &str, a: &Answer) -> Result<(), String> {
    let text = String::from_utf8_lossy(&a.body);
    let json: Option<Value> = serde_json::from_slice(&a.body).ok();
    // docs/src/agent/native-api.md: `/v1/computer` answers the tool result `{output?, error?, base64_image?}`, its
    // `error` a string, once its body parsed.
    let computer = path.ends_with("/computer");
    match to {
        To::Native | To::Ctl => {
            let ok = a.content_type.starts_with("application/json")
                && json.as_ref().is_some_and(|v| {
                    (v["error"]["code"].as_str().is_some_and(|c| !c.is_empty())
                        && v["error"]["message"]
                            .as_str()
                            .is_some_and(|m| !m.is_empty()))
                        || (computer && v["error"].as_str().is_some_and(|m| !m.is_empty()))
                });
            if ok {
                Ok(())
            } else {
                Err(format!(
                    "not {{\"error\": {{\"code\", \"message\"}}}} ({}): {text:.300}",
                    a.content_type
                ))
            }
        }
        To::Compat => {
            // The reference's shapes: `{"message", "status": "error"}`, `{"error": "..."}`
            // (`/file`, `/list_directory`, `/window_size`), `/run_bash_script`'s
            // `{"status": "error", "output", ...}`, or a text answer (`text/html`).
            let json_ok = a.content_type.starts_with("application/json")
                && json.as_ref().is_some_and(|v| {
                    (v["status"] == "error"
                        && (v["message"].as_str().is_some_and(|m| !m.is_empty())
                            || v["output"].as_str().is_some_and(|m| !m.is_empty())))
                        || v["error"].as_str().is_some_and(|m| !m.is_empty())
                });
            let text_ok = a.content_type.starts_with("text/html") && !text.trim().is_empty();
            if json_ok || text_ok {
                Ok(())
            } else {
                Err(format!(
                    "not a compat error body ({}): {text:.300}",
                    a.content_type
                ))
            }
        }
    }
}

async fn alive(addr: &str, path: &str, want_body: Option<&[u8]>) -> Result<(), String> {
    let a = send(addr, "GET", path, &[], &B::None)
        .await
        .map_err(|e| format!("{path}: {e}"))?;
    if a.status != 200 || want_body.is_some_and(|b| a.body != b) {
        return Err(format!(
            "{path}: {} {:.200}",
            a.status,
            String::from_utf8_lossy(&a.body)
        ));
    }
    Ok(())
}

#[tokio::test]
async fn every_route_answers_hostile_input_with_a_4xx_and_its_error_body() {
    let started = Instant::now();
    let agent = AgentProcess::start_with(AgentOptions {
        extra_args: vec![
            "--desktop".into(),
            "--cdp-listen".into(),
            "127.0.0.1:0".into(),
            "--screen".into(),
            "1024x768".into(),
        ],
        ..Default::default()
    })
    .await;
    let ctl = ControllerProcess::start("").await;
    let agent_addr = host_port(&agent.base).to_string();
    let ctl_addr = host_port(&ctl.base).to_string();
    let native = [("Authorization".to_string(), format!("Bearer {TOKEN}"))];
    let keyed = [("X-Api-Key".to_string(), API_KEY.to_string())];

    // What the rows address: a sandbox on the controller, a background command (stdin open)
    // and a terminal on the agent, and a desktop that is up.
    let (ready, body) = {
        let a = send(&agent_addr, "GET", "/v1/ready?wait=90s", &native, &B::None)
            .await
            .expect("/v1/ready");
        (a.status, String::from_utf8_lossy(&a.body).into_owned())
    };
    assert_eq!(ready, 200, "desktop not ready: {body}");
    let post = |path: &'static str, json: &'static [u8]| {
        let addr = agent_addr.clone();
        let mut h = native.to_vec();
        h.push(("Content-Type".into(), JSON.into()));
        async move { send(&addr, "POST", path, &h, &B::Raw(json)).await.unwrap() }
    };
    let cmd = post(
        "/v1/exec",
        br#"{"argv": ["sleep", "600"], "background": true, "stdin_open": true}"#,
    )
    .await;
    assert_eq!(cmd.status, 202, "{}", String::from_utf8_lossy(&cmd.body));
    let cmd: Value = serde_json::from_slice(&cmd.body).unwrap();
    let cmd = cmd["id"].as_str().unwrap().to_string();
    let pty = post("/v1/pty", br#"{"cmd": ["sleep", "600"]}"#).await;
    assert!(pty.status < 300, "{}", String::from_utf8_lossy(&pty.body));
    let pty: Value = serde_json::from_slice(&pty.body).unwrap();
    let pty = pty["id"].as_str().unwrap().to_string();
    let sandbox = ctl
        .client()
        .create(&berth_protocol::controller::CreateSandbox {
            profile: "ide".into(),
            image_ref: None,
            labels: Default::default(),
            ttl_seconds: None,
            screen: None,
            egress: None,
            credentials: Vec::new(),
            human_control: None,
            logins: Vec::new(),
            limits: None,
        })
        .await
        .expect("an ide sandbox");
    wait_for("the sandbox to run", Duration::from_secs(60), || async {
        (ctl.client().get(&sandbox.id).await.ok()?.status == "running").then_some(())
    })
    .await;
    println!("setup took {:?}", started.elapsed());

    let rows = table();
    let mut by_class = [0usize; 6];
    let mut failures = Vec::new();
    let run_started = Instant::now();
    for r in &rows {
        let path = r
            .path
            .replace("{id}", &sandbox.id)
            .replace("{cmd}", &cmd)
            .replace("{pty}", &pty);
        let (addr, mut headers) = match r.to {
            To::Compat => (&agent_addr, Vec::new()),
            To::Native => (&agent_addr, native.to_vec()),
            To::Ctl => (&ctl_addr, keyed.to_vec()),
        };
        if !r.content_type.is_empty() {
            headers.push(("Content-Type".into(), r.content_type.into()));
        }
        let t = Instant::now();
        let verdict = match send(addr, r.method, &path, &headers, &r.body).await {
            Err(e) => Err(e),
            Ok(a) => {
                by_class[(a.status / 100).min(5) as usize] += 1;
                let status_ok = match r.want {
                    Want::Is(s) => a.status == s,
                    Want::Client => (400..500).contains(&a.status),
                };
                if !status_ok {
                    Err(format!(
                        "answered {} ({}) {:.300}",
                        a.status,
                        a.content_type,
                        String::from_utf8_lossy(&a.body)
                    ))
                } else if a.status >= 400 {
                    error_body_ok(r.to, r.path, &a)
                } else {
                    Ok(())
                }
            }
        };
        // Both processes still answer.
        let verdict = verdict
            .and(alive(&agent_addr, "/platform", Some(b"Linux")).await)
            .and(alive(&agent_addr, "/healthz", None).await)
            .and(alive(&ctl_addr, "/healthz", None).await);
        if let Err(e) = verdict {
            failures.push(format!(
                "{} [{:?} {} {}] want {:?}: {e} ({:?})",
                r.name,
                r.to,
                r.method,
                r.path,
                r.want,
                t.elapsed()
            ));
        }
    }
    println!(
        "{} cases sent in {:?}: 1xx {}, 2xx {}, 3xx {}, 4xx {}, 5xx {}, no answer {}",
        rows.len(),
        run_started.elapsed(),
        by_class[1],
        by_class[2],
        by_class[3],
        by_class[4],
        by_class[5],
        rows.len() - by_class.iter().sum::<usize>()
    );
    assert!(
        failures.is_empty(),
        "{} of {} rows failed:\n{}",
        failures.len(),
        rows.len(),
        failures.join("\n")
    );
    // The agent and controller logs name no panic.
    assert!(!ctl.log_text().contains("panicked"), "{}", ctl.log_text());
    drop(agent);
}
