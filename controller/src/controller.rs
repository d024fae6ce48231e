//! The controller: its domains, wired. Each owns its table, its events and its decisions and
//! depends only on those below it — the shared context, then sandboxes (with the warm pools'
//! table and the timeline), then pools, leases and artifacts, then runs and episodes, the
//! follower of agent events, and on top the reconciler. This type holds them and decides
//! nothing.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Weak};

use crate::artifact::Artifacts;
use crate::ctx::{Ctx, Follow, KeepWork};
use crate::episode::Episodes;
use crate::error::Result;
use crate::follow::Follower;
use crate::image_job::Images;
use crate::lease::Leases;
use crate::pool::Pools;
use crate::provider::Provider;
use crate::recovery::Reconciler;
use crate::run::Runs;
use crate::sandbox::Sandboxes;
use crate::session::Sessions;
use crate::timeline::Timeline;
use crate::viewer::Viewers;
use crate::warm::PoolTable;
use crate::{config::Config, store::Store};

pub struct Controller {
    pub ctx: Arc<Ctx>,
    pub timeline: Arc<Timeline>,
    pub sandboxes: Arc<Sandboxes>,
    pub pools: Arc<Pools>,
    pub leases: Arc<Leases>,
    pub artifacts: Arc<Artifacts>,
    pub runs: Arc<Runs>,
    pub episodes: Arc<Episodes>,
    pub follower: Arc<Follower>,
    pub images: Arc<Images>,
    pub viewers: Arc<Viewers>,
    pub sessions: Arc<Sessions>,
    pub reconciler: Arc<Reconciler>,
    pub workpieces: Arc<crate::workpiece::Workpieces>,
    /// The session view's browser, diff, agents and workspace panes.
    pub panes: Arc<crate::panes::Panes>,
    /// The control leases of people taking the controls.
    pub controls: Arc<crate::control::Controls>,
    /// The GitHub tools, when `[egress.github]` is configured (set once at start).
    pub github: std::sync::OnceLock<Arc<crate::github::Github>>,
}

impl Controller {
    /// The GitHub tools, or 404 naming the config they need.
    pub fn github(&self) -> crate::error::Result<&Arc<crate::github::Github>> {
        self.github.get().ok_or_else(|| {
            crate::error::Error::NotFound(
                "no GitHub tools here: the controller's config has no [egress.github]".into(),
            )
        })
    }

    pub fn new(
        config: Config,
        store: Store,
        data_dir: PathBuf,
        public_url: String,
        providers: BTreeMap<String, Arc<dyn Provider>>,
    ) -> Result<Arc<Controller>> {
        let warm = Arc::new(PoolTable::new(&config.pools));
        let ctx = Arc::new(Ctx::new(config, store, data_dir, public_url, providers)?);
        let timeline = Arc::new(Timeline::new(ctx.clone()));
        let sandboxes = Arc::new(Sandboxes::new(ctx.clone(), warm.clone(), timeline.clone()));
        let pools = Arc::new(Pools::new(ctx.clone(), sandboxes.clone(), warm));
        let leases = Arc::new(Leases::new(ctx.clone(), sandboxes.clone()));
        let artifacts = Arc::new(Artifacts::open_local(
            ctx.clone(),
            &ctx.data_dir.join("artifacts"),
        )?);
        let runs = Arc::new(Runs::new(ctx.clone(), artifacts.clone()));
        let workpieces = Arc::new(crate::workpiece::Workpieces::new(
            ctx.clone(),
            artifacts.clone(),
        ));
        let panes = Arc::new(crate::panes::Panes::new(ctx.clone(), artifacts.clone()));
        let episodes = Arc::new(Episodes::new(
            ctx.clone(),
            artifacts.clone(),
            timeline.clone(),
            workpieces.clone(),
            panes.clone(),
        ));
        let follower = Arc::new(Follower::new(
            ctx.clone(),
            sandboxes.clone(),
            runs.clone(),
            artifacts.clone(),
        ));
        ctx.hooks
            .set_follow(Arc::downgrade(&follower) as Weak<dyn Follow>);
        ctx.hooks
            .set_keep_work(Arc::downgrade(&episodes) as Weak<dyn KeepWork>);
        let reconciler = Arc::new(Reconciler {
            ctx: ctx.clone(),
            sandboxes: sandboxes.clone(),
            leases: leases.clone(),
            runs: runs.clone(),
            artifacts: artifacts.clone(),
            timeline: timeline.clone(),
            follower: follower.clone(),
            workpieces: workpieces.clone(),
        });
        Ok(Arc::new(Controller {
            viewers: Arc::new(Viewers::new(ctx.clone())),
            sessions: Arc::new(Sessions::new(ctx.clone())),
            controls: Arc::new(crate::control::Controls::new(ctx.clone())),
            panes,
            images: Arc::default(),
            ctx,
            timeline,
            sandboxes,
            pools,
            leases,
            artifacts,
            runs,
            episodes,
            follower,
            reconciler,
            workpieces,
            github: std::sync::OnceLock::new(),
        }))
    }
}

/// A controller on the store in `dir` whose only provider is `fake` (named `"process"` it
/// serves the built-in profiles). Controllers made on the same `dir` share their store, as a
/// restarted controller does.
#[cfg(test)]
pub fn controller_on(
    dir: &std::path::Path,
    fake: &Arc<crate::provider::fake::FakeProvider>,
    config: crate::config::Config,
) -> Arc<Controller> {
    let store = crate::store::Store::open(&dir.join("berth.db"), crate::seal::Sealer::new([7; 32]))
        .expect("the store");
    let providers = BTreeMap::from([(fake.name().to_string(), fake.clone() as Arc<dyn Provider>)]);
    Controller::new(
        config,
        store,
        dir.to_path_buf(),
        "http://127.0.0.1:9".into(),
        providers,
    )
    .expect("the controller")
}
