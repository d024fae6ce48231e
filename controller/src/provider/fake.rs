//! A provider held in memory, for tests of the controller without processes or containers:
//! creates succeed, fail or hang as told, sandboxes die or vanish on command, and `inspect` /
//! `list` answer from its memory. Each sandbox it creates gets an in-process agent (an axum
//! router on `127.0.0.1:0`) answering what the controller asks of a non-desktop agent —
//! `/healthz` and the event log — so readiness is probed over real HTTP; an agent can be made
//! unreachable, or slow to answer, while its sandbox stays alive.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use berth_protocol::events::EventsPage;
use berth_protocol::routes::native;
use berth_protocol::sync::Locked;
use tokio::sync::{Notify, mpsc};

use super::{Death, Endpoint, Identity, Observed, Provider, ProviderError, Result, Spec};
use crate::util::now_ms;

/// What the next creates do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateMode {
    /// Made, with a reachable agent.
    Succeed,
    /// Refused with this reason.
    Fail(String),
    /// Never answers until [`FakeProvider::set_create`] chooses another mode (then the
    /// waiting creates go on as that mode says).
    Hang,
}

/// One sandbox the fake holds.
struct FakeSandbox {
    identity: Identity,
    alive: bool,
    created_at_ms: i64,
    endpoint: Endpoint,
    agent: FakeAgent,
}

#[derive(Default)]
struct Memory {
    sandboxes: BTreeMap<String, FakeSandbox>,
    creates: usize,
    destroyed: Vec<String>,
    deaths: Option<mpsc::Sender<Death>>,
}

/// The in-memory provider.
pub struct FakeProvider {
    name: &'static str,
    mode: Mutex<CreateMode>,
    mode_changed: Notify,
    state: Mutex<Memory>,
    /// Signalled at every create and destroy answered.
    changed: Notify,
    /// Whether it says it enforces egress policies (`set_enforces_egress`).
    egress: std::sync::atomic::AtomicBool,
}

impl FakeProvider {
    /// A fake that serves as the provider `name` (`"process"` serves the built-in profiles).
    pub fn new(name: &'static str) -> Arc<FakeProvider> {
        Arc::new(FakeProvider {
            name,
            mode: Mutex::new(CreateMode::Succeed),
            mode_changed: Notify::new(),
            state: Default::default(),
            changed: Notify::new(),
            egress: Default::default(),
        })
    }

    /// Whether it says it enforces egress policies from now on (it keeps no network).
    pub fn set_enforces_egress(&self, yes: bool) {
        self.egress.store(yes, std::sync::atomic::Ordering::SeqCst);
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.state.locked()
    }

    /// What creates do from now on; hanging creates go on as `mode` says.
    pub fn set_create(&self, mode: CreateMode) {
        *self.mode.locked() = mode;
        self.mode_changed.notify_waiters();
    }

    /// How many creates were asked (answered or not).
    pub fn creates(&self) -> usize {
        self.state().creates
    }

    /// The ids of the sandboxes it holds.
    pub fn ids(&self) -> Vec<String> {
        self.state().sandboxes.keys().cloned().collect()
    }

    /// Whether it holds `id` and `id` is alive.
    pub fn alive(&self, id: &str) -> bool {
        self.state().sandboxes.get(id).is_some_and(|s| s.alive)
    }

    /// The ids destroyed, in order (a sandbox destroyed twice is listed twice).
    pub fn destroyed(&self) -> Vec<String> {
        self.state().destroyed.clone()
    }

    /// The sandbox dies: its agent stops answering, `inspect` says not alive, and a death
    /// is reported on the feed when one was asked for.
    pub fn kill(&self, id: &str, reason: &str) {
        let feed = {
            let mut st = self.state();
            let Some(s) = st.sandboxes.get_mut(id) else {
                return;
            };
            s.alive = false;
            s.agent.healthy.store(false, Ordering::SeqCst);
            st.deaths.clone()
        };
        if let Some(tx) = feed {
            let _ = tx.try_send(Death {
                sandbox_id: id.to_string(),
                reason: reason.to_string(),
            });
        }
    }

    /// The sandbox disappears without a trace (and without a death report).
    pub fn vanish(&self, id: &str) {
        self.state().sandboxes.remove(id);
    }

    /// Its agent stops (or resumes) answering while the sandbox stays alive.
    pub fn set_reachable(&self, id: &str, reachable: bool) {
        if let Some(s) = self.state().sandboxes.get(id) {
            s.agent.healthy.store(reachable, Ordering::SeqCst);
        }
    }

    /// What `inspect` says of it, its agent answering as before (a death the provider sees
    /// and the agent's port has not yet shown).
    pub fn set_alive(&self, id: &str, alive: bool) {
        if let Some(s) = self.state().sandboxes.get_mut(id) {
            s.alive = alive;
        }
    }

    /// Its agent takes `delay` to answer `/healthz` (a loaded host) while the sandbox stays
    /// alive.
    pub fn set_slow(&self, id: &str, delay: Duration) {
        if let Some(s) = self.state().sandboxes.get(id) {
            s.agent
                .slow_ms
                .store(delay.as_millis() as u64, Ordering::SeqCst);
        }
    }

    /// A sandbox the controller did not ask for (as another controller process, or one of
    /// this controller's creates the store lost, would leave), made `age_ms` ago.
    pub async fn plant(&self, identity: Identity, age_ms: i64) {
        let agent = FakeAgent::start().await;
        let endpoint = agent.endpoint();
        self.state().sandboxes.insert(
            identity.sandbox_id.clone(),
            FakeSandbox {
                identity,
                alive: true,
                created_at_ms: now_ms() - age_ms,
                endpoint,
                agent,
            },
        );
    }

    /// Waits until `cond` holds of the fake, re-checked at each create and destroy; false
    /// when `within` passed first.
    pub async fn wait_for(
        &self,
        within: std::time::Duration,
        cond: impl Fn(&FakeProvider) -> bool,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let changed = self.changed.notified();
            if cond(self) {
                return true;
            }
            // Creates and destroys notify; anything else the condition reads (the store)
            // is re-read at least every 20 ms.
            let step = tokio::time::Instant::now() + std::time::Duration::from_millis(20);
            if tokio::time::timeout_at(step.min(deadline), changed)
                .await
                .is_err()
                && tokio::time::Instant::now() >= deadline
            {
                return cond(self);
            }
        }
    }

    fn observe(s: &FakeSandbox) -> Observed {
        Observed {
            identity: s.identity.clone(),
            alive: s.alive,
            endpoint: Some(s.endpoint.clone()),
            created_at_ms: s.created_at_ms,
        }
    }
}

#[async_trait::async_trait]
impl Provider for FakeProvider {
    fn name(&self) -> &'static str {
        self.name
    }

    fn default_image(&self, profile: &str) -> Result<String> {
        Ok(format!("fake:{profile}"))
    }

    fn check_image(&self, _profile: &str, image_ref: &str) -> Result<()> {
        if image_ref.starts_with("fake:") {
            Ok(())
        } else {
            Err(ProviderError::Unsupported(format!(
                "the fake provider runs fake: images, not {image_ref}"
            )))
        }
    }

    fn enforces_egress(&self) -> bool {
        self.egress.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn unenforced(
        &self,
        limits: &berth_protocol::controller::Limits,
    ) -> std::collections::BTreeMap<String, String> {
        crate::limits::none_enforced(limits, "the fake provider runs no process")
    }

    async fn create(&self, spec: &Spec) -> Result<Endpoint> {
        self.state().creates += 1;
        self.changed.notify_waiters();
        loop {
            let waiting = self.mode_changed.notified();
            let mode = self.mode.locked().clone();
            match mode {
                CreateMode::Hang => waiting.await,
                CreateMode::Fail(reason) => {
                    self.changed.notify_waiters();
                    return Err(ProviderError::Failed(reason));
                }
                CreateMode::Succeed => break,
            }
        }
        let agent = FakeAgent::start().await;
        let endpoint = agent.endpoint();
        self.state().sandboxes.insert(
            spec.identity.sandbox_id.clone(),
            FakeSandbox {
                identity: spec.identity.clone(),
                alive: true,
                created_at_ms: now_ms(),
                endpoint: endpoint.clone(),
                agent,
            },
        );
        self.changed.notify_waiters();
        Ok(endpoint)
    }

    async fn inspect(&self, sandbox_id: &str) -> Result<Option<Observed>> {
        Ok(self.state().sandboxes.get(sandbox_id).map(Self::observe))
    }

    async fn list(&self, controller_id: &str) -> Result<Vec<Observed>> {
        Ok(self
            .state()
            .sandboxes
            .values()
            .filter(|s| s.identity.controller_id == controller_id)
            .map(Self::observe)
            .collect())
    }

    async fn destroy(&self, sandbox_id: &str) -> Result<()> {
        {
            let mut st = self.state();
            st.sandboxes.remove(sandbox_id);
            st.destroyed.push(sandbox_id.to_string());
        }
        self.changed.notify_waiters();
        Ok(())
    }

    fn deaths(&self, _controller_id: &str) -> Option<mpsc::Receiver<Death>> {
        let (tx, rx) = mpsc::channel(64);
        self.state().deaths = Some(tx);
        Some(rx)
    }
}

/// An agent in the test process: `/healthz` (200 while healthy, 503 otherwise, after
/// `slow_ms`) and an empty event log. Stops serving when dropped.
struct FakeAgent {
    url: String,
    healthy: Arc<AtomicBool>,
    slow_ms: Arc<AtomicU64>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeAgent {
    async fn start() -> FakeAgent {
        let healthy = Arc::new(AtomicBool::new(true));
        let slow_ms = Arc::new(AtomicU64::new(0));
        let app = axum::Router::new()
            .route(
                native::HEALTHZ,
                get({
                    let slow_ms = slow_ms.clone();
                    move |healthy: State<Arc<AtomicBool>>| healthz(healthy, slow_ms.clone())
                }),
            )
            .route(native::EVENTS, get(events))
            .with_state(healthy.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port on 127.0.0.1");
        let url = format!("http://{}", listener.local_addr().expect("its address"));
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeAgent {
            url,
            healthy,
            slow_ms,
            server,
        }
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint {
            agent_url: self.url.clone(),
            compat_url: self.url.clone(),
            cdp_url: None,
            ports: BTreeMap::new(),
        }
    }
}

async fn healthz(State(healthy): State<Arc<AtomicBool>>, slow_ms: Arc<AtomicU64>) -> StatusCode {
    let delay = slow_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    if healthy.load(Ordering::SeqCst) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn events(State(healthy): State<Arc<AtomicBool>>) -> axum::response::Response {
    use axum::response::IntoResponse;
    if !healthy.load(Ordering::SeqCst) {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    axum::Json(EventsPage {
        events: Vec::new(),
        next_seq: 0,
        truncated_before_seq: None,
    })
    .into_response()
}
