//! Prometheus text exposition, by hand: a few counters and two histograms do not need a
//! metrics framework.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use berth_protocol::sync::Locked;

/// Claim latency bucket bounds, seconds.
const BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, secs: f64) {
        for (i, b) in BUCKETS.iter().enumerate() {
            if secs <= *b {
                self.counts[i] += 1;
            }
        }
        self.count += 1;
        self.sum += secs;
    }
}

#[derive(Default)]
pub struct Metrics {
    claims: Mutex<BTreeMap<&'static str, Histogram>>,
    provider_errors: AtomicU64,
    runs_reconciling: AtomicU64,
    runs_adopted: AtomicU64,
    orphans_reaped: AtomicU64,
    artifacts_published: AtomicU64,
    artifacts_deleted: AtomicU64,
    artifacts: AtomicU64,
    artifact_bytes: AtomicU64,
}

impl Metrics {
    /// A claim served: `warm` from a pool, `cold` created for the call.
    pub fn claim(&self, kind: &'static str, took: Duration) {
        self.claims
            .locked()
            .entry(kind)
            .or_default()
            .observe(took.as_secs_f64());
    }

    pub fn provider_error(&self) {
        self.provider_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub fn set_runs_reconciling(&self, n: u64) {
        self.runs_reconciling.store(n, Ordering::Relaxed);
    }

    pub fn run_adopted(&self) {
        self.runs_adopted.fetch_add(1, Ordering::Relaxed);
    }

    pub fn orphan_reaped(&self) {
        self.orphans_reaped.fetch_add(1, Ordering::Relaxed);
    }

    pub fn artifact_published(&self, bytes: u64) {
        self.artifacts_published.fetch_add(1, Ordering::Relaxed);
        self.artifacts.fetch_add(1, Ordering::Relaxed);
        self.artifact_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn artifact_deleted(&self, bytes: u64) {
        self.artifacts_deleted.fetch_add(1, Ordering::Relaxed);
        let sub = |a: &AtomicU64, n: u64| {
            let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(n))
            });
        };
        sub(&self.artifacts, 1);
        sub(&self.artifact_bytes, bytes);
    }

    /// The artifacts kept, as counted in the store.
    pub fn set_artifacts(&self, count: u64, bytes: u64) {
        self.artifacts.store(count, Ordering::Relaxed);
        self.artifact_bytes.store(bytes, Ordering::Relaxed);
    }

    /// The exposition; `by_state` and `pools` are read from the store by the caller.
    pub fn render(
        &self,
        by_state: &BTreeMap<String, u64>,
        pools: &[(String, usize, usize, usize, bool)],
    ) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "# HELP berth_sandboxes Sandboxes by state.");
        let _ = writeln!(o, "# TYPE berth_sandboxes gauge");
        for state in crate::lifecycle::SandboxStatus::ALL
            .iter()
            .map(|s| s.as_str())
        {
            let n = by_state.get(state).copied().unwrap_or(0);
            let _ = writeln!(o, "berth_sandboxes{{state=\"{state}\"}} {n}");
        }
        render_ksm(&mut o);
        self.render_claims(&mut o);
        self.render_counters(&mut o);
        render_pools(&mut o, pools);
        o
    }

    /// The claim latency histograms, warm and cold.
    fn render_claims(&self, o: &mut String) {
        let _ = writeln!(
            o,
            "# HELP berth_claim_latency_seconds Time to hand out a ready sandbox, by warm (pool) or cold (created)."
        );
        let _ = writeln!(o, "# TYPE berth_claim_latency_seconds histogram");
        let claims = self.claims.locked();
        for kind in ["warm", "cold"] {
            let empty = Histogram::default();
            let h = claims.get(kind).unwrap_or(&empty);
            for (i, b) in BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    o,
                    "berth_claim_latency_seconds_bucket{{claim=\"{kind}\",le=\"{b}\"}} {}",
                    h.counts[i]
                );
            }
            let _ = writeln!(
                o,
                "berth_claim_latency_seconds_bucket{{claim=\"{kind}\",le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(
                o,
                "berth_claim_latency_seconds_sum{{claim=\"{kind}\"}} {}",
                h.sum
            );
            let _ = writeln!(
                o,
                "berth_claim_latency_seconds_count{{claim=\"{kind}\"}} {}",
                h.count
            );
        }
    }

    /// The counters and the gauges kept here.
    fn render_counters(&self, o: &mut String) {
        let counters = [
            (
                "berth_provider_errors_total",
                "Provider operations that failed.",
                &self.provider_errors,
            ),
            (
                "berth_runs_adopted_total",
                "Runs whose end the reconciler adopted from an agent.",
                &self.runs_adopted,
            ),
            (
                "berth_orphans_reaped_total",
                "Provider sandboxes the store did not know, reaped.",
                &self.orphans_reaped,
            ),
            (
                "berth_artifacts_published_total",
                "Artifacts published (recordings, files, directories, run output, episodes).",
                &self.artifacts_published,
            ),
            (
                "berth_artifacts_deleted_total",
                "Artifacts deleted (by retention or a DELETE).",
                &self.artifacts_deleted,
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(o, "# HELP {name} {help}");
            let _ = writeln!(o, "# TYPE {name} counter");
            let _ = writeln!(o, "{name} {}", v.load(Ordering::Relaxed));
        }
        let _ = writeln!(
            o,
            "# HELP berth_runs_reconciling Runs in flight that the reconciler re-probes."
        );
        let _ = writeln!(o, "# TYPE berth_runs_reconciling gauge");
        let _ = writeln!(
            o,
            "berth_runs_reconciling {}",
            self.runs_reconciling.load(Ordering::Relaxed)
        );
        let gauges = [
            ("berth_artifacts", "Artifacts kept.", &self.artifacts),
            (
                "berth_artifact_bytes",
                "Bytes of the artifacts kept.",
                &self.artifact_bytes,
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(o, "# HELP {name} {help}");
            let _ = writeln!(o, "# TYPE {name} gauge");
            let _ = writeln!(o, "{name} {}", v.load(Ordering::Relaxed));
        }
    }
}

/// The warm pools' members, targets and whether their refill is failing.
fn render_pools(o: &mut String, pools: &[(String, usize, usize, usize, bool)]) {
    let _ = writeln!(
        o,
        "# HELP berth_pool_members Warm pool members by state, and whether refill is failing."
    );
    let _ = writeln!(o, "# TYPE berth_pool_members gauge");
    for (pool, target, ready, starting, failing) in pools {
        let _ = writeln!(
            o,
            "berth_pool_members{{pool=\"{pool}\",state=\"ready\"}} {ready}"
        );
        let _ = writeln!(
            o,
            "berth_pool_members{{pool=\"{pool}\",state=\"starting\"}} {starting}"
        );
        let _ = writeln!(o, "berth_pool_target{{pool=\"{pool}\"}} {target}");
        let _ = writeln!(
            o,
            "berth_pool_refill_failing{{pool=\"{pool}\"}} {}",
            *failing as u8
        );
    }
}

/// The host's KSM: whether it runs, and the memory it saves now (`pages_sharing`).
fn render_ksm(o: &mut String) {
    let read = |f: &str| {
        std::fs::read_to_string(format!("/sys/kernel/mm/ksm/{f}"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    let Some(run) = read("run") else {
        return;
    };
    let page = 4096;
    let saved = read("pages_sharing").unwrap_or(0) * page;
    let _ = writeln!(
        o,
        "# HELP berth_host_ksm_run The host's KSM: 1 when it merges pages."
    );
    let _ = writeln!(o, "# TYPE berth_host_ksm_run gauge");
    let _ = writeln!(o, "berth_host_ksm_run {}", u64::from(run == 1));
    let _ = writeln!(o, "# HELP berth_host_ksm_saved_bytes Memory KSM saves now.");
    let _ = writeln!(o, "# TYPE berth_host_ksm_saved_bytes gauge");
    let _ = writeln!(o, "berth_host_ksm_saved_bytes {saved}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_labelled() {
        let m = Metrics::default();
        m.claim("warm", Duration::from_millis(20));
        m.claim("warm", Duration::from_millis(200));
        let text = m.render(&BTreeMap::new(), &[]);
        assert!(text.contains("berth_claim_latency_seconds_bucket{claim=\"warm\",le=\"0.025\"} 1"));
        assert!(text.contains("berth_claim_latency_seconds_bucket{claim=\"warm\",le=\"0.25\"} 2"));
        assert!(text.contains("berth_claim_latency_seconds_count{claim=\"cold\"} 0"));
    }
}
