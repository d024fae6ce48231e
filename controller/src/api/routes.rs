//! The JSON routes: sandboxes, runs, leases, catalog, pools, health and metrics.

use axum::extract::{Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use berth_protocol::controller::{
    AcquireLease, AdjustPool, BuildImage, BuildKind, CatalogList, CreateQuery, CreateSandbox,
    PoolList, RenewLease, RunRequest, SandboxList, ViewerUrl,
};
use serde::Deserialize;
use serde_json::json;

use berth_protocol::ops::{Routes, controller as op};

use super::ApiState;
use crate::error::Error;
use crate::http::{ApiError, Json, Query};
use crate::sandbox::Request;

type Result<T> = std::result::Result<T, ApiError>;

pub fn open() -> Routes<ApiState> {
    Routes::new()
        .bind(&op::HEALTHZ, || async { axum::Json(json!({"ok": true})) })
        .bind(&op::METRICS, metrics)
        .bind(&op::OPENAPI, || async {
            (
                [(header::CONTENT_TYPE, "application/json")],
                berth_protocol::openapi::controller_json(),
            )
        })
}

pub fn keyed() -> Routes<ApiState> {
    Routes::new()
        .bind(&op::SANDBOX_CREATE, create)
        .bind(&op::SANDBOX_LIST, list)
        .bind(&op::SANDBOX_GET, show)
        .bind(&op::SANDBOX_DELETE, delete)
        .bind(&op::SANDBOX_VIEWER, viewer)
        .bind(&op::SANDBOX_EXEC, exec)
        .bind(&op::RUN_GET, run)
        .bind(&op::RUN_OUTPUT, run_output)
        .bind(&op::SANDBOX_EVENTS, events)
        .bind(&op::LEASE_ACQUIRE, acquire)
        .bind(&op::LEASE_RENEW, renew)
        .bind(&op::LEASE_RELEASE, release)
        .bind(&op::IMAGE_BUILD, build_image)
        .bind(&op::IMAGE_JOB, image_job)
        .bind(&op::CATALOG, catalog)
        .bind(&op::POOLS, pools)
        .bind(&op::POOL_ADJUST, adjust_pool)
        .bind(&op::SANDBOX_ARTIFACT_PUBLISH, publish_artifact)
        .bind(&op::SANDBOX_ARTIFACT_LIST, sandbox_artifacts)
        .bind(&op::ARTIFACT_LIST, list_artifacts)
        .bind(&op::SANDBOX_EPISODE, episode)
        .bind(&op::GITHUB_REPOSITORIES, github_repositories)
        .bind(&op::SANDBOX_GITHUB_CLONE, github_clone)
        .bind(&op::SANDBOX_GITHUB_PULLS, github_pulls)
        .bind(&op::SANDBOX_GITHUB_PULL, github_pull)
        .bind(&op::SANDBOX_GITHUB_ISSUES, github_issues)
        .bind(&op::SANDBOX_GITHUB_ISSUE, github_issue)
        .bind(&op::SANDBOX_LOGIN_SITES, login_sites)
        .bind(&op::SANDBOX_LOGIN, login)
        .bind(&op::ARTIFACT_GET, get_artifact)
        .bind(&op::ARTIFACT_DELETE, delete_artifact)
        .merge(super::proxy::keyed_proxies())
}

async fn metrics(State(s): State<ApiState>) -> Response {
    let by_state = s.c.ctx.store.count_by_status().unwrap_or_default();
    let pools: Vec<_> =
        s.c.pools
            .pool_status()
            .into_iter()
            .map(|p| (p.pool, p.size, p.ready, p.starting, p.failing.is_some()))
            .collect();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.c.ctx.metrics.render(&by_state, &pools),
    )
        .into_response()
}

async fn create(
    State(s): State<ApiState>,
    Query(q): Query<CreateQuery>,
    Json(body): Json<CreateSandbox>,
) -> Result<Response> {
    let req = Request::from(body);
    let row = match q.wait.unwrap_or(true) {
        true => s.c.sandboxes.provision(&req).await?.0,
        false => s.c.sandboxes.provision_nowait(&req).await?,
    };
    Ok((StatusCode::CREATED, s.c.sandboxes.to_wire(&row).into_json()).into_response())
}

trait IntoJson {
    fn into_json(self) -> axum::Json<serde_json::Value>;
}

impl<T: serde::Serialize> IntoJson for T {
    fn into_json(self) -> axum::Json<serde_json::Value> {
        axum::Json(serde_json::to_value(self).unwrap_or_default())
    }
}

async fn list(State(s): State<ApiState>, RawQuery(q): RawQuery) -> Result<Response> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(q.as_deref().unwrap_or(""))
        .map_err(|e| Error::BadRequest(format!("query: {e}")))?;
    let mut labels = Vec::new();
    let mut status = None;
    for (k, v) in pairs {
        match k.as_str() {
            "label" => {
                let (lk, lv) = v.split_once('=').ok_or_else(|| {
                    Error::BadRequest(format!("label filter {v:?}: use label=key=value"))
                })?;
                labels.push((lk.to_string(), lv.to_string()));
            }
            "status" => {
                let all = crate::lifecycle::SandboxStatus::ALL;
                status = Some(v.parse().map_err(|_| {
                    let names: Vec<&str> = all.iter().map(|s| s.as_str()).collect();
                    Error::BadRequest(format!("status {v:?}: use one of {}", names.join(", ")))
                })?);
            }
            other => {
                return Err(Error::BadRequest(format!("unknown query parameter {other:?}")).into());
            }
        }
    }
    let sandboxes = s.c.sandboxes.list(&labels, status)?;
    Ok(SandboxList { sandboxes }.into_json().into_response())
}

async fn show(State(s): State<ApiState>, Path(id): Path<String>) -> Result<Response> {
    let row = s.c.ctx.visible_row(&id)?;
    Ok(s.c.sandboxes.to_wire(&row).into_json().into_response())
}

async fn delete(State(s): State<ApiState>, Path(id): Path<String>) -> Result<Response> {
    s.c.sandboxes.delete(&id).await?;
    let row = s.c.ctx.get_row(&id)?;
    Ok(s.c.sandboxes.to_wire(&row).into_json().into_response())
}

async fn viewer(State(s): State<ApiState>, Path(id): Path<String>) -> Result<Response> {
    let url = s.c.viewers.mint_viewer_url(&id)?;
    Ok(ViewerUrl { url }.into_json().into_response())
}

async fn exec(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    Json(body): Json<RunRequest>,
) -> Result<Response> {
    let run = s.c.runs.exec(&id, body).await?;
    Ok(run.into_json().into_response())
}

async fn github_repositories(State(s): State<ApiState>) -> Result<Response> {
    Ok(axum::Json(s.c.github()?.repositories().await?).into_response())
}

async fn github_clone(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    Json(body): Json<berth_protocol::controller::GithubClone>,
) -> Result<Response> {
    let github = s.c.github()?.clone();
    let c = s.c.clone();
    // Its own task: a client that leaves does not stop a clone halfway.
    let cloned =
        tokio::spawn(async move { github.clone_repository(&c.ctx, &c.runs, &id, body).await })
            .await
            .map_err(|e| Error::Internal(format!("the clone's task: {e}")))??;
    Ok(axum::Json(cloned).into_response())
}

async fn github_pulls(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    Query(q): Query<berth_protocol::controller::GithubListQuery>,
) -> Result<Response> {
    Ok(axum::Json(s.c.github()?.pulls(&s.c.ctx, &id, &q).await?).into_response())
}

async fn github_issues(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    Query(q): Query<berth_protocol::controller::GithubListQuery>,
) -> Result<Response> {
    Ok(axum::Json(s.c.github()?.issues(&s.c.ctx, &id, &q).await?).into_response())
}

/// A pull request's or issue's number from its path.
fn number(n: &str) -> std::result::Result<u64, Error> {
    n.parse::<u64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| Error::BadRequest(format!("{n:?} is not a pull request or issue number")))
}

async fn github_pull(
    State(s): State<ApiState>,
    Path((id, n)): Path<(String, String)>,
    Query(q): Query<berth_protocol::controller::GithubItemQuery>,
) -> Result<Response> {
    let n = number(&n)?;
    let pull =
        s.c.github()?
            .pull(&s.c.ctx, &s.c.artifacts, &id, &q.repository, n)
            .await?;
    Ok(axum::Json(pull).into_response())
}

async fn github_issue(
    State(s): State<ApiState>,
    Path((id, n)): Path<(String, String)>,
    Query(q): Query<berth_protocol::controller::GithubItemQuery>,
) -> Result<Response> {
    let n = number(&n)?;
    let issue =
        s.c.github()?
            .issue(&s.c.ctx, &s.c.artifacts, &id, &q.repository, n)
            .await?;
    Ok(axum::Json(issue).into_response())
}

async fn login_sites(State(s): State<ApiState>, Path(id): Path<String>) -> Result<Response> {
    Ok(axum::Json(crate::login::sites(&s.c.ctx, &id)?).into_response())
}

async fn login(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    Json(body): Json<berth_protocol::login::LoginRequest>,
) -> Result<Response> {
    let c = s.c.clone();
    // Its own task: a client that leaves does not stop a login halfway (its use is counted).
    let answer = tokio::spawn(async move { crate::login::login(&c.ctx, &id, &body.site).await })
        .await
        .map_err(|e| Error::Internal(format!("the login's task: {e}")))??;
    Ok(axum::Json(answer).into_response())
}

async fn run(
    State(s): State<ApiState>,
    Path((id, run_id)): Path<(String, String)>,
) -> Result<Response> {
    Ok(s.c.runs.run(&id, &run_id)?.into_json().into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FromSeq {
    #[serde(default)]
    from_seq: u64,
    limit: Option<usize>,
}

async fn run_output(
    State(s): State<ApiState>,
    Path((id, run_id)): Path<(String, String)>,
    Query(q): Query<FromSeq>,
) -> Result<Response> {
    Ok(axum::Json(s.c.runs.run_output(&id, &run_id, q.from_seq).await?).into_response())
}

async fn events(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    Query(q): Query<FromSeq>,
) -> Result<Response> {
    let page =
        s.c.timeline
            .timeline(&id, q.from_seq, q.limit.unwrap_or(1000))
            .await?;
    Ok(axum::Json(page).into_response())
}

async fn acquire(State(s): State<ApiState>, Json(body): Json<AcquireLease>) -> Result<Response> {
    Ok(s.c.leases.acquire(&body).await?.into_json().into_response())
}

async fn renew(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    Json(body): Json<RenewLease>,
) -> Result<Response> {
    Ok(s.c
        .leases
        .renew(&id, body.ttl_seconds)
        .await?
        .into_json()
        .into_response())
}

async fn release(State(s): State<ApiState>, Path(id): Path<String>) -> Result<Response> {
    s.c.leases.release(&id, "released by its holder").await?;
    Ok(axum::Json(json!({"lease_id": id, "released": true})).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KindQuery {
    kind: Option<String>,
}

async fn catalog(State(s): State<ApiState>, Query(q): Query<KindQuery>) -> Result<Response> {
    let kind = q.kind.unwrap_or_else(|| "profile".into());
    let mut items = s.c.ctx.catalog.list(&kind).ok_or_else(|| {
        Error::BadRequest(format!(
            "kind {kind:?}: use profile, desktop_app or desktop_app_bundle"
        ))
    })?;
    if kind == "profile" {
        // The provider serving each profile here (the config's choice, else the hint).
        for (item, p) in items.iter_mut().zip(&s.c.ctx.catalog.profiles) {
            item["driver_hint"] = s.c.ctx.provider_name_for(p).into();
        }
    }
    Ok(CatalogList { kind, items }.into_json().into_response())
}

async fn pools(State(s): State<ApiState>) -> Response {
    axum::Json(PoolList {
        pools: s.c.pools.pool_status(),
    })
    .into_response()
}

async fn adjust_pool(
    State(s): State<ApiState>,
    Path(profile): Path<String>,
    Json(body): Json<AdjustPool>,
) -> Result<Response> {
    if body.size.is_some_and(|n| n > 1000) {
        return Err(Error::BadRequest("a pool holds at most 1000 members".into()).into());
    }
    if !s
        .c
        .pools
        .adjust(s.c.ctx.catalog.canonical(&profile), body.paused, body.size)
    {
        return Err(Error::NotFound(format!("no pool serves profile {profile:?}")).into());
    }
    Ok(axum::Json(PoolList {
        pools: s.c.pools.pool_status(),
    })
    .into_response())
}

async fn build_image(State(s): State<ApiState>, Json(body): Json<BuildImage>) -> Result<Response> {
    use crate::image::byo::Source;
    let images = &s.c.images;
    let source = match body.kind().map_err(Error::BadRequest)? {
        BuildKind::Recipe => None,
        BuildKind::From(f) => Some(Source::Image(f.to_string())),
        BuildKind::Dockerfile(d) => Some(Source::Dockerfile(d.into())),
    };
    let job = match source {
        Some(source) => images.build_byo(source).await?,
        None => {
            images
                .build_image(body.profile, body.bundle, body.apps)
                .await?
        }
    };
    let status = match job.status.as_str() {
        "building" => StatusCode::ACCEPTED,
        _ => StatusCode::OK,
    };
    Ok((status, job.into_json()).into_response())
}

async fn image_job(State(s): State<ApiState>, Path(image_ref): Path<String>) -> Result<Response> {
    Ok(s.c
        .images
        .image_job(&image_ref)?
        .into_json()
        .into_response())
}

async fn publish_artifact(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    Json(body): Json<berth_protocol::controller::PublishArtifact>,
) -> Result<Response> {
    let a = s.c.artifacts.publish_path(&id, body).await?;
    Ok((StatusCode::CREATED, a.to_wire().into_json()).into_response())
}

fn artifact_list(rows: Vec<crate::store::ArtifactRow>) -> Response {
    berth_protocol::controller::ArtifactList {
        artifacts: rows.iter().map(|a| a.to_wire()).collect(),
    }
    .into_json()
    .into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ArtifactQuery {
    sandbox: Option<String>,
    run: Option<String>,
}

async fn list_artifacts(
    State(s): State<ApiState>,
    Query(q): Query<ArtifactQuery>,
) -> Result<Response> {
    let rows =
        s.c.artifacts
            .artifacts(q.sandbox.as_deref(), q.run.as_deref())?;
    Ok(artifact_list(rows))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunFilter {
    run: Option<String>,
}

/// `GET …/{id}/artifacts`: the sandbox's artifacts (also after it was deleted).
async fn sandbox_artifacts(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    Query(q): Query<RunFilter>,
) -> Result<Response> {
    s.c.ctx.visible_row(&id)?;
    let rows = s.c.artifacts.artifacts(Some(&id), q.run.as_deref())?;
    Ok(artifact_list(rows))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EpisodeQuery {
    recording: Option<String>,
    format: Option<String>,
}

/// `GET …/{id}/episode`: the episode bundle (zip), kept as an artifact (`X-Artifact-Id`).
async fn episode(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    Query(q): Query<EpisodeQuery>,
    headers: axum::http::HeaderMap,
) -> Result<Response> {
    let format = match q.format.as_deref() {
        Some(f) => f.parse()?,
        None => Default::default(),
    };
    Ok(s.c
        .episodes
        .episode_response(&id, q.recording.as_deref(), format, &headers)
        .await?)
}

async fn get_artifact(
    State(s): State<ApiState>,
    Path(id): Path<String>,
    headers: axum::http::HeaderMap,
) -> Result<Response> {
    Ok(s.c.artifacts.artifact_response(&id, &headers).await?)
}

async fn delete_artifact(State(s): State<ApiState>, Path(id): Path<String>) -> Result<Response> {
    let a = s.c.artifacts.delete_artifact(&id, "deleted").await?;
    Ok(a.to_wire().into_json().into_response())
}
