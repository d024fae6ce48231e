//! Starting desktop processes. Every one is forked by one long-lived thread so that its
//! parent-death signal (SIGKILL when the agent dies, however it dies) is tied to a thread that
//! lives as long as the agent: the kernel sends it when the *forking thread* exits, and tokio's
//! blocking threads come and go.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use tokio::sync::{mpsc, oneshot};

/// What to run and as whom.
pub struct Launch {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: std::path::PathBuf,
    /// uid, gid, supplementary groups to switch to.
    pub identity: Option<(u32, u32, Vec<u32>)>,
    /// Appended to (stdout and stderr).
    pub log: std::path::PathBuf,
    /// A pipe end the child keeps open as this descriptor number (Xvnc's `-displayfd`).
    pub pass_fd: Option<(std::os::fd::OwnedFd, i32)>,
}

struct Request {
    launch: Launch,
    reply: oneshot::Sender<std::io::Result<u32>>,
}

#[derive(Clone)]
pub struct Spawner {
    tx: mpsc::Sender<Request>,
}

/// Logs past this size are moved to `<name>.log.1` when the component starts again.
const LOG_ROTATE_BYTES: u64 = 8 << 20;

impl Spawner {
    pub fn start() -> std::io::Result<Spawner> {
        let (tx, mut rx) = mpsc::channel::<Request>(16);
        std::thread::Builder::new()
            .name("berth-desktop-spawn".into())
            .spawn(move || {
                while let Some(req) = rx.blocking_recv() {
                    let _ = req.reply.send(spawn(req.launch));
                }
                // The agent is going away: park so the children's parent-death signal is
                // only sent when the process itself ends.
                loop {
                    std::thread::park();
                }
            })?;
        Ok(Spawner { tx })
    }

    /// Starts the process (its own session and process group) and returns its pid.
    pub async fn spawn(&self, launch: Launch) -> std::io::Result<u32> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request { launch, reply })
            .await
            .map_err(|_| std::io::Error::other("the desktop spawner has stopped"))?;
        rx.await
            .map_err(|_| std::io::Error::other("the desktop spawner has stopped"))?
    }
}

fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    if std::fs::metadata(path).is_ok_and(|m| m.len() > LOG_ROTATE_BYTES) {
        let _ = std::fs::rename(path, path.with_extension("log.1"));
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

fn spawn(launch: Launch) -> std::io::Result<u32> {
    let Some((program, args)) = launch.argv.split_first() else {
        return Err(std::io::Error::other("empty command"));
    };
    let log = open_log(&launch.log)?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&launch.cwd)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let parent = std::process::id() as libc::pid_t;
    let identity = launch.identity.clone();
    let pass = launch
        .pass_fd
        .as_ref()
        .map(|(fd, target)| (std::os::fd::AsRawFd::as_raw_fd(fd), *target));
    // SAFETY: the closure makes only async-signal-safe calls on values computed before fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some((from, to)) = pass {
                if from != to && libc::dup2(from, to) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Keep it across exec (dup2 clears close-on-exec only on the copy).
                let flags = libc::fcntl(to, libc::F_GETFD);
                libc::fcntl(to, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
            }
            if let Some((uid, gid, groups)) = &identity {
                crate::account::switch_identity(*uid, *gid, groups)?;
            }
            // After the identity switch: changing credentials clears the setting.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                // The agent died between fork and here: nothing would kill this child.
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    // The agent's reaper collects the exit status; dropping `Child` neither waits nor kills.
    Ok(child.id())
}
