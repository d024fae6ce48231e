//! The controller's core: sandboxes from request to deletion. A create claims a warm pool
//! member when one serves it (a compare-and-swap on the stored row, then a liveness probe),
//! else creates one cold and waits, to a bounded deadline, until the agent says it is ready.

mod credentials;
pub use credentials::regrant_all as regrant_credentials;
mod destroy;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_protocol::controller::{
    Endpoints, PortPreview, RESERVED_ENDPOINT_NAMES, Sandbox, Viewer,
};
use berth_protocol::egress::Egress;
use berth_protocol::events::EventKind;
use berth_protocol::routes::controller as routes;
use serde_json::json;

use crate::ctx::Ctx;
use crate::error::{Error, Result};
use crate::lifecycle::{LeaseStatus, SandboxStatus};
use crate::provider::{Endpoint, Identity, Spec};
use crate::reconcile::Action;
use crate::store::{SandboxRow, SandboxUpdate};
use crate::timeline::Timeline;
use crate::util::{new_id, now_ms, random_hex, rfc3339};
use crate::warm::PoolTable;
pub use destroy::{Destroying, Destroys, MAX_CONCURRENT_DESTROYS};

/// How long one readiness or liveness probe of an agent may take.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// How much longer a liveness probe that timed out waits when the provider says the sandbox
/// still runs: an agent on a loaded host (forty containers starting beside it) can take more
/// than `PROBE_TIMEOUT` to answer, and a live sandbox is not discarded for being slow.
const PROBE_PATIENCE: Duration = Duration::from_secs(12);

/// Why a probe of an agent did not pass.
#[derive(Debug, Clone, PartialEq)]
enum ProbeFailure {
    /// Nothing answered within the probe's time.
    TimedOut,
    /// The agent refused, was unreachable, or answered that it is not ready (why).
    Failed(String),
}

impl std::fmt::Display for ProbeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeFailure::TimedOut => f.write_str("the readiness probe timed out"),
            ProbeFailure::Failed(why) => f.write_str(why),
        }
    }
}

/// How long the agent may take to resize its screen (`PUT /v1/display`) or say its size.
const SCREEN_TIMEOUT: Duration = Duration::from_secs(15);

/// Sandboxes from request to deletion: provisioning (a warm claim, else a cold start),
/// readiness, the screen, failure and destroy (`destroy.rs`), and their wire form.
pub struct Sandboxes {
    pub ctx: Arc<Ctx>,
    /// The warm pools a claim takes from.
    warm: Arc<PoolTable>,
    timeline: Arc<Timeline>,
    destroy_locks: crate::util::KeyedLocks,
    /// Every destroy under way (`Sandboxes::destroy`).
    pub(crate) destroys: Destroys,
}

/// What a caller asks for.
#[derive(Debug, Clone)]
pub struct Request {
    pub profile: String,
    pub image_ref: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub ttl_seconds: Option<u64>,
    /// The desktop's screen, `WxH` (checked by [`Sandboxes::check_screen`]).
    pub screen: Option<String>,
    /// Its egress policy; the config's default when none (set by [`Sandboxes::checked`]).
    pub egress: Option<Egress>,
    /// Credentials the proxy adds to its requests (given at create).
    pub credentials: Vec<berth_protocol::controller::SandboxCredential>,
    /// Its agent may ask for a person (`request_human_control`).
    pub human_control: bool,
    /// The `[[login]]` sites its run enables.
    pub logins: Vec<String>,
    /// Limits asked over its profile's and the config's (checked by [`Sandboxes::checked`]).
    pub limits: Option<berth_protocol::controller::LimitsOverride>,
}

/// The domain's request for a create body (the REST route's and the MCP tool's).
impl From<berth_protocol::controller::CreateSandbox> for Request {
    fn from(body: berth_protocol::controller::CreateSandbox) -> Request {
        Request {
            profile: body.profile,
            image_ref: body.image_ref,
            labels: body.labels,
            ttl_seconds: body.ttl_seconds,
            screen: body.screen,
            egress: body.egress,
            credentials: body.credentials,
            human_control: body.human_control.unwrap_or(false),
            logins: body.logins,
            limits: body.limits,
        }
    }
}

impl Sandboxes {
    pub fn new(ctx: Arc<Ctx>, warm: Arc<PoolTable>, timeline: Arc<Timeline>) -> Sandboxes {
        Sandboxes {
            ctx,
            warm,
            timeline,
            destroy_locks: Default::default(),
            destroys: Default::default(),
        }
    }

    /// The image a sandbox of `profile` runs: `image_ref` when its provider can run it, else
    /// the provider's default (its pool key is [`Self::warm_key`]'s to make).
    pub fn resolve(&self, profile: &str, image_ref: Option<&str>) -> Result<String> {
        let p = self.ctx.profile(profile)?;
        let profile = p.name.as_str();
        let provider = self.ctx.provider_for(p)?;
        let image = match image_ref {
            Some(i) => {
                provider.check_image(profile, i)?;
                i.to_string()
            }
            None => provider.default_image(profile)?,
        };
        Ok(image)
    }

    /// The pool that serves `profile` (an alias as its canonical name) from `image` with
    /// `egress` and the limits `asked`: the one place pool keys are made.
    pub fn warm_key(
        &self,
        profile: &str,
        image: &str,
        egress: &Egress,
        asked: Option<&berth_protocol::controller::LimitsOverride>,
    ) -> String {
        let policy = (*egress != self.ctx.config.egress.default)
            .then(|| serde_json::to_string(egress).unwrap_or_default());
        let p = self.ctx.profile(profile).ok();
        let limits = p
            .and_then(|p| crate::limits::asked_beyond(p, &self.ctx.config.limits, asked))
            .map(|l| serde_json::to_string(&l).unwrap_or_default());
        crate::warm::key(
            p.map_or(profile, |p| &p.name),
            image,
            policy.as_deref(),
            limits.as_deref(),
        )
    }

    /// A ready sandbox for `req`: a warm member when a pool serves it, else a cold create.
    /// Answers with how it was obtained (`warm` or `cold`).
    pub async fn provision(self: &Arc<Self>, req: &Request) -> Result<(SandboxRow, &'static str)> {
        let started = Instant::now();
        let (row, warm) = self.claim_or_start(req, started).await?;
        if warm {
            return Ok((row, "warm"));
        }
        let row = self.clone().await_ready(row.id.clone()).await?;
        self.ctx.metrics.claim("cold", started.elapsed());
        Ok((row, "cold"))
    }

    /// Like `provision`, but answers as soon as the sandbox exists (`starting` when cold);
    /// readiness continues in the background to the same deadline.
    pub async fn provision_nowait(self: &Arc<Self>, req: &Request) -> Result<SandboxRow> {
        let started = Instant::now();
        let (row, warm) = self.claim_or_start(req, started).await?;
        if !warm {
            let me = self.clone();
            let id = row.id.clone();
            tokio::spawn(async move {
                if me.clone().await_ready(id).await.is_ok() {
                    me.ctx.metrics.claim("cold", started.elapsed());
                }
            });
        }
        Ok(row)
    }

    /// A warm member for `req` (true, its claim timed from `started`), else a cold sandbox
    /// started for it (false), not yet ready.
    async fn claim_or_start(
        self: &Arc<Self>,
        req: &Request,
        started: Instant,
    ) -> Result<(SandboxRow, bool)> {
        validate_labels(&req.labels)?;
        self.ctx.logins.check(&req.logins)?;
        let req = &self.checked(req)?;
        let image = self.resolve(&req.profile, req.image_ref.as_deref())?;
        let egress = req.egress.clone().unwrap_or_default();
        let key = self.warm_key(&req.profile, &image, &egress, req.limits.as_ref());
        if let Some(row) = self.claim_warm(&key, req).await? {
            let row = self.keep_credentials(row, &req.credentials)?;
            self.start_run(&row, req).await?;
            self.ctx.metrics.claim("warm", started.elapsed());
            return Ok((row, true));
        }
        let row = self.start_cold(req, &image).await?;
        let row = self.keep_credentials(row, &req.credentials)?;
        self.start_run(&row, req).await?;
        Ok((row, false))
    }

    /// Starts a run on the sandbox: records whether its agent may ask for a person and which
    /// login sites the run enables (the last run's sites forgotten in its browser), and tells
    /// a running agent so (one still starting is told at readiness). The run's id.
    pub async fn start_run(&self, row: &SandboxRow, req: &Request) -> Result<String> {
        let had = crate::control::had_settings(&self.ctx, &row.id);
        if req.human_control {
            self.ctx.store.set_requests_enabled(&row.id, true)?;
        }
        let run = crate::login::start_run(&self.ctx, row, &req.logins).await?;
        if row.status == SandboxStatus::Running
            && (had || req.human_control || !req.logins.is_empty())
        {
            crate::control::claim_and_push(&self.ctx, row, had).await;
        }
        Ok(run)
    }

    /// `req` with its screen checked and written `WxH`, and its egress policy checked (the
    /// config's default when none).
    fn checked(&self, req: &Request) -> Result<Request> {
        let egress = self.check_egress(&req.profile, req.egress.as_ref())?;
        self.check_credentials(&egress, &req.credentials)?;
        if let Some(l) = &req.limits {
            l.check()
                .map_err(|why| Error::BadRequest(format!("limits: {why}")))?;
        }
        Ok(Request {
            screen: self.check_screen(&req.profile, req.screen.as_deref())?,
            egress: Some(egress),
            ..req.clone()
        })
    }

    /// The egress policy for a sandbox of `profile`: its entries well formed, and a policy
    /// other than `"open"` only where the profile's provider enforces it (400 otherwise).
    pub fn check_egress(&self, profile: &str, egress: Option<&Egress>) -> Result<Egress> {
        let policy = egress
            .cloned()
            .unwrap_or_else(|| self.ctx.config.egress.default.clone());
        berth_protocol::egress::validate(&policy).map_err(Error::BadRequest)?;
        let p = self.ctx.profile(profile)?;
        let provider = self.ctx.provider_for(p)?;
        if policy != Egress::default() && !provider.enforces_egress() {
            return Err(Error::BadRequest(format!(
                "profile {} runs on the {} provider, which cannot enforce an egress policy \
                 here: use \"egress\": \"open\", or route the profile to docker (or to \
                 kubernetes with the controller in the cluster, beside its Service)",
                p.name,
                provider.name()
            )));
        }
        Ok(policy)
    }

    /// A `screen` asked for `profile`: `WxH` within the bounds (400 otherwise), on a profile
    /// with a desktop (400 otherwise).
    pub fn check_screen(&self, profile: &str, screen: Option<&str>) -> Result<Option<String>> {
        let Some(s) = screen else { return Ok(None) };
        let (w, h) = berth_protocol::controller::parse_screen(s).map_err(Error::BadRequest)?;
        let p = self.ctx.profile(profile)?;
        if !p.desktop {
            return Err(Error::BadRequest(format!(
                "profile {} has no desktop: `screen` is for desktop profiles",
                p.name
            )));
        }
        Ok(Some(format!("{w}x{h}")))
    }

    /// Resizes a ready desktop's screen through its agent (`PUT /v1/display`) and answers the
    /// size it then reports.
    async fn resize_screen(
        &self,
        row: &SandboxRow,
        screen: &str,
    ) -> std::result::Result<String, String> {
        let (width, height) = berth_protocol::controller::parse_screen(screen)?;
        let agent = self.ctx.agent(row).map_err(|e| e.to_string())?;
        let rb = agent
            .request(
                reqwest::Method::PUT,
                berth_protocol::routes::native::DISPLAY,
            )
            .json(&berth_protocol::DisplaySize { width, height })
            .timeout(SCREEN_TIMEOUT);
        let info = display_info(rb)
            .await
            .map_err(|e| format!("resizing the screen to {screen}: {e}"))?;
        let got = format!("{}x{}", info.width, info.height);
        if got != screen {
            return Err(format!("the screen is {got} after resizing it to {screen}"));
        }
        Ok(got)
    }

    /// Once a desktop is ready: the screen it was asked to have (resized to it), or the one
    /// it started with, recorded on its row. An asked screen that cannot be had fails it.
    async fn settle_screen(&self, row: &SandboxRow) -> std::result::Result<(), String> {
        let screen = match &row.screen {
            Some(want) => self.resize_screen(row, want).await?,
            None => {
                let agent = self.ctx.agent(row).map_err(|e| e.to_string())?;
                let rb = agent
                    .request(
                        reqwest::Method::GET,
                        berth_protocol::routes::native::DISPLAY,
                    )
                    .timeout(SCREEN_TIMEOUT);
                match display_info(rb).await {
                    Ok(info) => format!("{}x{}", info.width, info.height),
                    Err(e) => {
                        // Only a record: the sandbox is no less ready without it.
                        tracing::warn!(sandbox = %row.id, error = %e, "cannot read the screen size");
                        return Ok(());
                    }
                }
            }
        };
        self.ctx
            .store
            .set_screen(&row.id, &screen)
            .map_err(|e| e.to_string())?;
        if row.screen.is_some() {
            self.ctx
                .event(&row.id, EventKind::SandboxScreen, json!({"screen": screen}));
        }
        Ok(())
    }

    /// After a resize sent to the agent through the relay (`PUT …/{id}/v1/display`): the
    /// screen the agent now has, recorded on the row (with a `sandbox.screen` event when it
    /// changed), so the record never shows a size the desktop left.
    pub async fn screen_changed(&self, id: &str) {
        let Ok(Some(row)) = self.ctx.store.sandbox(id) else {
            return;
        };
        let Ok(agent) = self.ctx.agent(&row) else {
            return;
        };
        let rb = agent
            .request(
                reqwest::Method::GET,
                berth_protocol::routes::native::DISPLAY,
            )
            .timeout(SCREEN_TIMEOUT);
        let screen = match display_info(rb).await {
            Ok(info) => format!("{}x{}", info.width, info.height),
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "cannot read the screen size after a resize");
                return;
            }
        };
        if row.screen.as_deref() == Some(screen.as_str()) {
            return;
        }
        if let Err(e) = self.ctx.store.set_screen(id, &screen) {
            tracing::warn!(sandbox = %id, error = %e, "cannot record the screen size");
            return;
        }
        self.ctx
            .event(id, EventKind::SandboxScreen, json!({"screen": screen}));
    }

    /// A warm member claimed by a create asking another screen is resized to it.
    pub(crate) async fn claim_screen(
        &self,
        row: SandboxRow,
        want: Option<&str>,
    ) -> std::result::Result<SandboxRow, String> {
        let Some(want) = want else { return Ok(row) };
        if row.screen.as_deref() == Some(want) {
            return Ok(row);
        }
        let got = self.resize_screen(&row, want).await?;
        self.ctx
            .store
            .set_screen(&row.id, &got)
            .map_err(|e| e.to_string())?;
        self.ctx
            .event(&row.id, EventKind::SandboxScreen, json!({"screen": got}));
        Ok(SandboxRow {
            screen: Some(got),
            ..row
        })
    }

    /// Takes warm members until one answers its probe; a dead one is discarded.
    async fn claim_warm(self: &Arc<Self>, key: &str, req: &Request) -> Result<Option<SandboxRow>> {
        if !self.warm.has(key) {
            return Ok(None);
        }
        let expires_at = Some(self.ctx.expiry(req.ttl_seconds));
        loop {
            let claimed = self.ctx.store.claim_warm(key, &req.labels, expires_at)?;
            // Taken or found empty: either way the pool refills.
            self.warm.claimed(key);
            let Some(row) = claimed else {
                return Ok(None);
            };
            let ready = match self.probe(&row).await {
                Ok(()) => self.claim_screen(row.clone(), req.screen.as_deref()).await,
                Err(e) => Err(e),
            };
            match ready {
                Ok(row) => {
                    self.ctx.event(
                        &row.id,
                        EventKind::SandboxClaimed,
                        json!({"claim": "warm", "pool": key}),
                    );
                    return Ok(Some(row));
                }
                Err(reason) => {
                    tracing::warn!(sandbox = %row.id, %reason, "warm member failed its probe; discarding it");
                    let _ = self.apply(
                        &row.id,
                        &Action::Fail {
                            reason: format!("warm member failed its probe at claim: {reason}"),
                            destroy: true,
                        },
                    );
                }
            }
        }
    }

    /// Records a new sandbox and asks its provider to start it; readiness is awaited
    /// separately (`await_ready`).
    pub async fn start_cold(self: &Arc<Self>, req: &Request, image: &str) -> Result<SandboxRow> {
        let row = self.insert_row(req, image, None)?;
        self.launch(&row).await
    }

    /// The new sandbox's row (`pending`), before anything starts. `pool`: the pool it joins as
    /// a warm member.
    pub fn insert_row(&self, req: &Request, image: &str, pool: Option<&str>) -> Result<SandboxRow> {
        let profile = self.ctx.profile(&req.profile)?;
        let provider = self.ctx.provider_for(profile)?;
        let now = now_ms();
        let mut limits =
            crate::limits::resolve(profile, &self.ctx.config.limits, req.limits.as_ref());
        limits.unenforced = provider.unenforced(&limits);
        let policy = match &req.egress {
            Some(e) => e.clone(),
            None => self.check_egress(&req.profile, None)?,
        };
        let row = SandboxRow {
            limits: Some(limits),
            egress: Some(berth_protocol::controller::EgressReport {
                policy,
                ..Default::default()
            }),
            id: new_id("sb"),
            profile: profile.name.clone(),
            image_ref: image.to_string(),
            provider: provider.name().to_string(),
            status: SandboxStatus::Pending,
            labels: req.labels.clone(),
            pool: pool.map(Into::into),
            claim: if pool.is_some() {
                None
            } else {
                Some("cold".into())
            },
            agent_url: None,
            agent_token: random_hex(24),
            compat_url: None,
            cdp_url: None,
            ports: Default::default(),
            created_at: now,
            ready_deadline: now + self.ctx.config.create_timeout().as_millis() as i64,
            ready_at: None,
            expires_at: if pool.is_some() {
                None
            } else {
                Some(self.ctx.expiry(req.ttl_seconds))
            },
            ended_at: None,
            error: None,
            agent_event_seq: 0,
            screen: req.screen.clone(),
        };
        self.ctx.store.insert_sandbox(&row)?;
        self.ctx.event(
            &row.id,
            EventKind::SandboxCreated,
            json!({"profile": row.profile, "image_ref": row.image_ref, "provider": row.provider,
                   "pool": pool}),
        );
        Ok(row)
    }

    /// Asks the provider to create a recorded sandbox. The provider's work runs in its own
    /// task: a caller that goes away mid-create does not leave a half-made sandbox behind (the
    /// task finishes and the row says how).
    pub async fn launch(self: &Arc<Self>, row: &SandboxRow) -> Result<SandboxRow> {
        let profile = self.ctx.profile(&row.profile)?.clone();
        let provider = self.ctx.provider_named(&row.provider)?;
        let me = self.clone();
        let spec = Spec {
            identity: Identity {
                controller_id: self.ctx.controller_id.clone(),
                sandbox_id: row.id.clone(),
                profile: row.profile.clone(),
                image_ref: row.image_ref.clone(),
            },
            desktop: profile.desktop,
            ide: profile.ide().map(|(kind, _)| kind.to_string()),
            agent_token: row.agent_token.clone(),
            browser_toolset_enable: self.ctx.config.browser_toolset_enable.clone(),
            memory_merge: self.ctx.config.memory_merge,
            limits: row.limits.clone().unwrap_or_default(),
            egress: row
                .egress
                .as_ref()
                .map(|e| e.policy.clone())
                .unwrap_or_default(),
        };
        let id = row.id.clone();
        let made = tokio::spawn(async move {
            match provider.create(&spec).await {
                Ok(ep) => {
                    me.ctx
                        .store
                        .set_status(&id, SandboxStatus::Starting, endpoint_update(&ep))?;
                    Ok(())
                }
                Err(e) => {
                    me.ctx.metrics.provider_error();
                    let reason = format!("the provider could not create it: {e}");
                    me.fail_and_destroy(&id, &reason).await;
                    Err(Error::Unavailable(reason))
                }
            }
        })
        .await
        .map_err(|e| Error::Internal(format!("create task: {e}")))?;
        made?;
        self.ctx.get_row(&row.id)
    }

    /// Waits until the sandbox is running (or failed), at most until its stored deadline.
    /// Runs in its own task so it completes even if the caller leaves.
    pub async fn await_ready(self: Arc<Self>, id: String) -> Result<SandboxRow> {
        let me = self.clone();
        tokio::spawn(async move { me.drive_ready(&id).await })
            .await
            .map_err(|e| Error::Internal(format!("readiness task: {e}")))?
    }

    async fn drive_ready(self: &Arc<Self>, id: &str) -> Result<SandboxRow> {
        let mut last = String::from("not probed yet");
        loop {
            let row = self.ctx.get_row(id)?;
            match row.status {
                SandboxStatus::Running => return Ok(row),
                SandboxStatus::Pending | SandboxStatus::Starting => {}
                other => {
                    return Err(Error::Unavailable(format!(
                        "sandbox {id} is {other}: {}",
                        row.error.unwrap_or_default()
                    )));
                }
            }
            if now_ms() >= row.ready_deadline {
                let reason = format!(
                    "not ready within {} s: {last}",
                    self.ctx.config.create_timeout_secs
                );
                self.fail_and_destroy(id, &reason).await;
                return Err(Error::Unavailable(format!("sandbox {id} failed: {reason}")));
            }
            if row.status == SandboxStatus::Starting {
                // A dead agent fails at once, not at the deadline.
                let provider = self.ctx.provider_named(&row.provider)?;
                if let Ok(Some(o)) = provider.inspect(id).await
                    && !o.alive
                {
                    let reason = format!("its agent exited while starting ({last})");
                    self.fail_and_destroy(id, &reason).await;
                    return Err(Error::Unavailable(format!("sandbox {id} failed: {reason}")));
                }
                // Never past the deadline: a probe that answers after it does not count.
                let left = Duration::from_millis((row.ready_deadline - now_ms()).max(0) as u64);
                match self
                    .probe_ready(&row, left.min(Duration::from_secs(2)))
                    .await
                {
                    Ok(()) if now_ms() > row.ready_deadline => {
                        last = "it became ready only after its deadline".into();
                    }
                    Ok(()) => {
                        self.mark_ready(&row).await?;
                        continue;
                    }
                    Err(reason) => last = reason.to_string(),
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// A sandbox whose agent answered ready: a desktop has the screen it was asked (its
    /// pool's or its create's) before it counts as ready — one path for cold creates and
    /// pools — and one that cannot take it fails. Then it is `running`.
    async fn mark_ready(self: &Arc<Self>, row: &SandboxRow) -> Result<()> {
        let id = row.id.as_str();
        if self
            .ctx
            .catalog
            .profile(&row.profile)
            .is_some_and(|p| p.desktop)
            && let Err(reason) = self.settle_screen(row).await
        {
            self.fail_and_destroy(id, &reason).await;
            return Err(Error::Unavailable(format!("sandbox {id} failed: {reason}")));
        }
        crate::control::claim_and_push(&self.ctx, row, false).await;
        let now = now_ms();
        // Its TTL counts from now: the time it took to start is not taken from it.
        if let Some(expires_at) = row.expires_at {
            self.ctx
                .store
                .set_expiry(id, Some(expires_at + (now - row.created_at).max(0)))?;
        }
        self.ctx.store.set_status(
            id,
            SandboxStatus::Running,
            SandboxUpdate {
                ready_at: Some(now),
                ..Default::default()
            },
        )?;
        self.ctx.event(
            id,
            EventKind::SandboxReady,
            json!({"after_ms": now - row.created_at}),
        );
        if let Some(pool) = &row.pool {
            self.warm.member_ready(pool);
        }
        Ok(())
    }

    /// Readiness as the profile defines it: the agent's strict `/v1/ready` for desktops,
    /// `/healthz` otherwise. `wait`: how long the agent may hold the request.
    async fn probe_ready(
        &self,
        row: &SandboxRow,
        wait: Duration,
    ) -> std::result::Result<(), ProbeFailure> {
        let agent = self
            .ctx
            .agent(row)
            .map_err(|e| ProbeFailure::Failed(e.to_string()))?;
        let desktop = self
            .ctx
            .catalog
            .profile(&row.profile)
            .is_some_and(|p| p.desktop);
        let fut = async {
            if desktop {
                let report = agent.ready(wait).await.map_err(|e| match e {
                    berth_protocol::ClientError::Transport(e) => format!("agent unreachable: {e}"),
                    e => format!("readiness: {e}"),
                })?;
                if report.ready {
                    return Ok(());
                }
                let failing: Vec<String> = report
                    .components
                    .iter()
                    .filter(|(_, c)| !c.ok)
                    .map(|(k, c)| format!("{k}: {}", c.reason))
                    .collect();
                Err(format!("desktop not ready ({})", failing.join("; ")))
            } else {
                agent
                    .healthz()
                    .await
                    .map_err(|e| format!("agent unreachable: {e}"))
            }
        };
        match tokio::time::timeout(wait + PROBE_TIMEOUT, fut).await {
            Ok(answer) => answer.map_err(ProbeFailure::Failed),
            Err(_) => Err(ProbeFailure::TimedOut),
        }
    }

    /// A liveness/readiness probe before handing out (or adopting) a sandbox. An agent that
    /// refuses or says it is not ready fails at once; one that is only slow, in a sandbox its
    /// provider says still runs, gets `PROBE_PATIENCE` more before it counts as dead.
    pub async fn probe(&self, row: &SandboxRow) -> std::result::Result<(), String> {
        match self.probe_ready(row, Duration::ZERO).await {
            Err(ProbeFailure::TimedOut) if self.still_runs(row).await => {
                tracing::info!(sandbox = %row.id, "its agent is slow to answer; waiting longer");
                self.probe_ready(row, PROBE_PATIENCE)
                    .await
                    .map_err(|e| match e {
                        ProbeFailure::TimedOut => format!(
                            "the probe timed out ({} s, and {} s more while its provider said it runs)",
                            PROBE_TIMEOUT.as_secs(),
                            PROBE_PATIENCE.as_secs()
                        ),
                        e => e.to_string(),
                    })
            }
            answer => answer.map_err(|e| e.to_string()),
        }
    }

    /// Whether the sandbox's provider sees it running (`false` when it cannot say).
    async fn still_runs(&self, row: &SandboxRow) -> bool {
        let Ok(provider) = self.ctx.provider_named(&row.provider) else {
            return false;
        };
        matches!(
            tokio::time::timeout(PROBE_TIMEOUT, provider.inspect(&row.id)).await,
            Ok(Ok(Some(o))) if o.alive
        )
    }

    pub fn fail(&self, id: &str, reason: &str) {
        let changed = self
            .ctx
            .store
            .set_status(
                id,
                SandboxStatus::Failed,
                SandboxUpdate {
                    error: Some(reason),
                    ended_at: Some(now_ms()),
                    ..Default::default()
                },
            )
            .unwrap_or(false);
        if changed {
            tracing::warn!(sandbox = id, reason, "sandbox failed");
            self.ctx
                .event(id, EventKind::SandboxFailed, json!({"reason": reason}));
        }
    }

    /// Fails a sandbox and waits until it is destroyed.
    pub(crate) async fn fail_and_destroy(self: &Arc<Self>, id: &str, reason: &str) {
        let action = Action::Fail {
            reason: reason.to_string(),
            destroy: true,
        };
        if let Some(d) = self.apply(id, &action) {
            d.await;
        }
    }

    /// Stops and removes a sandbox; the row ends `stopped` (or keeps `failed` with its
    /// reason). Only [`Sandboxes::destroy`]'s tracked task calls it. Safe to call twice and
    /// concurrently.
    pub(crate) async fn destroy_now(self: &Arc<Self>, id: &str) {
        let lock = self.destroy_locks.get(id);
        let _one_at_a_time = lock.lock().await;
        let Ok(Some(row)) = self.ctx.store.sandbox(id) else {
            return;
        };
        if row.status == SandboxStatus::Stopped {
            return;
        }
        if row.status != SandboxStatus::Failed {
            let _ =
                self.ctx
                    .store
                    .set_status(id, SandboxStatus::Stopping, SandboxUpdate::default());
        }
        // Its work (recordings, …) is kept before it goes, within a bound.
        if matches!(row.status, SandboxStatus::Running | SandboxStatus::Stopping)
            && row.agent_url.is_some()
        {
            self.ctx.keep_work(&row).await;
        }
        // The last words of its agent go into the timeline before it goes.
        if row.agent_url.is_some() {
            let _ = tokio::time::timeout(
                Duration::from_secs(3),
                self.timeline.import_agent_events(&row),
            )
            .await;
        }
        let provider = match self.ctx.provider_named(&row.provider) {
            Ok(p) => p,
            Err(_) => return,
        };
        match provider.destroy(id).await {
            Ok(()) => {
                // A failed sandbox keeps its status and reason (the table refuses the move).
                let _ = self.ctx.store.set_status(
                    id,
                    SandboxStatus::Stopped,
                    SandboxUpdate {
                        ended_at: Some(now_ms()),
                        ..Default::default()
                    },
                );
                if row.status != SandboxStatus::Failed {
                    self.ctx.event(id, EventKind::SandboxDeleted, json!({}));
                }
            }
            Err(e) => {
                self.ctx.metrics.provider_error();
                tracing::error!(sandbox = id, error = %e, "destroy failed; the sweep retries");
            }
        }
    }

    /// `DELETE`: destroys in its own task (a caller that leaves does not stop it halfway).
    pub async fn delete(self: &Arc<Self>, id: &str) -> Result<()> {
        let row = self.ctx.visible_row(id)?;
        if let Some(lease) = self.ctx.store.lease_for_sandbox(id)? {
            self.ctx.store.end_lease(&lease.id, LeaseStatus::Released)?;
            self.ctx.event(
                id,
                EventKind::LeaseReleased,
                json!({"lease_id": lease.id, "reason": "sandbox deleted"}),
            );
        }
        if row.status == SandboxStatus::Stopped {
            return Ok(());
        }
        self.destroy(id).await;
        Ok(())
    }

    /// Its viewer: the browser IDE the agent serves, through the preview route; noVNC on a
    /// desktop; `none` otherwise.
    fn viewer(&self, row: &SandboxRow, profile: Option<&crate::catalog::Profile>) -> Viewer {
        let url = |template: &str, args: &[&str]| {
            format!(
                "{}{}",
                self.ctx.public_url,
                berth_protocol::routes::fill(template, args)
            )
        };
        let desktop = profile.is_some_and(|p| p.desktop);
        match profile.and_then(|p| p.ide()) {
            // A browser IDE the agent serves on its port, through the preview route.
            Some((kind, port)) => Viewer {
                kind: kind.into(),
                url: Some(url(
                    routes::SANDBOX_PORT_ROOT,
                    &[&row.id, &port.to_string()],
                )),
            },
            // noVNC on a desktop; `none` for a profile without either.
            None => Viewer {
                kind: match profile {
                    Some(p) if p.desktop => p.viewer.as_str(),
                    _ => "none",
                }
                .into(),
                url: desktop.then(|| url(routes::VNC_INDEX, &[&row.id])),
            },
        }
    }

    /// The wire form.
    pub fn to_wire(&self, row: &SandboxRow) -> Sandbox {
        let profile = self.ctx.catalog.profile(&row.profile);
        let lease_id = self
            .ctx
            .store
            .lease_for_sandbox(&row.id)
            .ok()
            .flatten()
            .map(|l| l.id);
        let url = |template: &str, args: &[&str]| {
            format!(
                "{}{}",
                self.ctx.public_url,
                berth_protocol::routes::fill(template, args)
            )
        };
        // Each declared port the catalog knows the number of, through the preview route.
        let preview = row
            .ports
            .keys()
            .filter_map(|name| {
                let port = self.ctx.catalog.declared_port(name)?;
                let preview_url = url(routes::SANDBOX_PORT_ROOT, &[&row.id, &port.to_string()]);
                Some((
                    name.clone(),
                    PortPreview {
                        port,
                        url: preview_url,
                    },
                ))
            })
            .collect();
        Sandbox {
            id: row.id.clone(),
            // An older row may carry an alias: the canonical name is reported.
            profile: self.ctx.catalog.canonical(&row.profile).to_string(),
            status: row.status,
            viewer: self.viewer(row, profile),
            endpoints: Endpoints {
                compat: row.compat_url.clone(),
                cdp: row.cdp_url.clone(),
                preview,
                // An image label naming a port like a field of `endpoints` cannot shadow it.
                ports: row
                    .ports
                    .iter()
                    .filter(|(name, _)| !RESERVED_ENDPOINT_NAMES.contains(&name.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            },
            labels: row.labels.clone(),
            image_ref: row.image_ref.clone(),
            created_at: rfc3339(row.created_at),
            ready_at: row.ready_at.map(rfc3339),
            expires_at: row.expires_at.map(rfc3339),
            error: row.error.clone(),
            claim: row.claim.clone(),
            lease_id,
            screen: row.screen.clone(),
            limits: row.limits.clone(),
            egress: row.egress.clone(),
        }
    }

    /// Sandboxes callers own, filtered by labels (all must match) and status.
    pub fn list(
        &self,
        labels: &[(String, String)],
        status: Option<SandboxStatus>,
    ) -> Result<Vec<Sandbox>> {
        let rows = self.ctx.store.sandboxes(&[])?;
        Ok(rows
            .iter()
            .filter(|r| r.pool.is_none())
            .filter(|r| match status {
                Some(s) => r.status == s,
                None => r.status != SandboxStatus::Stopped,
            })
            .filter(|r| labels.iter().all(|(k, v)| r.labels.get(k) == Some(v)))
            .map(|r| self.to_wire(r))
            .collect())
    }
}

/// What a status change records of the endpoint a provider reports.
fn endpoint_update(ep: &Endpoint) -> SandboxUpdate<'_> {
    SandboxUpdate {
        agent_url: Some(&ep.agent_url),
        compat_url: Some(&ep.compat_url),
        cdp_url: ep.cdp_url.as_deref(),
        ports: Some(&ep.ports),
        ..Default::default()
    }
}

/// The agent's `DisplayInfo` answer to `rb`, or why there is none.
async fn display_info(
    rb: reqwest::RequestBuilder,
) -> std::result::Result<berth_protocol::DisplayInfo, String> {
    let resp = rb
        .send()
        .await
        .map_err(|e| format!("agent unreachable: {e}"))?;
    let resp = berth_protocol::client::check(resp)
        .await
        .map_err(|e| e.to_string())?;
    resp.json()
        .await
        .map_err(|e| format!("the agent's display answer: {e}"))
}

pub fn validate_labels(labels: &BTreeMap<String, String>) -> Result<()> {
    if labels.len() > 64 {
        return Err(Error::BadRequest("at most 64 labels".into()));
    }
    for (k, v) in labels {
        if k.is_empty() || k.len() > 128 || v.len() > 1024 || k.contains('=') {
            return Err(Error::BadRequest(format!(
                "label {k:?}: keys are 1-128 characters without '=', values at most 1024"
            )));
        }
    }
    Ok(())
}
