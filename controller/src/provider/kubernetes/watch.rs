//! Deaths as the API server tells them: a watch on the controller's Pods (by label), resumed
//! from the last resource version it saw, re-listed when that version has expired (410).
//! A Pod that fails, whose agent container terminates (OOMKilled says so) or that is deleted
//! by anyone but this provider is a `Death` at once, once per Pod.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_protocol::sync::Locked;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};

use super::objects::{self, PodState};
use crate::provider::{Death, LABEL_SANDBOX};

/// Sandboxes this provider is destroying: their Pods' deletion is no death.
#[derive(Default)]
pub struct Destroying(Mutex<HashMap<String, Instant>>);

impl Destroying {
    /// How long a destroy's mark lasts (its Pod is long gone by then).
    const KEEP: Duration = Duration::from_secs(600);

    pub fn mark(&self, sandbox_id: &str) {
        let mut m = self.0.locked();
        let now = Instant::now();
        m.retain(|_, at| now.duration_since(*at) < Self::KEEP);
        m.insert(sandbox_id.to_string(), now);
    }

    pub fn contains(&self, sandbox_id: &str) -> bool {
        let m = self.0.locked();
        m.contains_key(sandbox_id)
    }
}

/// What a watch event says about a sandbox's life (a pure reading of the event).
pub fn death_of(event: &WatchEvent<Pod>, destroying: &Destroying) -> Option<Death> {
    let (pod, deleted) = match event {
        WatchEvent::Added(p) | WatchEvent::Modified(p) => (p, false),
        WatchEvent::Deleted(p) => (p, true),
        WatchEvent::Bookmark(_) | WatchEvent::Error(_) => return None,
    };
    let sandbox_id = pod.metadata.labels.as_ref()?.get(LABEL_SANDBOX)?.clone();
    if destroying.contains(&sandbox_id) {
        return None;
    }
    let reason = match (deleted, objects::pod_state(pod)) {
        (true, PodState::Dead(r)) if r != "its Pod is being deleted" => r,
        (true, _) => "its Pod was deleted".to_string(),
        (false, PodState::Dead(r)) => r,
        (false, _) => return None,
    };
    Some(Death { sandbox_id, reason })
}

fn resource_version(event: &WatchEvent<Pod>) -> Option<String> {
    match event {
        WatchEvent::Added(p) | WatchEvent::Modified(p) | WatchEvent::Deleted(p) => {
            p.metadata.resource_version.clone()
        }
        WatchEvent::Bookmark(b) => Some(b.metadata.resource_version.clone()),
        WatchEvent::Error(_) => None,
    }
}

/// The server-side bound of one watch request; it is re-issued from the last version seen.
const WATCH_SECS: u32 = 290;

/// Runs until the receiver goes away.
pub async fn run(
    api: Api<Pod>,
    controller_id: String,
    destroying: Arc<Destroying>,
    tx: tokio::sync::mpsc::Sender<Death>,
) {
    let selector = objects::controller_selector(&controller_id);
    let mut version: Option<String> = None;
    // Pods already reported, by uid (a failed Pod is modified again as it is cleaned up).
    let mut reported: HashSet<String> = HashSet::new();
    let mut backoff = Duration::from_millis(500);
    loop {
        if tx.is_closed() {
            return;
        }
        let from = match &version {
            Some(v) => v.clone(),
            None => match api.list(&ListParams::default().labels(&selector)).await {
                Ok(list) => {
                    // What died while no watch was open.
                    for pod in &list.items {
                        if let Some(d) = death_of(&WatchEvent::Modified(pod.clone()), &destroying)
                            && !send(&tx, &mut reported, pod.metadata.uid.clone(), d).await
                        {
                            return;
                        }
                    }
                    let v = list.metadata.resource_version.unwrap_or_default();
                    version = Some(v.clone());
                    v
                }
                Err(e) => {
                    tracing::warn!(error = %e, "listing the controller's Pods failed");
                    back_off(&mut backoff).await;
                    continue;
                }
            },
        };
        let params = WatchParams::default().labels(&selector).timeout(WATCH_SECS);
        let stream = match api.watch(&params, &from).await {
            Ok(s) => s,
            Err(kube::Error::Api(s)) if s.code == 410 => {
                version = None;
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "watching the controller's Pods failed");
                back_off(&mut backoff).await;
                continue;
            }
        };
        backoff = Duration::from_millis(500);
        if follow(stream, &mut version, &destroying, &tx, &mut reported).await == Receiver::Gone {
            return;
        }
    }
}

/// Whether anyone still listens for deaths.
#[derive(Debug, PartialEq, Eq)]
enum Receiver {
    Listening,
    Gone,
}

/// Sends a death unless the Pod's was sent already; false when the receiver is gone.
async fn send(
    tx: &tokio::sync::mpsc::Sender<Death>,
    reported: &mut HashSet<String>,
    pod_uid: Option<String>,
    death: Death,
) -> bool {
    let fresh = pod_uid.is_none_or(|uid| reported.insert(uid));
    match fresh {
        true => tx.send(death).await.is_ok(),
        false => !tx.is_closed(),
    }
}

/// Waits out a failed request's backoff, then doubles it (up to 30 s).
async fn back_off(backoff: &mut Duration) {
    tokio::time::sleep(*backoff).await;
    *backoff = (*backoff * 2).min(Duration::from_secs(30));
}

/// Reports the deaths one watch request streams until it ends or breaks off, keeping
/// `version` at the last resource version seen (None when it has expired: list again).
async fn follow(
    stream: impl futures_util::Stream<Item = kube::Result<WatchEvent<Pod>>>,
    version: &mut Option<String>,
    destroying: &Destroying,
    tx: &tokio::sync::mpsc::Sender<Death>,
    reported: &mut HashSet<String>,
) -> Receiver {
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                tracing::debug!(error = %e, "the Pod watch broke off");
                break;
            }
        };
        if let WatchEvent::Error(s) = &event {
            if s.code == 410 {
                // Too old a version: list again.
                *version = None;
            } else {
                tracing::warn!(code = s.code, message = %s.message, "the Pod watch failed");
            }
            break;
        }
        if let Some(v) = resource_version(&event) {
            *version = Some(v);
        }
        let uid = match &event {
            WatchEvent::Added(p) | WatchEvent::Modified(p) | WatchEvent::Deleted(p) => {
                p.metadata.uid.clone()
            }
            _ => None,
        };
        if let Some(d) = death_of(&event, destroying)
            && !send(tx, reported, uid, d).await
        {
            return Receiver::Gone;
        }
    }
    Receiver::Listening
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(sandbox: &str, status: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("berth-{sandbox}"), "uid": format!("uid-{sandbox}"),
                         "labels": {"berth.sandbox": sandbox, "berth.controller": "ctl_1"}},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn deaths_are_failures_terminations_and_deletions_by_others() {
        let d = Destroying::default();
        let running = pod(
            "sb_1",
            serde_json::json!({"phase": "Running", "podIP": "10.0.0.9"}),
        );
        assert!(death_of(&WatchEvent::Modified(running.clone()), &d).is_none());
        let oom = pod(
            "sb_1",
            serde_json::json!({"phase": "Failed", "containerStatuses": [{
                "name": "agent", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}),
        );
        let death = death_of(&WatchEvent::Modified(oom), &d).unwrap();
        assert_eq!(
            (death.sandbox_id.as_str(), death.reason.as_str()),
            ("sb_1", "OOMKilled")
        );
        let gone = death_of(&WatchEvent::Deleted(running.clone()), &d).unwrap();
        assert_eq!(gone.reason, "its Pod was deleted");
        d.mark("sb_1");
        assert!(death_of(&WatchEvent::Deleted(running), &d).is_none());
    }
}
