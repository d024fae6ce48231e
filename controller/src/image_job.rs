//! `POST /sandbox/sandboxes/v1/images/build`: the image builder as a controller job. The answer
//! comes at once with the `image_ref` (known before building) and a status; the job's steps are
//! kept for `GET /sandbox/sandboxes/v1/images/{image_ref}`. One job per `image_ref` at a time.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

pub use berth_protocol::controller::ImageJob;
use berth_protocol::lifecycle::ImageJobStatus;
use berth_protocol::sync::Locked;

use crate::error::{Error, Result};
use crate::image::BuildRequest;
use crate::image::byo::{self, ByoRequest, Source};
use crate::util::{now_ms, rfc3339};

/// Where builds get their inputs.
#[derive(Debug, Clone)]
pub struct ImageSettings {
    pub agent_bin: PathBuf,
    pub images_dir: PathBuf,
    pub cache_dir: PathBuf,
}

/// Image builds as jobs, one per `image_ref` at a time.
#[derive(Default)]
pub struct Images {
    pub settings: std::sync::OnceLock<ImageSettings>,
    jobs: Mutex<HashMap<String, Arc<Mutex<ImageJob>>>>,
}

impl Images {
    fn settings(&self) -> Result<ImageSettings> {
        self.settings
            .get()
            .cloned()
            .ok_or_else(|| Error::Unprocessable("this controller builds no images".into()))
    }

    pub async fn build_image(
        self: &Arc<Self>,
        profile: String,
        bundle: Option<String>,
        apps: Vec<String>,
    ) -> Result<ImageJob> {
        let settings = self.settings()?;
        let req = BuildRequest {
            profile,
            bundle,
            apps,
            agent_bin: settings.agent_bin,
            images_dir: settings.images_dir,
            cache_dir: settings.cache_dir,
        };
        let r = req.clone();
        let (image, exists) = tokio::task::spawn_blocking(move || crate::image::plan(&r))
            .await
            .map_err(|e| Error::Internal(e.to_string()))?
            .map_err(|e| Error::BadRequest(format!("{e:#}")))?;
        Ok(self.start(image, exists, move || crate::image::build(&req)))
    }

    /// A brought image: the agent put into a local image, or into a Dockerfile's.
    pub async fn build_byo(self: &Arc<Self>, source: Source) -> Result<ImageJob> {
        let req = ByoRequest {
            source,
            agent_bin: self.settings()?.agent_bin,
        };
        let r = req.clone();
        let (image, exists) = tokio::task::spawn_blocking(move || byo::plan(&r))
            .await
            .map_err(|e| Error::Internal(e.to_string()))?
            .map_err(|e| Error::BadRequest(format!("{e:#}")))?;
        Ok(self.start(image, exists, move || byo::build(&req)))
    }

    /// The job of `image` (a running one's, or a new one running `build` unless the image
    /// exists).
    fn start(
        self: &Arc<Self>,
        image: String,
        exists: bool,
        build: impl FnOnce() -> anyhow::Result<crate::image::Built> + Send + 'static,
    ) -> ImageJob {
        let mut jobs = self.jobs.locked();
        if let Some(j) = jobs.get(&image) {
            let j = j.locked().clone();
            if j.status != ImageJobStatus::Failed {
                return j;
            }
        }
        let job = Arc::new(Mutex::new(ImageJob {
            image_ref: image.clone(),
            image_uri: image.clone(),
            status: if exists {
                ImageJobStatus::Ready
            } else {
                ImageJobStatus::Building
            },
            steps: Vec::new(),
            error: None,
            started_at: rfc3339(now_ms()),
            ended_at: exists.then(|| rfc3339(now_ms())),
        }));
        jobs.insert(image.clone(), job.clone());
        drop(jobs);
        if !exists {
            let j = job.clone();
            tokio::task::spawn_blocking(move || run(&j, build));
        }
        job.locked().clone()
    }

    pub fn image_job(&self, image_ref: &str) -> Result<ImageJob> {
        let jobs = self.jobs.locked();
        jobs.get(image_ref)
            .map(|j| j.locked().clone())
            .ok_or_else(|| {
                Error::NotFound(format!("no image build of {image_ref} on this controller"))
            })
    }
}

/// Runs a job's build, its steps kept as they come.
fn run(j: &Arc<Mutex<ImageJob>>, build: impl FnOnce() -> anyhow::Result<crate::image::Built>) {
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let j2 = j.clone();
    let collector = std::thread::spawn(move || {
        for step in rx {
            j2.locked().steps.push(step);
        }
    });
    let result = crate::image::with_steps(tx, build);
    let _ = collector.join();
    let mut j = j.locked();
    j.ended_at = Some(rfc3339(now_ms()));
    match result {
        Ok(built) => {
            j.status = ImageJobStatus::Ready;
            // A re-resolved lock (or a Dockerfile's build) names the image: say which one.
            j.image_ref = built.image_ref.clone();
            j.image_uri = built.image_ref;
        }
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "image build failed");
            j.status = ImageJobStatus::Failed;
            j.error = Some(format!("{e:#}"));
        }
    }
}
