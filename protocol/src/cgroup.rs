//! The cgroup files both sides read: where a process's own cgroup directory is, and the
//! counters in its flat-keyed files (`pids.events`, `memory.events`, `memory.oom_control`).

use std::path::PathBuf;

/// The cgroup directory of `controller` (`memory`, or `""` for v2) for this process, from
/// `/proc/self/cgroup` and `/proc/self/mountinfo`: the mount's point plus the process's path
/// below the mount's root.
pub fn own_dir(cgroup: &str, mountinfo: &str, controller: &str) -> Option<PathBuf> {
    let path = cgroup.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, list, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = match controller {
            "" => list.is_empty(),
            c => list.split(',').any(|x| x == c),
        };
        hit.then(|| path.to_string())
    })?;
    mountinfo.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let pre: Vec<&str> = pre.split(' ').collect();
        let post: Vec<&str> = post.split(' ').collect();
        let (root, point) = (pre.get(3)?, pre.get(4)?);
        let (fstype, opts) = (post.first()?, post.get(2).copied().unwrap_or(""));
        let hit = match controller {
            "" => *fstype == "cgroup2",
            c => *fstype == "cgroup" && opts.split(',').any(|o| o == c),
        };
        if !hit {
            return None;
        }
        let below = path.strip_prefix(root.trim_end_matches('/'))?;
        Some(PathBuf::from(point).join(below.trim_start_matches('/')))
    })
}

/// The value of `key` in a flat-keyed cgroup file (`max 3` in `pids.events`).
pub fn counter(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// A limit file's value: `max` (none) is `None`.
pub fn limit(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
32 31 0:29 /docker/abc /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu,cpuacct
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw";

    const CGROUP: &str = "\
8:pids:/
4:memory:/api/f7
1:cpu,cpuacct:/docker/abc/x
0::/user.slice";

    #[test]
    fn the_own_directory_is_the_mount_point_and_the_path_below_the_mount_root() {
        let at = |c| own_dir(CGROUP, MOUNTINFO, c);
        assert_eq!(at("memory"), Some("/sys/fs/cgroup/memory/api/f7".into()));
        assert_eq!(at("pids"), Some("/sys/fs/cgroup/pids".into()));
        // A container's mount: its root is its own cgroup.
        assert_eq!(at("cpu"), Some("/sys/fs/cgroup/cpu/x".into()));
        assert_eq!(at(""), Some("/sys/fs/cgroup/unified/user.slice".into()));
        assert_eq!(at("blkio"), None);
    }

    #[test]
    fn counters_are_read_by_key_and_max_is_no_limit() {
        let text = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(counter(text, "oom_kill"), Some(3));
        assert_eq!(counter(text, "oom"), None);
        assert_eq!(counter("max 12\n", "max"), Some(12));
        assert_eq!(limit("max\n"), None);
        assert_eq!(limit("2048\n"), Some(2048));
    }
}
