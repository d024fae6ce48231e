//! Warm pools: per profile + image, a target number of ready sandboxes nobody owns yet.
//!
//! The store is the only count: a refill inserts the member's row before it starts anything,
//! under a cap on concurrent starts, so a slow or failing start can never make the loop create
//! more (the over-creation runaway). Repeated failures stop a pool's refill and are reported.
//! A pool above its size (resized down, or after a restart) destroys its surplus idle members,
//! decided from the stored members alone ([`surplus`]); claimed sandboxes are no longer members.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use berth_protocol::controller::PoolStatus;
use berth_protocol::sync::Locked;
use tokio::sync::{Notify, Semaphore};

use crate::ctx::Ctx;
use crate::lifecycle::SandboxStatus;
use crate::sandbox::{Request, Sandboxes};
use crate::store::SandboxRow;
use crate::warm::{PoolState, PoolTable};

/// Which of a pool's stored, live members to destroy so that it holds no more than `size`.
///
/// Every member counts — ready or still starting — but only a ready one is destroyed: a start
/// is never cut short halfway (its sandbox could outlive the destroy). Ready members beyond
/// `size` go, the most recently ready first (claims take the oldest); a member still starting
/// is decided on once it is ready (then surplus, it goes), or ends when its start fails. So
/// ready ones are kept while starting ones could be the surplus.
pub fn surplus(members: &[SandboxRow], size: usize) -> Vec<String> {
    let mut ready: Vec<&SandboxRow> = members
        .iter()
        .filter(|m| m.status == SandboxStatus::Running)
        .collect();
    ready.sort_by(|a, b| b.ready_at.cmp(&a.ready_at).then_with(|| b.id.cmp(&a.id)));
    let extra = ready.len().saturating_sub(size);
    ready
        .into_iter()
        .take(extra)
        .map(|m| m.id.clone())
        .collect()
}

/// The warm pools' refill: keeps each configured pool at its size, starting members through
/// [`Sandboxes`] and destroying its surplus.
pub struct Pools {
    ctx: Arc<Ctx>,
    sandboxes: Arc<Sandboxes>,
    pub table: Arc<PoolTable>,
}

impl Pools {
    pub fn new(ctx: Arc<Ctx>, sandboxes: Arc<Sandboxes>, table: Arc<PoolTable>) -> Pools {
        Pools {
            ctx,
            sandboxes,
            table,
        }
    }

    /// Resolves the configured pools and starts their refill loops.
    pub fn start_pools(self: &Arc<Self>) -> anyhow::Result<()> {
        *self.table.starts.locked() =
            Some(Arc::new(Semaphore::new(self.ctx.config.refill_concurrency)));
        for c in self.table.configured.clone() {
            let image = self
                .sandboxes
                .resolve(&c.profile, c.image_ref.as_deref())
                .map_err(|e| anyhow::anyhow!("pool for {}: {e}", c.profile))?;
            let egress = self
                .sandboxes
                .check_egress(&c.profile, c.egress.as_ref())
                .map_err(|e| anyhow::anyhow!("pool for {}: {e}", c.profile))?;
            if let Some(l) = &c.limits {
                l.check()
                    .map_err(|why| anyhow::anyhow!("pool for {}: limits: {why}", c.profile))?;
            }
            let key = self
                .sandboxes
                .warm_key(&c.profile, &image, &egress, c.limits.as_ref());
            let screen = self
                .sandboxes
                .check_screen(&c.profile, c.screen.as_deref())
                .map_err(|e| anyhow::anyhow!("pool for {}: {e}", c.profile))?;
            let state = Arc::new(PoolState {
                key: key.clone(),
                // A pool configured under an alias serves the canonical profile.
                profile: self.ctx.catalog.canonical(&c.profile).to_string(),
                image_ref: image,
                screen,
                egress,
                limits: c.limits.clone(),
                size: AtomicUsize::new(c.size),
                paused: AtomicBool::new(false),
                failures: AtomicU32::new(0),
                failing: Mutex::new(None),
                wake: Notify::new(),
            });
            self.table.pools.locked().insert(key, state.clone());
            let me = self.clone();
            tokio::spawn(async move { me.refill_loop(state).await });
        }
        Ok(())
    }

    /// Pauses or resumes every pool of `profile`, optionally with a new size (see
    /// [`PoolTable::adjust`]). False when no pool serves that profile.
    pub fn adjust(&self, profile: &str, paused: Option<bool>, size: Option<usize>) -> bool {
        self.table.adjust(profile, paused, size)
    }

    pub fn pool_status(&self) -> Vec<PoolStatus> {
        self.table
            .all()
            .iter()
            .map(|p| {
                let (ready, starting) = self.ctx.store.pool_members(&p.key).unwrap_or((0, 0));
                PoolStatus {
                    pool: p.key.clone(),
                    profile: p.profile.clone(),
                    image_ref: p.image_ref.clone(),
                    size: p.size.load(Ordering::SeqCst),
                    ready,
                    starting,
                    paused: p.paused.load(Ordering::SeqCst),
                    failing: p.failing.locked().clone(),
                    screen: p.screen.clone(),
                    egress: (p.egress != self.ctx.config.egress.default).then(|| p.egress.clone()),
                }
            })
            .collect()
    }

    async fn refill_loop(self: Arc<Self>, pool: Arc<PoolState>) {
        let Some(starts) = self.table.starts.locked().clone() else {
            return;
        };
        loop {
            let _ = tokio::time::timeout(Duration::from_secs(1), pool.wake.notified()).await;
            self.shrink(&pool);
            loop {
                if pool.paused.load(Ordering::SeqCst) || pool.failing.locked().is_some() {
                    break;
                }
                // A permit first, then the count: a member's row exists before the next count.
                let Ok(permit) = starts.clone().acquire_owned().await else {
                    return;
                };
                let (ready, starting) = match self.ctx.store.pool_members(&pool.key) {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::error!(pool = %pool.key, error = %e, "cannot count the pool");
                        break;
                    }
                };
                if ready + starting >= pool.size.load(Ordering::SeqCst)
                    || pool.paused.load(Ordering::SeqCst)
                    || pool.failing.locked().is_some()
                {
                    break;
                }
                let req = Request {
                    profile: pool.profile.clone(),
                    image_ref: Some(pool.image_ref.clone()),
                    labels: Default::default(),
                    ttl_seconds: None,
                    screen: pool.screen.clone(),
                    egress: Some(pool.egress.clone()),
                    credentials: Vec::new(),
                    human_control: false,
                    logins: Vec::new(),
                    limits: pool.limits.clone(),
                };
                let row = match self
                    .sandboxes
                    .insert_row(&req, &pool.image_ref, Some(&pool.key))
                {
                    Ok(r) => r,
                    Err(e) => {
                        self.refill_failed(&pool, &e.to_string());
                        break;
                    }
                };
                let me = self.clone();
                let p = pool.clone();
                tokio::spawn(async move {
                    let result = match me.sandboxes.launch(&row).await {
                        Ok(_) => me
                            .sandboxes
                            .clone()
                            .await_ready(row.id.clone())
                            .await
                            .map(|_| ()),
                        Err(e) => Err(e),
                    };
                    // The outcome counts before the permit is free for the next start.
                    match result {
                        Ok(()) => p.failures.store(0, Ordering::SeqCst),
                        Err(e) => me.refill_failed(&p, &e.to_string()),
                    }
                    drop(permit);
                    p.wake.notify_one();
                });
            }
        }
    }

    /// Destroys the members beyond the pool's size ([`surplus`]), each first taken out of the
    /// pool by a compare-and-swap so a claim racing it wins or loses whole.
    fn shrink(self: &Arc<Self>, pool: &PoolState) {
        let members = match self.ctx.store.pool_member_rows(&pool.key) {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(pool = %pool.key, error = %e, "cannot list the pool's members");
                return;
            }
        };
        for id in surplus(&members, pool.size.load(Ordering::SeqCst)) {
            match self.ctx.store.retire_member(&pool.key, &id) {
                Ok(true) => {
                    tracing::info!(pool = %pool.key, sandbox = %id, "destroying a surplus pool member");
                    drop(self.sandboxes.destroy(&id)); // goes on in its own task
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(pool = %pool.key, sandbox = %id, error = %e, "cannot retire a pool member");
                }
            }
        }
    }

    fn refill_failed(&self, pool: &PoolState, reason: &str) {
        let n = pool.failures.fetch_add(1, Ordering::SeqCst) + 1;
        tracing::warn!(pool = %pool.key, failures = n, reason, "pool member failed to start");
        if n >= self.ctx.config.refill_max_failures {
            let msg = format!("refill stopped after {n} failed starts in a row; last: {reason}");
            tracing::error!(pool = %pool.key, "{msg}");
            *pool.failing.locked() = Some(msg);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PoolConfig;
    use crate::controller::Controller;
    use crate::lifecycle::SandboxStatus;

    fn member(id: &str, status: &str, ready_at: Option<i64>) -> SandboxRow {
        let status = status.parse().unwrap();
        SandboxRow {
            id: id.into(),
            profile: "ide".into(),
            image_ref: "process:x".into(),
            provider: "process".into(),
            status,
            labels: Default::default(),
            pool: Some("ide@process:x".into()),
            claim: None,
            agent_url: None,
            agent_token: "t".into(),
            compat_url: None,
            cdp_url: None,
            ports: Default::default(),
            created_at: 0,
            ready_deadline: 0,
            ready_at,
            expires_at: None,
            ended_at: None,
            error: None,
            agent_event_seq: 0,
            screen: None,
            limits: None,
            egress: None,
        }
    }

    #[test]
    fn a_pool_at_or_under_its_size_destroys_nothing() {
        let m = [
            member("a", "running", Some(1)),
            member("b", "starting", None),
        ];
        assert!(surplus(&m, 2).is_empty());
        assert!(surplus(&m, 5).is_empty());
        assert!(surplus(&[], 0).is_empty());
    }

    #[test]
    fn shrunk_to_zero_every_ready_member_goes_and_starting_ones_wait_until_ready() {
        let m = [
            member("a", "running", Some(1)),
            member("b", "pending", None),
            member("c", "running", Some(2)),
            member("d", "starting", None),
        ];
        assert_eq!(surplus(&m, 0), ["c", "a"]);
        // Once ready, a surplus member goes too.
        let m = [member("d", "running", Some(3))];
        assert_eq!(surplus(&m, 0), ["d"]);
    }

    #[test]
    fn the_newest_ready_go_first_and_ready_ones_are_kept_over_starting_ones() {
        let m = [
            member("a", "running", Some(10)),
            member("b", "running", Some(30)),
            member("c", "running", Some(20)),
        ];
        assert_eq!(surplus(&m, 1), ["b", "c"]);
        // Two ready and one starting in a pool of 2: the ready stay; the starting one is
        // decided on when it is ready.
        let m = [
            member("a", "running", Some(10)),
            member("b", "running", Some(20)),
            member("c", "starting", None),
        ];
        assert!(surplus(&m, 2).is_empty());
        assert_eq!(surplus(&m, 1), ["b"]);
    }

    mod on_the_fake_provider {
        use std::collections::BTreeSet;
        use std::time::Duration;

        use super::*;
        use crate::config::Config;
        use crate::controller::controller_on;
        use crate::provider::fake::{CreateMode, FakeProvider};

        const PROFILE: &str = "ide";
        const WITHIN: Duration = Duration::from_secs(20);

        fn config(size: usize, concurrency: usize) -> Config {
            Config {
                pools: vec![PoolConfig {
                    profile: PROFILE.into(),
                    image_ref: None,
                    size,
                    screen: None,
                    egress: None,
                    limits: None,
                }],
                refill_concurrency: concurrency,
                refill_max_failures: 3,
                ..Config::default()
            }
        }

        fn req() -> Request {
            Request {
                profile: PROFILE.into(),
                image_ref: None,
                labels: Default::default(),
                ttl_seconds: None,
                screen: None,
                egress: None,
                credentials: Vec::new(),
                human_control: false,
                logins: Vec::new(),
                limits: None,
            }
        }

        fn pool(c: &Controller) -> PoolStatus {
            c.pools.pool_status().pop().expect("one pool")
        }

        async fn until(
            c: &Arc<Controller>,
            fake: &FakeProvider,
            cond: impl Fn(&PoolStatus) -> bool,
        ) {
            let ok = fake.wait_for(WITHIN, |_| cond(&pool(c))).await;
            assert!(ok, "the pool never got there: {:?}", pool(c));
        }

        /// A controller whose pool of two is ready and then paused (it makes no new member),
        /// and the members' ids.
        async fn paused_pool_of_two() -> (
            tempfile::TempDir,
            Arc<FakeProvider>,
            Arc<Controller>,
            BTreeSet<String>,
        ) {
            let d = tempfile::tempdir().unwrap();
            let fake = FakeProvider::new("process");
            let c = controller_on(d.path(), &fake, config(2, 2));
            c.pools.start_pools().unwrap();
            until(&c, &fake, |p| p.ready == 2).await;
            let members = c
                .ctx
                .store
                .pool_member_rows(&pool(&c).pool)
                .unwrap()
                .into_iter()
                .map(|r| r.id)
                .collect();
            assert!(c.pools.adjust("ide-ubuntu", Some(true), None));
            (d, fake, c, members)
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_claim_is_served_by_the_pool_of_the_egress_policy_it_asks() {
            use berth_protocol::egress::{Egress, EgressMode};
            let d = tempfile::tempdir().unwrap();
            let fake = FakeProvider::new("process");
            fake.set_enforces_egress(true);
            let mut cfg = config(1, 2);
            let fenced = PoolConfig {
                egress: Some(Egress::Mode(EgressMode::None)),
                ..cfg.pools[0].clone()
            };
            cfg.pools.push(fenced);
            let c = controller_on(d.path(), &fake, cfg);
            c.pools.start_pools().unwrap();
            let ready = || c.pools.pool_status().iter().all(|p| p.ready == 1);
            assert!(
                fake.wait_for(WITHIN, |_| ready()).await,
                "{:?}",
                c.pools.pool_status()
            );
            let pools = c.pools.pool_status();
            let keys: BTreeSet<&str> = pools.iter().map(|p| p.pool.as_str()).collect();
            assert_eq!(keys.len(), 2, "{pools:?}");
            let fenced = pools.iter().find(|p| p.egress.is_some()).unwrap();
            assert!(fenced.pool.contains("#egress-"), "{fenced:?}");
            let none = Request {
                egress: Some(Egress::Mode(EgressMode::None)),
                ..req()
            };
            for (r, policy) in [
                (none, Egress::Mode(EgressMode::None)),
                (req(), Egress::default()),
            ] {
                let (row, how) = c.sandboxes.provision(&r).await.unwrap();
                assert_eq!(how, "warm");
                assert_eq!(row.egress.map(|e| e.policy), Some(policy));
            }
            // A policy no pool has is served cold.
            let other = Request {
                egress: Some(Egress::Rules(berth_protocol::egress::EgressRules {
                    allow: vec!["github.com".into()],
                    deny_private: true,
                })),
                ..req()
            };
            let (_, how) = c.sandboxes.provision(&other).await.unwrap();
            assert_eq!(how, "cold");
        }

        #[tokio::test]
        async fn a_claim_is_served_by_the_pool_of_the_limits_it_asks() {
            use berth_protocol::controller::LimitsOverride;
            let d = tempfile::tempdir().unwrap();
            let fake = FakeProvider::new("process");
            let mut cfg = config(1, 2);
            let small = LimitsOverride {
                cpus: Some(0.5),
                memory_mb: Some(512),
                ..Default::default()
            };
            let sized = PoolConfig {
                limits: Some(small.clone()),
                ..cfg.pools[0].clone()
            };
            cfg.pools.push(sized);
            let c = controller_on(d.path(), &fake, cfg);
            c.pools.start_pools().unwrap();
            let ready = || c.pools.pool_status().iter().all(|p| p.ready == 1);
            assert!(
                fake.wait_for(WITHIN, |_| ready()).await,
                "{:?}",
                c.pools.pool_status()
            );
            let keys: BTreeSet<String> =
                c.pools.pool_status().into_iter().map(|p| p.pool).collect();
            assert!(keys.iter().any(|k| k.contains("#limits-")), "{keys:?}");
            let asked = Request {
                limits: Some(small),
                ..req()
            };
            let (row, how) = c.sandboxes.provision(&asked).await.unwrap();
            assert_eq!(how, "warm");
            let l = row.limits.unwrap();
            assert_eq!((l.cpus, l.memory_mb), (Some(0.5), Some(512)));
            // The profile's own limits, asked or not, are the plain pool's.
            let (_, how) = c.sandboxes.provision(&req()).await.unwrap();
            assert_eq!(how, "warm");
            // Limits no pool has: cold, and the sandbox has them.
            let other = Request {
                limits: Some(LimitsOverride {
                    pids: Some(64),
                    ..Default::default()
                }),
                ..req()
            };
            let (row, how) = c.sandboxes.provision(&other).await.unwrap();
            assert_eq!(how, "cold");
            assert_eq!(row.limits.unwrap().pids, Some(64));
            // Limits a kernel would refuse: a 400 naming them.
            let bad = Request {
                limits: Some(LimitsOverride {
                    memory_mb: Some(1),
                    ..Default::default()
                }),
                ..req()
            };
            let e = c.sandboxes.provision(&bad).await.unwrap_err().to_string();
            assert!(e.contains("memory_mb"), "{e}");
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn racing_creates_each_get_their_own_sandbox_and_warm_members_go_once() {
            // Paused, the pool makes no new member while they race.
            let (_d, fake, c, members) = paused_pool_of_two().await;
            // Eight creates race for the two members: each gets a sandbox of its own, two of
            // them the members, the rest cold ones.
            let tasks: Vec<_> = (0..8)
                .map(|_| {
                    let c = c.clone();
                    tokio::spawn(async move { c.sandboxes.provision(&req()).await.unwrap() })
                })
                .collect();
            let mut got = Vec::new();
            for t in tasks {
                got.push(t.await.unwrap());
            }
            let ids: BTreeSet<&str> = got.iter().map(|(r, _)| r.id.as_str()).collect();
            assert_eq!(ids.len(), 8, "one sandbox per create");
            let warm: BTreeSet<String> = got
                .iter()
                .filter(|(_, how)| *how == "warm")
                .map(|(r, _)| r.id.clone())
                .collect();
            assert_eq!(warm, members, "each member claimed once");
            assert_eq!(fake.creates(), 2 + 6);
            for (row, how) in &got {
                assert_eq!(row.status, SandboxStatus::Running);
                assert!(row.pool.is_none(), "a claimed sandbox leaves its pool");
                assert_eq!(row.claim.as_deref(), Some(*how));
            }
            // Resumed, it refills to its size.
            assert!(c.pools.adjust("ide-ubuntu", Some(false), None));
            until(&c, &fake, |p| p.ready == 2).await;
            assert_eq!(fake.creates(), 2 + 6 + 2);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_member_slow_to_answer_but_alive_is_claimed_warm_and_a_dead_one_is_not() {
            let (_d, fake, c, members) = paused_pool_of_two().await;
            let members: Vec<String> = members.into_iter().collect();
            // Both agents answer only after the first probe's time, as on a host starting forty
            // containers; one sandbox is alive, the other has died behind the controller.
            for id in &members {
                fake.set_slow(id, crate::sandbox::PROBE_TIMEOUT + Duration::from_secs(1));
            }
            fake.set_alive(&members[1], false);
            let mut got = Vec::new();
            for _ in 0..2 {
                got.push(c.sandboxes.provision(&req()).await.unwrap());
            }
            let warm: Vec<&str> = got
                .iter()
                .filter(|(_, how)| *how == "warm")
                .map(|(r, _)| r.id.as_str())
                .collect();
            assert_eq!(warm.len(), 1, "{got:?}");
            assert!(members.iter().any(|m| m == warm[0]));
            assert!(
                c.ctx
                    .store
                    .sandbox(warm[0])
                    .unwrap()
                    .is_some_and(|r| r.status == SandboxStatus::Running)
            );
            let dead = members.iter().find(|m| *m != warm[0]).unwrap();
            let row = c.ctx.store.sandbox(dead).unwrap().unwrap();
            assert_eq!(row.status, SandboxStatus::Failed, "{row:?}");
            // One member and one cold create besides the pool's two.
            assert_eq!(fake.creates(), 2 + 1);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_member_still_starting_is_never_claimed_and_hanging_starts_never_multiply() {
            let d = tempfile::tempdir().unwrap();
            let fake = FakeProvider::new("process");
            fake.set_create(CreateMode::Hang);
            let c = controller_on(d.path(), &fake, config(2, 2));
            c.pools.start_pools().unwrap();
            until(&c, &fake, |p| p.starting == 2).await;
            // Each member's row is recorded before its create is asked.
            assert!(fake.wait_for(WITHIN, |f| f.creates() == 2).await);
            // Nothing is ready: a create is cold, and waits like any (it hangs too).
            let key = pool(&c).pool;
            assert!(
                c.ctx
                    .store
                    .claim_warm(&key, &Default::default(), None)
                    .unwrap()
                    .is_none()
            );
            fake.set_create(CreateMode::Succeed);
            until(&c, &fake, |p| p.ready == 2).await;
            // However long the starts hung, the pool made exactly its size.
            assert_eq!(fake.creates(), 2);
            assert_eq!(pool(&c).starting, 0);
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn refills_stop_after_repeated_failures_and_resume_when_asked() {
            let d = tempfile::tempdir().unwrap();
            let fake = FakeProvider::new("process");
            fake.set_create(CreateMode::Fail("no capacity".into()));
            let c = controller_on(d.path(), &fake, config(2, 1));
            c.pools.start_pools().unwrap();
            until(&c, &fake, |p| p.failing.is_some()).await;
            let failing = pool(&c).failing.unwrap();
            assert!(failing.contains("after 3 failed starts"), "{failing}");
            assert!(failing.contains("no capacity"), "{failing}");
            // One start at a time: exactly the three that failed were tried.
            assert_eq!(fake.creates(), 3);
            // Each failed member ended failed, none left running in the provider.
            let rows = c.ctx.store.sandboxes(&[SandboxStatus::Failed]).unwrap();
            assert_eq!(rows.len(), 3);
            assert!(fake.ids().is_empty());
            // Resumed, with the provider working again: the pool fills.
            fake.set_create(CreateMode::Succeed);
            assert!(c.pools.adjust("ide-ubuntu", Some(false), None));
            until(&c, &fake, |p| p.ready == 2 && p.failing.is_none()).await;
            assert_eq!(fake.creates(), 5);
            // Shrunk to one: the surplus member is destroyed.
            assert!(c.pools.adjust("ide-ubuntu", None, Some(1)));
            until(&c, &fake, |p| p.ready == 1).await;
            assert!(fake.wait_for(WITHIN, |f| f.ids().len() == 1).await);
        }
    }
}
