//! The seccomp profile of a Docker sandbox. Docker's default profile refuses `unshare` and
//! `clone` with namespace flags to a container without CAP_SYS_ADMIN, so Chromium could run
//! only without its own sandbox (`--no-sandbox`, which also puts a warning bar over every
//! page). This profile allows every system call but the ones Docker's default refuses that
//! nothing in a desktop needs — kernel modules, kexec, keyrings, BPF, perf, the clock,
//! swap, reboot, quotas, handles to arbitrary files, and mounting (so a new user namespace
//! still cannot mount anything) — and it allows creating user, PID and network namespaces,
//! which is how Chromium sandboxes its renderers.

/// System calls refused with EPERM.
const REFUSED: &[&str] = &[
    "acct",
    "add_key",
    "bpf",
    "clock_adjtime",
    "clock_adjtime64",
    "clock_settime",
    "clock_settime64",
    "create_module",
    "delete_module",
    "finit_module",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "get_kernel_syms",
    "init_module",
    "ioperm",
    "iopl",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "mount",
    "mount_setattr",
    "move_mount",
    "name_to_handle_at",
    "nfsservctl",
    "open_by_handle_at",
    "open_tree",
    "perf_event_open",
    "pivot_root",
    "query_module",
    "quotactl",
    "quotactl_fd",
    "reboot",
    "request_key",
    "settimeofday",
    "stime",
    "swapoff",
    "swapon",
    "_sysctl",
    "sysfs",
    "umount",
    "umount2",
    "uselib",
    "userfaultfd",
    "ustat",
    "vm86",
    "vm86old",
];

/// The profile as Docker's `--security-opt seccomp=<json>` takes it.
pub fn profile() -> String {
    serde_json::json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "defaultErrnoRet": 1,
        "archMap": [
            {"architecture": "SCMP_ARCH_X86_64", "subArchitectures": ["SCMP_ARCH_X86", "SCMP_ARCH_X32"]},
            {"architecture": "SCMP_ARCH_AARCH64", "subArchitectures": ["SCMP_ARCH_ARM"]}
        ],
        "syscalls": [
            {"names": REFUSED, "action": "SCMP_ACT_ERRNO", "errnoRet": 1}
        ]
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_profile_refuses_kernel_level_calls_and_leaves_namespaces_to_chromium() {
        let p: serde_json::Value = serde_json::from_str(&super::profile()).unwrap();
        assert_eq!(p["defaultAction"], "SCMP_ACT_ALLOW");
        let refused: Vec<&str> = p["syscalls"][0]["names"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        for s in ["kexec_load", "init_module", "mount", "bpf", "keyctl"] {
            assert!(refused.contains(&s), "{s}");
        }
        for s in ["unshare", "clone", "clone3", "setns", "chroot"] {
            assert!(!refused.contains(&s), "{s}");
        }
    }
}
