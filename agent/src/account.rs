//! The sandbox account commands run as, and the environment every child starts with.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Uid, User, getgrouplist};

/// A Unix account children run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, resolved up front: the child side of fork may not read
    /// `/etc/group`.
    pub groups: Vec<u32>,
    pub home: PathBuf,
    pub shell: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    #[error("no account named '{0}'")]
    Unknown(String),
    #[error("cannot run as '{name}': the agent runs as uid {agent_uid}, not root")]
    NotPermitted { name: String, agent_uid: u32 },
    #[error("account lookup failed: {0}")]
    Lookup(String),
}

impl Account {
    pub fn by_name(name: &str) -> Result<Account, AccountError> {
        let user = User::from_name(name)
            .map_err(|e| AccountError::Lookup(e.to_string()))?
            .ok_or_else(|| AccountError::Unknown(name.to_string()))?;
        Ok(Self::from_user(user))
    }

    /// The account an exec names, as `docker exec -u` takes it: `NAME`, `UID` (an account
    /// with that id, else that bare id with group 0 and `/` as home, as Docker runs one),
    /// either followed by `:GID`.
    pub fn for_exec(spec: &str) -> Result<Account, AccountError> {
        let (who, gid) = parse_user_spec(spec).ok_or_else(|| AccountError::Unknown(spec.into()))?;
        let mut account = match (Self::by_name(who), who.parse::<u32>()) {
            (Ok(a), _) => a,
            (Err(AccountError::Unknown(_)), Ok(uid)) => {
                match User::from_uid(Uid::from_raw(uid))
                    .map_err(|e| AccountError::Lookup(e.to_string()))?
                {
                    Some(u) => Self::from_user(u),
                    None => Account {
                        name: uid.to_string(),
                        uid,
                        gid: 0,
                        groups: vec![0],
                        home: PathBuf::from("/"),
                        shell: PathBuf::from("/bin/sh"),
                    },
                }
            }
            (Err(e), _) => return Err(e),
        };
        if let Some(g) = gid {
            account.gid = g;
            account.groups = vec![g];
        }
        Ok(account)
    }

    pub fn current() -> Result<Account, AccountError> {
        let uid = Uid::effective();
        match User::from_uid(uid).map_err(|e| AccountError::Lookup(e.to_string()))? {
            Some(u) => Ok(Self::from_user(u)),
            None => Ok(Account {
                name: uid.to_string(),
                uid: uid.as_raw(),
                gid: Gid::effective().as_raw(),
                groups: Vec::new(),
                home: std::env::var_os("HOME")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| PathBuf::from("/")),
                shell: PathBuf::from("/bin/sh"),
            }),
        }
    }

    fn from_user(u: User) -> Account {
        let groups = CString::new(u.name.clone())
            .ok()
            .and_then(|n| getgrouplist(&n, u.gid).ok())
            .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
            .unwrap_or_else(|| vec![u.gid.as_raw()]);
        Account {
            name: u.name,
            uid: u.uid.as_raw(),
            gid: u.gid.as_raw(),
            groups,
            home: u.dir,
            shell: u.shell,
        }
    }

    /// The default sandbox account: `user` when that account exists, else the agent's own.
    pub fn default_sandbox() -> Result<Account, AccountError> {
        match Self::by_name("user") {
            Ok(a) => Ok(a),
            Err(AccountError::Unknown(_)) => Self::current(),
            Err(e) => Err(e),
        }
    }

    /// Whether starting a child as this account needs a uid/gid switch.
    pub fn needs_switch(&self) -> bool {
        self.uid != Uid::effective().as_raw()
    }

    /// Fails when the agent could not switch to this account.
    pub fn check_switchable(&self) -> Result<(), AccountError> {
        if self.needs_switch() && !Uid::effective().is_root() {
            return Err(AccountError::NotPermitted {
                name: self.name.clone(),
                agent_uid: Uid::effective().as_raw(),
            });
        }
        Ok(())
    }

    /// A login shell for terminals: the account's shell when it is a real one.
    pub fn login_shell(&self) -> PathBuf {
        let s = &self.shell;
        let usable =
            s.is_absolute() && s.exists() && !s.ends_with("nologin") && !s.ends_with("false");
        if usable {
            s.clone()
        } else if Path::new("/bin/bash").exists() {
            PathBuf::from("/bin/bash")
        } else {
            PathBuf::from("/bin/sh")
        }
    }
}

/// Switches the calling process to `uid`/`gid`/`groups`. Only async-signal-safe calls: this
/// runs between fork and exec.
///
/// # Safety
/// Must be called in a freshly forked child (or a process about to exec).
pub unsafe fn switch_identity(uid: u32, gid: u32, groups: &[u32]) -> std::io::Result<()> {
    // SAFETY: plain syscalls on values computed before fork.
    unsafe {
        if libc::setgroups(groups.len(), groups.as_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::setgid(gid) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::setuid(uid) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Gives the calling thread alone `uid`/`gid`/`groups` (raw system calls: the C library's
/// wrappers would change every thread of the process). Once its uids are all the user's the
/// thread holds no capability, and it cannot take root's identity back: call it only on a
/// thread that ends after the work it does as the user ([`crate::fs::Files::as_user`]).
pub fn become_on_this_thread(uid: u32, gid: u32, groups: &[u32]) -> std::io::Result<()> {
    let check = |r: libc::c_long| match r {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    };
    // SAFETY: plain system calls on this thread's credentials with valid arguments.
    unsafe {
        check(libc::syscall(
            libc::SYS_setgroups,
            groups.len(),
            groups.as_ptr(),
        ))?;
        check(libc::syscall(libc::SYS_setresgid, gid, gid, gid))?;
        check(libc::syscall(libc::SYS_setresuid, uid, uid, uid))?;
    }
    Ok(())
}

/// The environment every child starts from (ARCHITECTURE: HOME, USER, LOGNAME, DISPLAY,
/// XAUTHORITY, DBUS_SESSION_BUS_ADDRESS, XDG_RUNTIME_DIR, LANG, PATH). Nothing of the agent's own
/// environment leaks through except PATH, and never a `BERTH_AGENT_*` variable.
#[derive(Debug, Clone)]
pub struct ChildEnv {
    vars: BTreeMap<String, String>,
}

pub struct EnvInputs<'a> {
    pub account: &'a Account,
    pub home: &'a Path,
    pub display: Option<&'a str>,
    pub xauthority: &'a Path,
    pub runtime_dir: &'a Path,
    /// Directory holding helper commands (the `python` shim) appended to PATH when needed.
    pub helper_bin: Option<&'a Path>,
    /// The desktop's session bus socket (else `<runtime_dir>/bus` when it exists).
    pub session_bus: Option<&'a Path>,
    /// The desktop's commands (`google-chrome`), appended to PATH.
    pub desktop_bin: Option<&'a Path>,
    /// The locale (`LANG`): the desktop session's.
    pub lang: &'a str,
}

/// The proxy variables passed from the agent's environment to every program it starts.
pub const PROXY_VARS: [&str; 6] = [
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
];

pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl ChildEnv {
    pub fn new(inputs: EnvInputs<'_>) -> ChildEnv {
        let mut vars = BTreeMap::new();
        let home = inputs.home.to_string_lossy().into_owned();
        vars.insert("HOME".into(), home);
        vars.insert("USER".into(), inputs.account.name.clone());
        vars.insert("LOGNAME".into(), inputs.account.name.clone());
        vars.insert(
            "SHELL".into(),
            inputs.account.login_shell().to_string_lossy().into_owned(),
        );
        vars.insert("LANG".into(), inputs.lang.into());
        let runtime = inputs.runtime_dir.to_string_lossy().into_owned();
        let bus = inputs
            .session_bus
            .map(Path::to_path_buf)
            .unwrap_or_else(|| inputs.runtime_dir.join("bus"));
        if inputs.session_bus.is_some() || bus.exists() {
            vars.insert(
                "DBUS_SESSION_BUS_ADDRESS".into(),
                format!("unix:path={}", bus.display()),
            );
        }
        vars.insert("XDG_RUNTIME_DIR".into(), runtime);
        if let Some(d) = inputs.display {
            vars.insert("DISPLAY".into(), d.to_string());
        }
        vars.insert(
            "XAUTHORITY".into(),
            inputs.xauthority.to_string_lossy().into_owned(),
        );
        let mut path = std::env::var("PATH").unwrap_or_else(|_| DEFAULT_PATH.to_string());
        if let Some(bin) = inputs.helper_bin
            && find_in_path(&path, "python").is_none()
        {
            path = format!("{path}:{}", bin.display());
        }
        if let Some(bin) = inputs.desktop_bin {
            path = format!("{path}:{}", bin.display());
        }
        vars.insert("PATH".into(), path);
        // A sandbox behind an egress proxy is given it in the agent's environment: every
        // program the agent starts finds it there (curl, git, pip, apt, the browser).
        // Behind the proxy it also trusts the proxy's CA: the variables naming the bundle.
        let trust = berth_protocol::egress::trust::BUNDLE_VARS
            .into_iter()
            .chain([berth_protocol::egress::trust::NODE_VAR]);
        for name in PROXY_VARS.into_iter().chain(trust) {
            if let Ok(v) = std::env::var(name) {
                vars.insert(name.into(), v);
            }
        }
        ChildEnv { vars }
    }

    /// The full environment for one child: the base, then the request's overrides.
    pub fn with(&self, overrides: Option<&BTreeMap<String, String>>) -> Vec<(String, String)> {
        let mut vars = self.vars.clone();
        if let Some(o) = overrides {
            for (k, v) in o {
                vars.insert(k.clone(), v.clone());
            }
        }
        vars.into_iter().collect()
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.vars.get(key).map(String::as_str)
    }

    /// A copy with HOME/USER/LOGNAME/SHELL of another account (a per-request `user`).
    pub fn for_account(&self, account: &Account) -> ChildEnv {
        let mut vars = self.vars.clone();
        vars.insert("HOME".into(), account.home.to_string_lossy().into_owned());
        vars.insert("USER".into(), account.name.clone());
        vars.insert("LOGNAME".into(), account.name.clone());
        vars.insert(
            "SHELL".into(),
            account.login_shell().to_string_lossy().into_owned(),
        );
        ChildEnv { vars }
    }
}

/// Looks `name` up in a PATH string the way `execvp` would.
pub fn find_in_path(path: &str, name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    path.split(':').filter(|d| !d.is_empty()).find_map(|dir| {
        let p = Path::new(dir).join(name);
        let meta = std::fs::metadata(&p).ok()?;
        (meta.is_file() && meta.permissions().mode() & 0o111 != 0).then_some(p)
    })
}

/// `NAME`, `UID`, `NAME:GID` or `UID:GID` (pure): the account part and the group id.
pub fn parse_user_spec(spec: &str) -> Option<(&str, Option<u32>)> {
    let (who, gid) = match spec.split_once(':') {
        Some((w, g)) => (w, Some(g.parse::<u32>().ok()?)),
        None => (spec, None),
    };
    (!who.is_empty() && !who.contains(['\0', '/'])).then_some((who, gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_execs_user_is_a_name_or_an_id_with_an_optional_group() {
        assert_eq!(parse_user_spec("app"), Some(("app", None)));
        assert_eq!(parse_user_spec("1000:1000"), Some(("1000", Some(1000))));
        assert_eq!(parse_user_spec("root:0"), Some(("root", Some(0))));
        assert_eq!(parse_user_spec("app:staff"), None);
        assert_eq!(parse_user_spec(""), None);
        assert_eq!(parse_user_spec(":0"), None);
        // root by name and by id; an id without an account runs as that bare id, group 0.
        assert_eq!(Account::for_exec("0").unwrap().name, "root");
        let bare = Account::for_exec("54321").unwrap();
        assert_eq!(
            (bare.uid, bare.gid, bare.home.as_path()),
            (54321, 0, Path::new("/"))
        );
        assert_eq!(Account::for_exec("54321:7").unwrap().gid, 7);
        assert!(matches!(
            Account::for_exec("no-such-account-here"),
            Err(AccountError::Unknown(_))
        ));
    }

    #[test]
    fn child_env_has_the_documented_variables_and_no_agent_ones() {
        // SAFETY: test-only; this test does not run concurrently with env readers in this module.
        unsafe { std::env::set_var("BERTH_AGENT_TOKEN", "secret") };
        let account = Account::current().unwrap();
        let env = ChildEnv::new(EnvInputs {
            account: &account,
            home: Path::new("/home/x"),
            display: Some(":7"),
            xauthority: Path::new("/home/x/.Xauthority"),
            runtime_dir: Path::new("/run/user/1000"),
            helper_bin: None,
            session_bus: None,
            desktop_bin: None,
            lang: "C.UTF-8",
        });
        let vars: BTreeMap<_, _> = env.with(None).into_iter().collect();
        for key in [
            "HOME",
            "USER",
            "LOGNAME",
            "DISPLAY",
            "XAUTHORITY",
            "XDG_RUNTIME_DIR",
            "LANG",
            "PATH",
        ] {
            assert!(vars.contains_key(key), "{key} missing");
        }
        assert_eq!(vars["HOME"], "/home/x");
        assert_eq!(vars["LANG"], "C.UTF-8");
        assert!(vars.keys().all(|k| !k.starts_with("BERTH_AGENT_")));
    }

    #[test]
    fn request_env_overrides_the_base() {
        let account = Account::current().unwrap();
        let env = ChildEnv::new(EnvInputs {
            account: &account,
            home: Path::new("/h"),
            display: None,
            xauthority: Path::new("/h/.Xauthority"),
            runtime_dir: Path::new("/tmp"),
            helper_bin: None,
            session_bus: None,
            desktop_bin: None,
            lang: "C.UTF-8",
        });
        let mut o = BTreeMap::new();
        o.insert("LANG".to_string(), "fr_FR.UTF-8".to_string());
        o.insert("EXTRA".to_string(), "1".to_string());
        let vars: BTreeMap<_, _> = env.with(Some(&o)).into_iter().collect();
        assert_eq!(vars["LANG"], "fr_FR.UTF-8");
        assert_eq!(vars["EXTRA"], "1");
    }
}
