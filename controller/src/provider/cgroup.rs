//! A process sandbox's own control groups: the `process` provider fences each agent (and all it
//! starts) in a child of the controller's own cgroup, where the host lets it write there (root,
//! or a delegated cgroup v2 subtree). On cgroup v1 that is one directory per controller
//! (`memory`, `pids`, `cpu`), on v2 one directory. What cannot be set is reported unenforced,
//! with the reason, rather than pretended.
//!
//! Deciding what to write is pure (`plan`); `Fence::create` does it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use berth_protocol::cgroup::own_dir;
use berth_protocol::controller::Limits;

/// The directory every sandbox's cgroup sits in, under the controller's own.
const PARENT: &str = "berth";
/// CFS's period: `cpus` becomes a quota of this many microseconds per period.
const CFS_PERIOD_US: u64 = 100_000;

/// The cgroup hierarchy of this host, as seen from the controller's own cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    /// Version 1: the controller's own directory in each controller's mount.
    V1 {
        memory: Option<PathBuf>,
        pids: Option<PathBuf>,
        cpu: Option<PathBuf>,
    },
    /// Version 2 (unified): the controller's own directory.
    V2 { own: PathBuf },
}

/// One file to write, and which limit it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub limit: &'static str,
    pub file: PathBuf,
    pub value: String,
}

impl Hierarchy {
    /// This process's hierarchy: v1 when any v1 controller it uses is mounted, else v2.
    pub fn detect() -> Option<Hierarchy> {
        let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let v1 = |c: &str| own_dir(&cgroup, &mountinfo, c);
        let (memory, pids, cpu) = (v1("memory"), v1("pids"), v1("cpu"));
        if memory.is_some() || pids.is_some() || cpu.is_some() {
            return Some(Hierarchy::V1 { memory, pids, cpu });
        }
        own_dir(&cgroup, &mountinfo, "").map(|own| Hierarchy::V2 { own })
    }

    /// Where a controller's sandbox directories go (v2: the one directory).
    fn base(&self, c: Ctl) -> Option<&PathBuf> {
        match self {
            Hierarchy::V1 { memory, pids, cpu } => match c {
                Ctl::Memory => memory.as_ref(),
                Ctl::Pids => pids.as_ref(),
                Ctl::Cpu => cpu.as_ref(),
            },
            Hierarchy::V2 { own } => Some(own),
        }
    }

    /// The sandbox's directories (one per v1 controller, one on v2).
    pub fn dirs(&self, sandbox_id: &str) -> Vec<PathBuf> {
        let dir = |base: &Path| base.join(PARENT).join(sandbox_id);
        match self {
            Hierarchy::V1 { memory, pids, cpu } => [memory, pids, cpu]
                .into_iter()
                .flatten()
                .map(|b| dir(b))
                .collect(),
            Hierarchy::V2 { own } => vec![dir(own)],
        }
    }
}

/// Which v1 controller a file belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ctl {
    Memory,
    Pids,
    Cpu,
}

/// One limit's file and value, before it has a directory.
type Want = (&'static str, Ctl, &'static str, String);

/// CFS's quota for `cpus` CPUs (at least 1 ms a period, the kernel's floor).
fn quota(cpus: f64) -> u64 {
    ((cpus * CFS_PERIOD_US as f64).round() as u64).max(1000)
}

/// cgroup v1's files for `l`; `swap_file`: whether `memory.memsw.*` exists.
fn v1_wants(l: &Limits, swap_file: bool) -> Vec<Want> {
    let mut w: Vec<Want> = Vec::new();
    if let Some(m) = l.memory_mb {
        w.push((
            "memory_mb",
            Ctl::Memory,
            "memory.limit_in_bytes",
            (m << 20).to_string(),
        ));
        if let (Some(s), true) = (l.swap_mb, swap_file) {
            let total = (m + s) << 20;
            w.push((
                "swap_mb",
                Ctl::Memory,
                "memory.memsw.limit_in_bytes",
                total.to_string(),
            ));
        }
    }
    if let Some(p) = l.pids {
        w.push(("pids", Ctl::Pids, "pids.max", p.to_string()));
    }
    if let Some(s) = l.cpu_shares {
        w.push(("cpu_shares", Ctl::Cpu, "cpu.shares", s.to_string()));
    }
    if let Some(c) = l.cpus {
        w.push((
            "cpus",
            Ctl::Cpu,
            "cpu.cfs_period_us",
            CFS_PERIOD_US.to_string(),
        ));
        w.push(("cpus", Ctl::Cpu, "cpu.cfs_quota_us", quota(c).to_string()));
    }
    w
}

/// cgroup v2's files for `l` (one directory: the controller kind does not matter).
fn v2_wants(l: &Limits) -> Vec<Want> {
    let mut w: Vec<Want> = Vec::new();
    if let Some(m) = l.memory_mb {
        w.push((
            "memory_mb",
            Ctl::Memory,
            "memory.max",
            (m << 20).to_string(),
        ));
    }
    if let Some(s) = l.swap_mb {
        w.push((
            "swap_mb",
            Ctl::Memory,
            "memory.swap.max",
            (s << 20).to_string(),
        ));
    }
    if let Some(p) = l.pids {
        w.push(("pids", Ctl::Pids, "pids.max", p.to_string()));
    }
    if let Some(s) = l.cpu_shares {
        // cgroup v2's weight for v1's shares (the kernel's and runc's mapping).
        let weight = 1 + (s.clamp(2, 262_144) - 2) * 9999 / 262_142;
        w.push(("cpu_shares", Ctl::Cpu, "cpu.weight", weight.to_string()));
    }
    if let Some(c) = l.cpus {
        w.push((
            "cpus",
            Ctl::Cpu,
            "cpu.max",
            format!("{} {CFS_PERIOD_US}", quota(c)),
        ));
    }
    w
}

/// What to write for `limits` in the sandbox's cgroup: the writes, and the limits set that no
/// file here carries (with why). `swap_file`: whether v1's `memory.memsw.*` exists (swap
/// accounting on).
pub fn plan(
    h: &Hierarchy,
    sandbox_id: &str,
    l: &Limits,
    swap_file: bool,
) -> (Vec<Write>, BTreeMap<String, String>) {
    let wants = match h {
        Hierarchy::V1 { .. } => v1_wants(l, swap_file),
        Hierarchy::V2 { .. } => v2_wants(l),
    };
    let mut writes = Vec::new();
    let mut missing = BTreeMap::new();
    for (limit, ctl, file, value) in wants {
        match h.base(ctl) {
            Some(b) => writes.push(Write {
                limit,
                file: b.join(PARENT).join(sandbox_id).join(file),
                value,
            }),
            None => {
                let why = "the host mounts no cgroup controller for it";
                missing.insert(limit.to_string(), why.to_string());
            }
        }
    }
    if let (Hierarchy::V1 { .. }, Some(_), false) = (h, l.swap_mb, swap_file) {
        let why = "the kernel does not account swap (no memory.memsw)";
        missing.insert("swap_mb".to_string(), why.to_string());
    }
    if l.shm_mb.is_some() {
        let why = "process sandboxes share the host's /dev/shm";
        missing.insert("shm_mb".to_string(), why.to_string());
    }
    (writes, missing)
}

/// What this host lets the controller do: its hierarchy, and the limit files a sandbox's cgroup
/// gets there (found by making a probe cgroup once). `None` hierarchy: nothing can be fenced.
#[derive(Debug, Clone)]
pub struct Host {
    hierarchy: Option<Hierarchy>,
    /// The file names a new cgroup of ours holds (`pids.max`, …).
    present: std::collections::BTreeSet<String>,
    /// Why nothing can be fenced, when it cannot.
    why_not: String,
}

impl Host {
    /// Detects the hierarchy and probes it: a cgroup made and removed under each base.
    pub fn probe() -> Host {
        let Some(h) = Hierarchy::detect() else {
            return Host::none("this host shows the controller no cgroup hierarchy");
        };
        let probe = format!("probe-{}", std::process::id());
        let mut present = std::collections::BTreeSet::new();
        let mut errors = Vec::new();
        for dir in h.dirs(&probe) {
            let made = dir
                .parent()
                .map_or(Ok(()), |p| make_parent(&h, p))
                .and_then(|()| std::fs::create_dir(&dir).map_err(|e| e.to_string()));
            match made {
                Ok(()) => {
                    if let Ok(entries) = std::fs::read_dir(&dir) {
                        present.extend(
                            entries
                                .flatten()
                                .filter_map(|e| e.file_name().into_string().ok()),
                        );
                    }
                    let _ = std::fs::remove_dir(&dir);
                }
                Err(e) => errors.push(format!("{}: {e}", dir.display())),
            }
        }
        if present.is_empty() {
            return Host::none(&format!(
                "the controller cannot make a cgroup here ({})",
                errors.join("; ")
            ));
        }
        Host {
            hierarchy: Some(h),
            present,
            why_not: String::new(),
        }
    }

    fn none(why: &str) -> Host {
        Host {
            hierarchy: None,
            present: Default::default(),
            why_not: why.to_string(),
        }
    }

    /// The writes for `l` that this host carries, and the limits it does not, with why.
    fn split(&self, sandbox_id: &str, l: &Limits) -> (Vec<Write>, BTreeMap<String, String>) {
        let Some(h) = &self.hierarchy else {
            return (Vec::new(), crate::limits::none_enforced(l, &self.why_not));
        };
        let swap_file = self.present.contains("memory.memsw.limit_in_bytes");
        let (writes, mut missing) = plan(h, sandbox_id, l, swap_file);
        let (kept, dropped): (Vec<Write>, Vec<Write>) = writes.into_iter().partition(|w| {
            w.file
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| self.present.contains(n))
        });
        for w in dropped {
            missing.insert(
                w.limit.to_string(),
                format!(
                    "a cgroup the controller makes here has no {}",
                    w.file.file_name().unwrap_or_default().to_string_lossy()
                ),
            );
        }
        (kept, missing)
    }

    /// The limits of `l` this host cannot enforce.
    pub fn unenforced(&self, l: &Limits) -> BTreeMap<String, String> {
        self.split("-", l).1
    }

    /// Makes the sandbox's cgroup with its limits; `None` when nothing can be fenced here.
    pub fn fence(&self, sandbox_id: &str, l: &Limits) -> Result<Option<Fence>, String> {
        let Some(h) = &self.hierarchy else {
            return Ok(None);
        };
        let (writes, _) = self.split(sandbox_id, l);
        let mut dirs = Vec::new();
        for dir in h.dirs(sandbox_id) {
            if let Some(parent) = dir.parent() {
                make_parent(h, parent)?;
            }
            match std::fs::create_dir(&dir) {
                Ok(()) => dirs.push(dir),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => dirs.push(dir),
                Err(e) => return Err(format!("creating {}: {e}", dir.display())),
            }
        }
        for w in writes {
            std::fs::write(&w.file, &w.value)
                .map_err(|e| format!("writing {} to {}: {e}", w.value, w.file.display()))?;
        }
        Ok(Some(Fence { dirs }))
    }

    /// Removes a sandbox's cgroup (once every process in it has ended); idempotent.
    /// Whatever is still in it (a process that left the agent's tree, one still exiting) is
    /// killed first: a cgroup with a process in it cannot be removed. Bounded: 5 s.
    pub async fn remove(&self, sandbox_id: &str) {
        let Some(h) = &self.hierarchy else {
            return;
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let mut busy = Vec::new();
            for dir in h.dirs(sandbox_id) {
                match std::fs::remove_dir(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => busy.push((dir, e)),
                }
            }
            if busy.is_empty() {
                return;
            }
            if std::time::Instant::now() >= deadline {
                for (dir, e) in busy {
                    tracing::warn!(dir = %dir.display(), error = %e, "a sandbox's cgroup stays");
                }
                return;
            }
            for (dir, _) in &busy {
                kill_members(dir);
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}

/// SIGKILLs every process in the cgroup `dir` (its `cgroup.procs`).
fn kill_members(dir: &Path) {
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// The parent of every sandbox's cgroup; on v2, with the controllers its children use.
fn make_parent(h: &Hierarchy, parent: &Path) -> Result<(), String> {
    match std::fs::create_dir(parent) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("creating {}: {e}", parent.display())),
    }
    if let Hierarchy::V2 { .. } = h {
        let _ = std::fs::write(parent.join("cgroup.subtree_control"), "+memory +pids +cpu");
    }
    Ok(())
}

/// A sandbox's cgroup, made: its agent enters it before it runs (`procs`).
#[derive(Debug, Clone)]
pub struct Fence {
    pub dirs: Vec<PathBuf>,
}

impl Fence {
    /// The files a process writes `0` to, to enter the fence (every directory's `cgroup.procs`).
    pub fn procs(&self) -> Vec<std::ffi::CString> {
        self.dirs
            .iter()
            .filter_map(|d| {
                std::ffi::CString::new(d.join("cgroup.procs").as_os_str().as_encoded_bytes()).ok()
            })
            .collect()
    }
}

/// Moves the calling process into each cgroup of `procs`: for `pre_exec`, between fork and
/// exec, so it only opens and writes (async-signal-safe).
///
/// # Safety
/// Call only in a forked child before exec.
pub unsafe fn enter(procs: &[std::ffi::CString]) -> std::io::Result<()> {
    for p in procs {
        // SAFETY: open, write and close are async-signal-safe; `p` is NUL-terminated.
        unsafe {
            let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let n = libc::write(fd, b"0".as_ptr().cast(), 1);
            libc::close(fd);
            if n != 1 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            cpus: Some(1.5),
            cpu_shares: Some(1024),
            memory_mb: Some(100),
            swap_mb: Some(0),
            pids: Some(64),
            shm_mb: Some(512),
            unenforced: BTreeMap::new(),
        }
    }

    fn files(w: &[Write]) -> Vec<(String, String)> {
        w.iter()
            .map(|w| (w.file.display().to_string(), w.value.clone()))
            .collect()
    }

    #[test]
    fn v1_writes_each_controller_and_reports_what_it_cannot() {
        let h = Hierarchy::V1 {
            memory: Some("/m".into()),
            pids: Some("/p".into()),
            cpu: None,
        };
        let (w, missing) = plan(&h, "sb1", &limits(), false);
        assert_eq!(
            files(&w),
            [
                (
                    "/m/berth/sb1/memory.limit_in_bytes".into(),
                    (100u64 << 20).to_string()
                ),
                ("/p/berth/sb1/pids.max".into(), "64".into()),
            ]
        );
        assert_eq!(
            missing.keys().map(String::as_str).collect::<Vec<_>>(),
            ["cpu_shares", "cpus", "shm_mb", "swap_mb"]
        );
        let (w, missing) = plan(&h, "sb1", &limits(), true);
        assert!(files(&w).contains(&(
            "/m/berth/sb1/memory.memsw.limit_in_bytes".into(),
            (100u64 << 20).to_string()
        )));
        assert!(!missing.contains_key("swap_mb"));
    }

    #[test]
    fn v2_writes_one_directory_with_weight_and_quota() {
        let h = Hierarchy::V2 { own: "/u".into() };
        let (w, missing) = plan(&h, "sb1", &limits(), false);
        let f = files(&w);
        assert!(f.contains(&("/u/berth/sb1/cpu.max".into(), "150000 100000".into())));
        assert!(f.contains(&("/u/berth/sb1/cpu.weight".into(), "39".into())));
        assert!(f.contains(&("/u/berth/sb1/memory.swap.max".into(), "0".into())));
        assert_eq!(missing.keys().collect::<Vec<_>>(), ["shm_mb"]);
        assert_eq!(h.dirs("sb1"), [PathBuf::from("/u/berth/sb1")]);
    }
}
