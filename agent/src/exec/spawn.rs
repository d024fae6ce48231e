//! Building the `fork`+`exec` of one child: its own session or process group, the sandbox
//! identity, the prepared environment.

use std::os::unix::process::CommandExt;

use std::path::Path;

use crate::text;

/// Where the child goes in the process hierarchy. Either way it leads its own process group,
/// so a timeout or a signal reaches the whole group and a terminal's Ctrl-C never does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// A new session when the identity switch forks anyway (foreground commands).
    NewSession,
    /// A new process group inside the caller's session (the shim's child).
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

/// The `fork`+`exec` of one child. The program is looked up in the child's PATH here (as
/// `execvp` would), so a missing program fails before anything is forked and its error names
/// the program as given. Without an identity switch no closure runs in the child, which lets
/// std use `posix_spawn` instead of copying the agent with `fork`.
pub fn command(l: &Launch<'_>) -> Result<std::process::Command, SpawnFailure> {
    let program = resolve(&l.program[0], l.env)?;
    let mut cmd = std::process::Command::new(program);
    cmd.arg0(&l.program[0])
        .args(&l.program[1..])
        .current_dir(l.cwd)
        .env_clear()
        .envs(l.env.iter().map(|(k, v)| (k, v)));
    match l.identity.clone() {
        None => {
            // A process group of its own is what a timeout kill and a terminal's Ctrl-C need;
            // a new session would force the slow path.
            cmd.process_group(0);
        }
        Some((uid, gid, groups)) => {
            let group = l.group;
            // SAFETY: the closure only makes async-signal-safe syscalls on values computed
            // before fork.
            unsafe {
                cmd.pre_exec(move || {
                    let rc = match group {
                        Group::NewSession => libc::setsid(),
                        Group::NewGroup => libc::setpgid(0, 0),
                    };
                    if rc < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    crate::account::switch_identity(uid, gid, &groups)
                });
            }
        }
    }
    Ok(cmd)
}

/// `execvp`'s lookup: a name with a slash is used as is, anything else is searched in the
/// child's PATH.
fn resolve(name: &str, env: &[(String, String)]) -> Result<std::path::PathBuf, SpawnFailure> {
    if name.contains('/') {
        return Ok(std::path::PathBuf::from(name));
    }
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or(crate::account::DEFAULT_PATH);
    let mut denied = false;
    for dir in path.split(':') {
        let dir = if dir.is_empty() { "." } else { dir };
        let candidate = Path::new(dir).join(name);
        match std::fs::metadata(&candidate) {
            Ok(m) if m.is_file() => {
                use std::os::unix::fs::PermissionsExt;
                if m.permissions().mode() & 0o111 != 0 {
                    return Ok(candidate);
                }
                denied = true;
            }
            _ => {}
        }
    }
    Err(SpawnFailure {
        errno: if denied { libc::EACCES } else { libc::ENOENT },
        subject: name.to_string(),
    })
}
