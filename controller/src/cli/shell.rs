//! `berth sandbox shell`: an interactive terminal in a sandbox through the controller, as
//! `docker exec -it` gives one: the local terminal in raw mode, the window size followed,
//! Ctrl-C passed to the program, and the program's exit code as the CLI's.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read, Write};
use std::os::fd::AsFd;

use anyhow::{Context, anyhow};
use berth_protocol::{PtyControl, PtyRequest, PtySize};
use clap::Args;
use futures_util::{SinkExt, StreamExt};
use nix::sys::termios::{self, SetArg, Termios};
use tokio::signal::unix::{SignalKind, signal};
use tokio_tungstenite::tungstenite::Message;

use super::Remote;
use super::through::Through;

#[derive(Args, Debug)]
pub struct ShellArgs {
    /// The sandbox's id.
    pub id: String,
    /// Working directory of the program (default: the sandbox user's home).
    #[arg(long)]
    pub cwd: Option<String>,
    /// An environment variable for the program, `KEY=VALUE`; repeatable. `TERM` is passed
    /// from the local environment unless given here.
    #[arg(long = "env", short = 'e', value_parser = super::parse_label)]
    pub env: Vec<(String, String)>,
    /// The program and its arguments (after `--`); default: the sandbox user's login shell.
    #[arg(last = true)]
    pub command: Vec<String>,
    #[command(flatten)]
    pub remote: Remote,
}

/// The local terminal's settings, put back when dropped (every return, error and unwind).
struct RawMode {
    saved: Termios,
}

impl RawMode {
    fn enter() -> anyhow::Result<RawMode> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(stdin.as_fd()).context("reading the terminal's settings")?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(stdin.as_fd(), SetArg::TCSADRAIN, &raw)
            .context("putting the terminal in raw mode")?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSADRAIN, &self.saved);
    }
}

/// The size of the local terminal (stdout's, else stdin's), if either is one.
fn window_size() -> Option<PtySize> {
    for fd in [libc::STDOUT_FILENO, libc::STDIN_FILENO, libc::STDERR_FILENO] {
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        // SAFETY: TIOCGWINSZ writes one winsize into the struct given.
        let r = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) };
        if r == 0 && ws.ws_col > 0 && ws.ws_row > 0 {
            return Some(PtySize {
                cols: ws.ws_col,
                rows: ws.ws_row,
            });
        }
    }
    None
}

/// Reads stdin on a thread of its own (a blocked read must not hold up the exit); `None` at
/// end of input.
fn stdin_reader() -> tokio::sync::mpsc::Receiver<Option<Vec<u8>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buf = vec![0u8; 16 << 10];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) => {
                    let _ = tx.blocking_send(None);
                    return;
                }
                Ok(n) => {
                    if tx.blocking_send(Some(buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    let _ = tx.blocking_send(None);
                    return;
                }
            }
        }
    });
    rx
}

fn resize_message(size: PtySize) -> Message {
    let text = serde_json::to_string(&PtyControl::Resize { resize: size }).unwrap_or_default();
    Message::text(text)
}

pub async fn run(a: ShellArgs) -> anyhow::Result<i32> {
    let through = Through::new(&a.remote, &a.id);
    let interactive = std::io::stdin().is_terminal();
    let size = window_size();
    let mut env: BTreeMap<String, String> = a.env.into_iter().collect();
    if !env.contains_key("TERM")
        && let Ok(term) = std::env::var("TERM")
        && !term.is_empty()
    {
        env.insert("TERM".into(), term);
    }
    let req = PtyRequest {
        cmd: (!a.command.is_empty()).then_some(a.command),
        cols: size.map(|s| s.cols),
        rows: size.map(|s| s.rows),
        cwd: a.cwd,
        env: (!env.is_empty()).then_some(env),
    };
    let pty = through
        .agent()
        .pty_create(&req)
        .await
        .context("opening a terminal in the sandbox")?;
    let ws = match through.agent().pty_attach(&pty.id).await {
        Ok(ws) => ws,
        Err(e) => {
            kill(&through, &pty.id).await;
            return Err(
                super::through::client_error(e).context("attaching to the sandbox's terminal")
            );
        }
    };
    let raw = match interactive {
        true => Some(RawMode::enter()?),
        false => None,
    };
    let outcome = relay(ws, interactive).await;
    drop(raw);
    if outcome.is_err() && interactive {
        // The error goes on a line of its own, not after the sandbox's prompt.
        eprintln!();
    }
    match outcome {
        Ok(Ended::Exited(code)) => Ok(code),
        Ok(Ended::Signalled(sig)) => {
            kill(&through, &pty.id).await;
            Ok(128 + sig)
        }
        Ok(Ended::Closed) => {
            // The stream closed without the exit message: ask the agent how it ended.
            let info = through.agent().pty(&pty.id).await?;
            info.exit_code.ok_or_else(|| {
                anyhow!(
                    "the connection to terminal {} closed while it was still running",
                    pty.id
                )
            })
        }
        Err(e) => Err(e),
    }
}

enum Ended {
    Exited(i32),
    /// The CLI was asked to stop (SIGTERM, SIGHUP): the signal's number.
    Signalled(i32),
    Closed,
}

async fn kill(through: &Through, pty: &str) {
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        through.agent().pty_kill(pty),
    )
    .await;
}

async fn relay(ws: berth_protocol::client::WebSocket, interactive: bool) -> anyhow::Result<Ended> {
    let (mut tx, mut rx) = ws.split();
    let mut input = stdin_reader();
    let mut input_open = true;
    let mut winch = signal(SignalKind::window_change())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    let mut exit_code = None;
    let mut stdout = std::io::stdout();
    loop {
        tokio::select! {
            m = rx.next() => match m {
                None | Some(Ok(Message::Close(_))) => break,
                Some(Err(e)) => {
                    if exit_code.is_some() {
                        break;
                    }
                    return Err(anyhow!("the connection to the sandbox's terminal was lost: {e}"));
                }
                Some(Ok(Message::Binary(b))) => {
                    stdout.write_all(&b)?;
                    stdout.flush()?;
                }
                Some(Ok(Message::Text(t))) => {
                    match serde_json::from_str::<PtyControl>(&t) {
                        Ok(PtyControl::Exit { exit_code: c }) => exit_code = Some(c),
                        Ok(_) => {}
                        Err(_) => {
                            stdout.write_all(t.as_bytes())?;
                            stdout.flush()?;
                        }
                    }
                }
                Some(Ok(_)) => {}
            },
            data = input.recv(), if input_open => match data {
                Some(Some(bytes)) => {
                    if tx.send(Message::binary(bytes)).await.is_err() {
                        break;
                    }
                }
                _ => {
                    input_open = false;
                    // End of piped input: the terminal's end-of-file character, as typing
                    // Ctrl-D would give it. A terminal's own Ctrl-D arrives as a byte.
                    if !interactive && tx.send(Message::binary(vec![4u8])).await.is_err() {
                        break;
                    }
                }
            },
            _ = winch.recv() => {
                if let Some(size) = window_size()
                    && tx.send(resize_message(size)).await.is_err()
                {
                    break;
                }
            }
            // In raw mode Ctrl-C arrives as a byte; a SIGINT (input not a terminal, or sent
            // with kill) is passed on as the same byte, which the sandbox's terminal turns
            // into SIGINT for its foreground program.
            _ = int.recv() => {
                if tx.send(Message::binary(vec![3u8])).await.is_err() {
                    break;
                }
            }
            _ = term.recv() => return Ok(Ended::Signalled(libc::SIGTERM)),
            _ = hup.recv() => return Ok(Ended::Signalled(libc::SIGHUP)),
        }
    }
    Ok(match exit_code {
        Some(c) => Ended::Exited(c),
        None => Ended::Closed,
    })
}
