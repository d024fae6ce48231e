//! Building the `fork`+`exec` of one child: its own session or process group, the sandbox
//! identity, the prepared environment.

use std::os::unix::process::CommandExt;
use std::path::Path;

use crate::text;

/// Where the child goes in the process hierarchy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// A new session (and process group) led by the child: the agent's foreground commands,
    /// so a timeout can kill the whole group and a terminal's Ctrl-C never reaches it.
    NewSession,
    /// A new process group inside the caller's session: the shim's child.
    NewGroup,
}

pub struct Launch<'a> {
    pub program: &'a [String],
    pub cwd: &'a Path,
    pub env: &'a [(String, String)],
    /// uid, gid, supplementary groups to switch to before exec.
    pub identity: Option<(u32, u32, Vec<u32>)>,
    pub group: Group,
}

/// Why a child could not start, with the errno and the name Python would put in its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnFailure {
    pub errno: i32,
    /// The program, or the working directory when that is what is missing.
    pub subject: String,
}

impl SpawnFailure {
    pub fn from_io(e: &std::io::Error, subject: &str) -> SpawnFailure {
        SpawnFailure {
            errno: e.raw_os_error().unwrap_or(libc::EIO),
            subject: subject.to_string(),
        }
    }

    /// `[Errno 2] No such file or directory: 'x'`, as Python's subprocess reports it.
    pub fn python_message(&self) -> String {
        text::py_os_error(self.errno, &self.subject)
    }

    /// `cannot run 'x': No such file or directory`.
    pub fn message(&self) -> String {
        format!(
            "cannot run {}: {}",
            text::py_repr_str(&self.subject),
            text::errno_message(self.errno)
        )
    }
}

/// Checks what exec would otherwise report less precisely: an empty argv and a missing cwd.
pub fn precheck(program: &[String], cwd: &Path) -> Result<(), SpawnFailure> {
    if program.is_empty() {
        return Err(SpawnFailure {
            errno: libc::ENOENT,
            subject: String::new(),
        });
    }
    match std::fs::metadata(cwd) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(SpawnFailure {
            errno: libc::ENOTDIR,
            subject: cwd.to_string_lossy().into_owned(),
        }),
        Err(e) => Err(SpawnFailure::from_io(&e, &cwd.to_string_lossy())),
    }
}

pub fn command(l: &Launch<'_>) -> std::process::Command {
    let mut cmd = std::process::Command::new(&l.program[0]);
    cmd.args(&l.program[1..])
        .current_dir(l.cwd)
        .env_clear()
        .envs(l.env.iter().map(|(k, v)| (k, v)));
    let group = l.group;
    let identity = l.identity.clone();
    // SAFETY: the closure only makes async-signal-safe syscalls on values computed before fork.
    unsafe {
        cmd.pre_exec(move || {
            match group {
                Group::NewSession => {
                    if libc::setsid() < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Group::NewGroup => {
                    if libc::setpgid(0, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
            }
            if let Some((uid, gid, groups)) = &identity {
                crate::account::switch_identity(*uid, *gid, groups)?;
            }
            Ok(())
        });
    }
    cmd
}
