//! A sandbox's resource limits: its profile's (`images/catalog.toml`), then the config's
//! `[limits."*"]` for every profile, then `[limits.<profile or alias>]`, then the ones the
//! create (or the pool of its members) asks. Resolved once, at
//! create, and kept on its record: a config changed later does not rewrite what a running
//! sandbox was given.

use std::collections::BTreeMap;

use berth_protocol::controller::Limits;

use crate::catalog::Profile;
use crate::config::{EVERY_PROFILE, LimitsConfig};

/// The limits a sandbox of `profile` is created with, `asked` last. Swap is off wherever
/// memory is limited.
pub fn resolve(
    profile: &Profile,
    config: &BTreeMap<String, LimitsConfig>,
    asked: Option<&LimitsConfig>,
) -> Limits {
    let base = LimitsConfig {
        cpus: profile.cpus,
        cpu_shares: profile.cpu_shares,
        memory_mb: profile.memory_mb,
        pids: profile.pids,
        shm_mb: profile.shm_mb,
    };
    let own = std::iter::once(&profile.name)
        .chain(&profile.aliases)
        .find_map(|n| config.get(n));
    let l = [config.get(EVERY_PROFILE), own, asked]
        .into_iter()
        .flatten()
        .fold(base, |acc, over| acc.over(over));
    Limits {
        cpus: l.cpus,
        cpu_shares: l.cpu_shares,
        memory_mb: l.memory_mb,
        swap_mb: l.memory_mb.map(|_| 0),
        pids: l.pids,
        shm_mb: l.shm_mb,
        unenforced: BTreeMap::new(),
    }
}

/// The limits `asked` resolves to when they are not the profile's own (pure): what sets a
/// create apart from the warm pools of its profile.
pub fn asked_beyond(
    profile: &Profile,
    config: &BTreeMap<String, LimitsConfig>,
    asked: Option<&LimitsConfig>,
) -> Option<Limits> {
    let asked = resolve(profile, config, Some(asked?));
    (asked != resolve(profile, config, None)).then_some(asked)
}

/// Every limit set, marked as not enforced for `why` (a provider that enforces none).
pub fn none_enforced(limits: &Limits, why: &str) -> BTreeMap<String, String> {
    limits
        .names()
        .into_iter()
        .map(|n| (n.to_string(), why.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Catalog;

    fn desktop() -> Profile {
        Catalog::builtin().profile("desktop").unwrap().clone()
    }

    #[test]
    fn the_profile_gives_the_limits_and_swap_is_off_with_memory() {
        let l = resolve(&desktop(), &BTreeMap::new(), None);
        let p = desktop();
        assert_eq!(l.cpus, p.cpus);
        assert_eq!(l.memory_mb, p.memory_mb);
        assert_eq!(l.pids, p.pids);
        assert!(l.pids.is_some() && l.shm_mb.is_some() && l.cpu_shares.is_some());
        assert_eq!(l.swap_mb, Some(0));
        assert!(l.unenforced.is_empty());
    }

    #[test]
    fn the_config_overrides_every_profile_then_the_profile_by_name_or_alias() {
        let every = LimitsConfig {
            pids: Some(100),
            memory_mb: Some(1000),
            ..Default::default()
        };
        let own = LimitsConfig {
            pids: Some(50),
            ..Default::default()
        };
        let config = BTreeMap::from([("*".to_string(), every), ("desktop".to_string(), own)]);
        let l = resolve(&desktop(), &config, None);
        assert_eq!(
            (l.pids, l.memory_mb, l.swap_mb),
            (Some(50), Some(1000), Some(0))
        );
        assert_eq!(l.cpus, desktop().cpus, "unset in the config: the profile's");
        let ide = Catalog::builtin().profile("ide").unwrap().clone();
        assert_eq!(resolve(&ide, &config, None).pids, Some(100));
    }

    #[test]
    fn the_creates_limits_come_last() {
        let own = LimitsConfig {
            pids: Some(50),
            memory_mb: Some(1000),
            ..Default::default()
        };
        let config = BTreeMap::from([("desktop".to_string(), own)]);
        let asked = LimitsConfig {
            cpus: Some(0.5),
            memory_mb: Some(512),
            ..Default::default()
        };
        let l = resolve(&desktop(), &config, Some(&asked));
        assert_eq!(
            (l.cpus, l.memory_mb, l.pids, l.swap_mb),
            (Some(0.5), Some(512), Some(50), Some(0))
        );
    }

    #[test]
    fn only_limits_other_than_the_profiles_set_a_create_apart() {
        let own = desktop();
        let same = LimitsConfig {
            cpus: own.cpus,
            ..Default::default()
        };
        assert_eq!(asked_beyond(&own, &BTreeMap::new(), None), None);
        assert_eq!(asked_beyond(&own, &BTreeMap::new(), Some(&same)), None);
        let half = LimitsConfig {
            cpus: Some(0.5),
            ..Default::default()
        };
        let l = asked_beyond(&own, &BTreeMap::new(), Some(&half)).unwrap();
        assert_eq!((l.cpus, l.memory_mb), (Some(0.5), own.memory_mb));
    }

    #[test]
    fn a_provider_that_enforces_nothing_names_every_limit_set() {
        let l = Limits {
            pids: Some(10),
            memory_mb: Some(5),
            swap_mb: Some(0),
            ..Default::default()
        };
        let u = none_enforced(&l, "no");
        assert_eq!(
            u.keys().map(String::as_str).collect::<Vec<_>>(),
            ["memory_mb", "pids", "swap_mb"]
        );
    }
}
