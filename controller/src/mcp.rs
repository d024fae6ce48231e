//! The controller's own MCP server (`ANY /mcp`, Streamable HTTP, the API key): tools that
//! create, list, show and delete sandboxes and acquire and release leases, calling the same
//! domain code as the REST routes. A sandbox's answer carries its own MCP URL
//! (`…/sandbox/sandboxes/v1/{id}/mcp`, the agent's server relayed), so an engine opens a second
//! session there for the desktop tools.
//!
//! - Answers are the REST bodies as `structured_content`, with the same JSON as text content.
//! - A domain error is a tool error (`is_error`) whose content is the REST error body
//!   (`{"error": {"code", "message"}}`); arguments that do not parse are a tool error too
//!   (rmcp's, its text naming the field).
//! - Sessions (clients before protocol 2026-07-28, which are served statefully) are bounded
//!   ([`MAX_SESSIONS`]; an `initialize` past it is answered 503) and end after [`SESSION_IDLE`]
//!   without a message.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::Method;
use axum::response::IntoResponse;
use berth_protocol::controller::{AcquireLease, CreateSandbox, Lease, Sandbox};
use berth_protocol::ops::Routes;
use berth_protocol::routes::{controller as route, fill};
use futures_util::Stream;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResponse, CallToolResult, ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError, SessionConfig,
};
use rmcp::transport::streamable_http_server::session::{
    RestoreOutcome, ServerSseMessage, SessionId, SessionManager,
};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{Json, ServerHandler, schemars, tool, tool_handler, tool_router};
use serde::{Deserialize, Deserializer, Serialize};

use crate::controller::Controller;
use crate::error::Error;
use crate::http::ApiError;
use crate::lifecycle::SandboxStatus;

/// The most MCP sessions open at once.
pub const MAX_SESSIONS: usize = 256;
/// A session without a message for this long is closed.
pub const SESSION_IDLE: Duration = Duration::from_secs(600);

/// `ANY /mcp` (mounted under the API key check).
pub fn router<S: Clone + Send + Sync + 'static>(c: Arc<Controller>) -> Routes<S> {
    let sessions = Arc::new(Bounded::new(MAX_SESSIONS, SESSION_IDLE));
    let config = StreamableHttpServerConfig::default()
        // The API key guards this route; the controller is reached by whatever name its
        // deployment gives it.
        .disable_allowed_hosts();
    let service = StreamableHttpService::new(
        move || Ok(ControllerMcp::new(c.clone())),
        sessions.clone(),
        config,
    );
    Routes::new()
        .bind_service(&berth_protocol::ops::controller::MCP, service)
        .route_layer(axum::middleware::from_fn(
            move |req: Request, next: axum::middleware::Next| {
                let sessions = sessions.clone();
                async move {
                    match sessions.admit(req).await {
                        Ok(req) => next.run(req).await,
                        Err(e) => e.into_response(),
                    }
                }
            },
        ))
}

/// The MCP URL of a sandbox through this controller.
pub fn sandbox_mcp_url(c: &Controller, id: &str) -> String {
    format!("{}{}", c.ctx.public_url, fill(route::SANDBOX_MCP, &[id]))
}

/// A sandbox as the REST routes answer it, plus its MCP URL.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct SandboxAnswer {
    #[serde(flatten)]
    pub sandbox: Sandbox,
    /// This sandbox's MCP server through the controller (the API key), for the desktop tools.
    pub mcp_url: String,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct SandboxListAnswer {
    pub sandboxes: Vec<SandboxAnswer>,
}

/// A lease as `POST /sandbox/v1/leases` answers it, plus its sandbox's MCP URL.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct LeaseAnswer {
    #[serde(flatten)]
    pub lease: Lease,
    /// The leased sandbox's MCP server through the controller.
    pub mcp_url: String,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Released {
    pub lease_id: String,
    pub released: bool,
}

/// `create_sandbox`: the REST create body (`CreateSandbox`, so its fields follow the wire
/// type) and `wait`.
#[derive(Debug)]
pub struct CreateArgs {
    pub create: CreateSandbox,
    pub wait: Option<bool>,
}

impl<'de> Deserialize<'de> for CreateArgs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let mut fields = serde_json::Map::deserialize(d)?;
        let wait = match fields.remove("wait") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::Bool(b)) => Some(b),
            Some(other) => {
                return Err(D::Error::custom(format!(
                    "wait: expected a boolean, not {other}"
                )));
            }
        };
        let create = CreateSandbox::deserialize(serde_json::Value::Object(fields))
            .map_err(D::Error::custom)?;
        Ok(CreateArgs { create, wait })
    }
}

impl schemars::JsonSchema for CreateArgs {
    fn schema_name() -> Cow<'static, str> {
        "CreateSandboxArgs".into()
    }

    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let mut schema = CreateSandbox::json_schema(g);
        if let Some(props) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) {
            props.insert(
                "wait".into(),
                serde_json::json!({
                    "type": "boolean",
                    "description": "Wait until the sandbox is ready (the default); false answers \
                                    at once with it pending or starting.",
                }),
            );
        }
        schema
    }
}

/// `list_sandboxes`: the REST list's filters.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// Only sandboxes carrying every one of these labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Only sandboxes in this status (default: every one but `stopped`).
    #[serde(default)]
    pub status: Option<Status>,
}

/// A sandbox's status, as a filter.
#[derive(Debug, Clone, Copy, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pending,
    Starting,
    Running,
    Stopping,
    Stopped,
    Failed,
}

impl From<Status> for SandboxStatus {
    fn from(s: Status) -> SandboxStatus {
        match s {
            Status::Pending => SandboxStatus::Pending,
            Status::Starting => SandboxStatus::Starting,
            Status::Running => SandboxStatus::Running,
            Status::Stopping => SandboxStatus::Stopping,
            Status::Stopped => SandboxStatus::Stopped,
            Status::Failed => SandboxStatus::Failed,
        }
    }
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxId {
    /// The sandbox's id (`sb_…`).
    pub id: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishArgs {
    /// The sandbox's id (`sb_…`).
    pub id: String,
    /// An absolute path in the sandbox: a file, or a directory (published as a zip).
    pub path: String,
    /// The run it belongs to (a run of this sandbox).
    #[serde(default)]
    pub run: Option<String>,
    /// The artifact's name; default the path's last component.
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ArtifactFilter {
    /// Only this sandbox's.
    #[serde(default)]
    pub sandbox: Option<String>,
    /// Only this run's.
    #[serde(default)]
    pub run: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseId {
    /// The lease's id, from `acquire_lease`.
    pub lease_id: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CloneArgs {
    /// The sandbox to clone into (behind the egress proxy, its policy allowing the GitHub
    /// host).
    pub id: String,
    /// `owner/name`, as `github_repositories` lists it.
    pub repository: String,
    /// Where to clone to, relative to the sandbox's working directory unless absolute
    /// (default: the repository's name).
    #[serde(default)]
    pub path: Option<String>,
    /// A branch or tag to check out.
    #[serde(default)]
    pub branch: Option<String>,
    /// A shallow clone of this many commits.
    #[serde(default)]
    pub depth: Option<u32>,
}

/// `github_pull_requests` and `github_issues`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GithubListArgs {
    /// The sandbox the repository was cloned into.
    pub id: String,
    /// `owner/name`, a repository `github_clone_repository` cloned into that sandbox.
    pub repository: String,
    /// `open` (default), `closed` or `all`.
    #[serde(default)]
    pub state: Option<String>,
    /// From 1.
    #[serde(default)]
    pub page: Option<u32>,
    /// 1-100 (default 30).
    #[serde(default)]
    pub per_page: Option<u32>,
}

impl GithubListArgs {
    /// The sandbox and the REST route's query.
    fn split(self) -> (String, berth_protocol::controller::GithubListQuery) {
        let q = berth_protocol::controller::GithubListQuery {
            repository: self.repository,
            state: self.state,
            page: self.page,
            per_page: self.per_page,
        };
        (self.id, q)
    }
}

/// `github_pull_request` and `github_issue`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GithubItemArgs {
    /// The sandbox the repository was cloned into.
    pub id: String,
    /// `owner/name`, a repository cloned into that sandbox.
    pub repository: String,
    /// The pull request's or issue's number.
    pub number: u64,
}

/// `workpiece_create`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkpieceCreateArgs {
    /// The sandbox's id (`sb_…`).
    pub id: String,
    /// deck, sheet, document or pdf.
    pub kind: berth_protocol::workpiece::WorkpieceKind,
    /// Absolute, or relative to the sandbox user's home; its extension names the format
    /// (.pptx/.odp, .xlsx/.ods, .docx/.odt, .pdf).
    pub path: String,
    /// The title (the first slide's title, the first paragraph, cell A1, the first page).
    #[serde(default)]
    pub title: Option<String>,
    /// Register the file already at `path` instead of making a new one.
    #[serde(default)]
    pub existing: bool,
    /// The run it belongs to.
    #[serde(default)]
    pub run: Option<String>,
}

/// A workpiece of a sandbox.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkpieceArgs {
    /// The sandbox's id (`sb_…`).
    pub id: String,
    /// The workpiece's id (`wp_…`).
    pub workpiece: String,
}

/// `workpiece_read`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkpieceReadArgs {
    /// The sandbox's id (`sb_…`).
    pub id: String,
    /// The workpiece's id (`wp_…`).
    pub workpiece: String,
    /// A version (default the latest).
    #[serde(default)]
    pub version: Option<u32>,
    /// The page of the answer, from 0 (`pages` says how many there are).
    #[serde(default)]
    pub page: u32,
    /// A sheet's name (sheets; default the first).
    #[serde(default)]
    pub sheet: Option<String>,
}

/// `workpiece_propose`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkpieceProposeArgs {
    /// The sandbox's id (`sb_…`).
    pub id: String,
    /// The workpiece's id (`wp_…`).
    pub workpiece: String,
    /// The version the edits were written against (its latest).
    pub base_version: u32,
    /// What the edits do, for the person reviewing them.
    pub summary: String,
    /// The edits in order, each `{"op": …}` of the workpiece's kind.
    #[schemars(with = "Vec<berth_protocol::workpiece::Operation>")]
    pub operations: Vec<serde_json::Value>,
    /// The run it belongs to.
    #[serde(default)]
    pub run: Option<String>,
}

/// `workpiece_proposals`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkpieceProposalsArgs {
    /// The sandbox's id (`sb_…`).
    pub id: String,
    /// The workpiece's id (`wp_…`).
    pub workpiece: String,
    /// pending, accepted or rejected.
    #[serde(default)]
    pub status: Option<String>,
}

/// `workpiece_proposal`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkpieceProposalArgs {
    /// The sandbox's id (`sb_…`).
    pub id: String,
    /// The workpiece's id (`wp_…`).
    pub workpiece: String,
    /// The proposal's id (`wpp_…`).
    pub proposal: String,
}

/// A workpiece's content, as `workpiece_read` answers it.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct WorkpieceContent {
    #[serde(flatten)]
    pub content: serde_json::Map<String, serde_json::Value>,
}

/// A domain error as a tool error: the REST error body as content.
#[derive(Debug)]
pub struct ToolError(pub Error);

impl From<Error> for ToolError {
    fn from(e: Error) -> Self {
        ToolError(e)
    }
}

impl IntoCallToolResult for ToolError {
    fn into_call_tool_result(self) -> Result<CallToolResponse, rmcp::ErrorData> {
        let body = berth_protocol::ErrorBody::new(self.0.code(), self.0.to_string());
        let value = serde_json::to_value(body).unwrap_or_default();
        Ok(CallToolResult::structured_error(value).into())
    }
}

/// One session's server: stateless but for the controller it calls.
#[derive(Clone)]
pub struct ControllerMcp {
    c: Arc<Controller>,
    tool_router: ToolRouter<Self>,
}

impl ControllerMcp {
    pub fn new(c: Arc<Controller>) -> Self {
        let mut tool_router = Self::tool_router();
        // The GitHub tools only where they work: an agent is not shown tools that answer 404.
        if c.github.get().is_none() {
            tool_router.remove_route("github_repositories");
            tool_router.remove_route("github_clone_repository");
            for t in [
                "github_pull_requests",
                "github_pull_request",
                "github_issues",
                "github_issue",
            ] {
                tool_router.remove_route(t);
            }
        }
        ControllerMcp { c, tool_router }
    }

    fn answer(&self, sandbox: Sandbox) -> SandboxAnswer {
        let mcp_url = sandbox_mcp_url(&self.c, &sandbox.id);
        SandboxAnswer { sandbox, mcp_url }
    }

    /// Runs `f` in its own task, so a client that leaves mid-call does not stop a create or a
    /// delete halfway.
    async fn detached<T: Send + 'static>(
        f: impl Future<Output = crate::error::Result<T>> + Send + 'static,
    ) -> Result<T, ToolError> {
        tokio::spawn(f)
            .await
            .map_err(|e| ToolError(Error::Internal(format!("the tool's task: {e}"))))?
            .map_err(ToolError)
    }
}

#[tool_router]
impl ControllerMcp {
    /// Creates a sandbox (a warm pool member when a pool serves the profile), by default
    /// waiting until it is ready. The answer is the sandbox as `GET /sandbox/sandboxes/v1/{id}`
    /// shows it, plus `mcp_url`: that sandbox's own MCP server (computer, screenshot, exec, …).
    #[tool(annotations(destructive_hint = false, open_world_hint = false))]
    async fn create_sandbox(
        &self,
        Parameters(args): Parameters<CreateArgs>,
    ) -> Result<Json<SandboxAnswer>, ToolError> {
        let c = self.c.clone();
        let req = crate::sandbox::Request::from(args.create);
        let wait = args.wait.unwrap_or(true);
        let row = Self::detached(async move {
            match wait {
                true => c.sandboxes.provision(&req).await.map(|(row, _)| row),
                false => c.sandboxes.provision_nowait(&req).await,
            }
        })
        .await?;
        Ok(Json(self.answer(self.c.sandboxes.to_wire(&row))))
    }

    /// Lists the sandboxes (not the stopped ones unless `status` asks), filtered by labels
    /// (all must match) and status.
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    async fn list_sandboxes(
        &self,
        Parameters(args): Parameters<ListArgs>,
    ) -> Result<Json<SandboxListAnswer>, ToolError> {
        let labels: Vec<(String, String)> = args.labels.into_iter().collect();
        let status = args.status.map(SandboxStatus::from);
        let sandboxes = self.c.sandboxes.list(&labels, status)?;
        Ok(Json(SandboxListAnswer {
            sandboxes: sandboxes.into_iter().map(|s| self.answer(s)).collect(),
        }))
    }

    /// Shows one sandbox, with its `mcp_url`.
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    async fn get_sandbox(
        &self,
        Parameters(args): Parameters<SandboxId>,
    ) -> Result<Json<SandboxAnswer>, ToolError> {
        let row = self.c.ctx.visible_row(&args.id)?;
        Ok(Json(self.answer(self.c.sandboxes.to_wire(&row))))
    }

    /// Deletes a sandbox (and ends its lease); answers it as it is then (`stopped`).
    #[tool(annotations(
        destructive_hint = true,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn delete_sandbox(
        &self,
        Parameters(args): Parameters<SandboxId>,
    ) -> Result<Json<SandboxAnswer>, ToolError> {
        let c = self.c.clone();
        let id = args.id;
        let row = Self::detached(async move {
            c.sandboxes.delete(&id).await?;
            c.ctx.get_row(&id)
        })
        .await?;
        Ok(Json(self.answer(self.c.sandboxes.to_wire(&row))))
    }

    /// Acquires the lease of a thread (`POST /sandbox/v1/leases`): the same lease and sandbox
    /// come back for the same `thread_id` while it lasts. The answer adds the sandbox's
    /// `mcp_url`.
    #[tool(annotations(
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn acquire_lease(
        &self,
        Parameters(args): Parameters<AcquireLease>,
    ) -> Result<Json<LeaseAnswer>, ToolError> {
        let c = self.c.clone();
        let lease = Self::detached(async move { c.leases.acquire(&args).await }).await?;
        let mcp_url = sandbox_mcp_url(&self.c, &lease.sandbox.id);
        Ok(Json(LeaseAnswer { lease, mcp_url }))
    }

    /// Publishes a file or directory (as a zip) of a running sandbox as an artifact
    /// (`POST /sandbox/sandboxes/v1/{id}/artifacts`); it outlives the sandbox and downloads
    /// from `GET /sandbox/v1/artifacts/{artifact id}`.
    #[tool(annotations(destructive_hint = false, open_world_hint = false))]
    async fn publish_artifact(
        &self,
        Parameters(args): Parameters<PublishArgs>,
    ) -> Result<Json<berth_protocol::controller::Artifact>, ToolError> {
        let c = self.c.clone();
        let req = berth_protocol::controller::PublishArtifact {
            path: args.path,
            run: args.run,
            name: args.name,
        };
        let id = args.id;
        let a = Self::detached(async move { c.artifacts.publish_path(&id, req).await }).await?;
        Ok(Json(a.to_wire()))
    }

    /// Lists artifacts (recordings, published files, long run output, episodes), oldest
    /// first, of a sandbox and/or run when given.
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    async fn list_artifacts(
        &self,
        Parameters(args): Parameters<ArtifactFilter>,
    ) -> Result<Json<berth_protocol::controller::ArtifactList>, ToolError> {
        let rows = self
            .c
            .artifacts
            .artifacts(args.sandbox.as_deref(), args.run.as_deref())?;
        Ok(Json(berth_protocol::controller::ArtifactList {
            artifacts: rows.iter().map(|a| a.to_wire()).collect(),
        }))
    }

    /// Lists the GitHub repositories the controller's token reads (`owner/name` each): what
    /// `github_clone_repository` can clone. The token stays in the controller.
    #[tool(annotations(read_only_hint = true, open_world_hint = true))]
    async fn github_repositories(
        &self,
    ) -> Result<Json<berth_protocol::controller::GithubRepositoryList>, ToolError> {
        Ok(Json(self.c.github()?.repositories().await?))
    }

    /// Clones a GitHub repository into a sandbox's working directory (`path`, default its
    /// name). The egress proxy adds the token to that repository's requests only (this clone,
    /// later fetches and pushes, its pull requests through the API); the sandbox never holds
    /// it.
    #[tool(annotations(destructive_hint = false, open_world_hint = true))]
    async fn github_clone_repository(
        &self,
        Parameters(args): Parameters<CloneArgs>,
    ) -> Result<Json<berth_protocol::controller::GithubCloned>, ToolError> {
        let github = self.c.github()?.clone();
        let c = self.c.clone();
        let req = berth_protocol::controller::GithubClone {
            repository: args.repository,
            path: args.path,
            branch: args.branch,
            depth: args.depth,
        };
        let cloned = Self::detached(async move {
            github
                .clone_repository(&c.ctx, &c.runs, &args.id, req)
                .await
        })
        .await?;
        Ok(Json(cloned))
    }

    /// Lists the pull requests (a page) of a repository cloned into a sandbox, read by the
    /// controller with its token. Only repositories `github_clone_repository` cloned into
    /// that sandbox are read.
    #[tool(annotations(read_only_hint = true, open_world_hint = true))]
    async fn github_pull_requests(
        &self,
        Parameters(a): Parameters<GithubListArgs>,
    ) -> Result<Json<berth_protocol::controller::GithubPullList>, ToolError> {
        let (id, q) = a.split();
        Ok(Json(self.c.github()?.pulls(&self.c.ctx, &id, &q).await?))
    }

    /// Reads one pull request of a repository cloned into a sandbox: its description, diff,
    /// changed files, reviews and review comments. A large text comes as a preview (its first
    /// and last lines) and an artifact holding it whole (`artifact_id`, read by range).
    #[tool(annotations(read_only_hint = true, open_world_hint = true))]
    async fn github_pull_request(
        &self,
        Parameters(a): Parameters<GithubItemArgs>,
    ) -> Result<Json<berth_protocol::controller::GithubPull>, ToolError> {
        let github = self.c.github()?;
        Ok(Json(
            github
                .pull(
                    &self.c.ctx,
                    &self.c.artifacts,
                    &a.id,
                    &a.repository,
                    a.number,
                )
                .await?,
        ))
    }

    /// Lists the issues (a page) of a repository cloned into a sandbox; GitHub lists pull
    /// requests among them (`is_pull_request`).
    #[tool(annotations(read_only_hint = true, open_world_hint = true))]
    async fn github_issues(
        &self,
        Parameters(a): Parameters<GithubListArgs>,
    ) -> Result<Json<berth_protocol::controller::GithubIssueList>, ToolError> {
        let (id, q) = a.split();
        Ok(Json(self.c.github()?.issues(&self.c.ctx, &id, &q).await?))
    }

    /// Reads one issue of a repository cloned into a sandbox, with its comments.
    #[tool(annotations(read_only_hint = true, open_world_hint = true))]
    async fn github_issue(
        &self,
        Parameters(a): Parameters<GithubItemArgs>,
    ) -> Result<Json<berth_protocol::controller::GithubIssue>, ToolError> {
        let github = self.c.github()?;
        Ok(Json(
            github
                .issue(
                    &self.c.ctx,
                    &self.c.artifacts,
                    &a.id,
                    &a.repository,
                    a.number,
                )
                .await?,
        ))
    }

    /// Makes a new, valid document in a sandbox — a deck (.pptx/.odp), sheet (.xlsx/.ods),
    /// document (.docx/.odt) or PDF — titled when `title` is given, or registers the file
    /// already at `path` (`existing`). Its first version is kept. Edit it with
    /// `workpiece_propose`: a person accepts or rejects each proposal.
    #[tool(annotations(destructive_hint = false, open_world_hint = false))]
    async fn workpiece_create(
        &self,
        Parameters(a): Parameters<WorkpieceCreateArgs>,
    ) -> Result<Json<berth_protocol::workpiece::Workpiece>, ToolError> {
        let req = berth_protocol::workpiece::CreateWorkpiece {
            kind: Some(a.kind),
            path: a.path,
            title: a.title,
            existing: a.existing,
            run: a.run,
        };
        Ok(Json(self.c.workpieces.create(&a.id, req).await?))
    }

    /// Lists a sandbox's workpieces with their versions (a change made in the sandbox by
    /// other means shows as a version by `sandbox`).
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    async fn workpiece_list(
        &self,
        Parameters(a): Parameters<SandboxId>,
    ) -> Result<Json<berth_protocol::workpiece::WorkpieceList>, ToolError> {
        Ok(Json(self.c.workpieces.list(&a.id).await?))
    }

    /// Reads a workpiece's structured content, one page at a time: a deck's slides (title,
    /// text shapes, notes), a sheet's sheets and the selected sheet's cells (values and
    /// formulas), a document's paragraphs (with styles) and tables, a PDF's pages (text,
    /// annotations) and form fields. Indexes are the ones `workpiece_propose` takes.
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    async fn workpiece_read(
        &self,
        Parameters(a): Parameters<WorkpieceReadArgs>,
    ) -> Result<Json<WorkpieceContent>, ToolError> {
        let c = self
            .c
            .workpieces
            .content(&a.id, &a.workpiece, a.version, a.page, a.sheet)
            .await?;
        let content = match c {
            serde_json::Value::Object(m) => m,
            _ => Default::default(),
        };
        Ok(Json(WorkpieceContent { content }))
    }

    /// Proposes edits to a workpiece: an ordered list of typed operations against its latest
    /// version (`base_version`), with a summary. They are checked and applied to a copy at
    /// once (a bad operation is an error naming it); the proposal then waits for a person to
    /// accept or reject it — the file changes only when accepted.
    /// Sheet: set_cells, add_sheet, rename_sheet, delete_sheet. Document: replace_text,
    /// insert_paragraph, delete_paragraph, set_paragraph_style, insert_table. Deck: add_slide,
    /// delete_slide, move_slide, set_text, set_notes. PDF: add_note, highlight, fill_field,
    /// delete_page, rotate_page, reorder_pages.
    #[tool(annotations(destructive_hint = false, open_world_hint = false))]
    async fn workpiece_propose(
        &self,
        Parameters(a): Parameters<WorkpieceProposeArgs>,
    ) -> Result<Json<berth_protocol::workpiece::Proposal>, ToolError> {
        let req = berth_protocol::workpiece::ProposeEdits {
            base_version: a.base_version,
            summary: a.summary,
            operations: a.operations,
            run: a.run,
        };
        Ok(Json(
            self.c.workpieces.propose(&a.id, &a.workpiece, req).await?,
        ))
    }

    /// Lists a workpiece's proposals, newest first, with their status (pending, accepted,
    /// rejected) and whether a pending one is stale.
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    async fn workpiece_proposals(
        &self,
        Parameters(a): Parameters<WorkpieceProposalsArgs>,
    ) -> Result<Json<berth_protocol::workpiece::ProposalList>, ToolError> {
        Ok(Json(self.c.workpieces.proposals(
            &a.id,
            &a.workpiece,
            a.status.as_deref(),
        )?))
    }

    /// Shows one proposal: its status, operations, the version accepting it made, and its
    /// rendered preview (`preview_pages` pages).
    #[tool(annotations(read_only_hint = true, open_world_hint = false))]
    async fn workpiece_proposal(
        &self,
        Parameters(a): Parameters<WorkpieceProposalArgs>,
    ) -> Result<Json<berth_protocol::workpiece::Proposal>, ToolError> {
        Ok(Json(self.c.workpieces.proposal(
            &a.id,
            &a.workpiece,
            &a.proposal,
        )?))
    }

    /// Releases a lease (`DELETE /sandbox/v1/leases/{id}`), which destroys its sandbox.
    #[tool(annotations(
        destructive_hint = true,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn release_lease(
        &self,
        Parameters(args): Parameters<LeaseId>,
    ) -> Result<Json<Released>, ToolError> {
        let c = self.c.clone();
        let id = args.lease_id.clone();
        Self::detached(async move { c.leases.release(&id, "released by its holder").await })
            .await?;
        Ok(Json(Released {
            lease_id: args.lease_id,
            released: true,
        }))
    }
}

#[tool_handler(
    router = self.tool_router,
    name = "berth-controller",
    instructions = "berth's controller: create, list, show and delete sandboxes; acquire and \
                    release leases; make, read and propose edits to workpieces (decks, sheets, \
                    documents, PDFs) that a person reviews. Each sandbox answer carries mcp_url, that sandbox's own MCP \
                    server (computer, screenshot, exec, files, accessibility tree, recording), \
                    reached with the same X-Api-Key header."
)]
impl ServerHandler for ControllerMcp {}

/// Sessions kept in memory by rmcp's [`LocalSessionManager`], at most `max` at once.
pub struct Bounded {
    inner: LocalSessionManager,
    max: usize,
    /// Held across the count and the create, so concurrent creates cannot pass the bound.
    creating: tokio::sync::Mutex<()>,
}

#[derive(Debug, thiserror::Error)]
pub enum BoundedError {
    #[error("{0} MCP sessions are open, the most this controller keeps")]
    Full(usize),
    #[error(transparent)]
    Inner(#[from] LocalSessionManagerError),
}

impl Bounded {
    pub fn new(max: usize, idle: Duration) -> Self {
        let mut inner = LocalSessionManager::default();
        let mut config = SessionConfig::default();
        config.keep_alive = Some(idle);
        inner.session_config = config;
        Bounded {
            inner,
            max,
            creating: tokio::sync::Mutex::new(()),
        }
    }

    pub async fn open(&self) -> usize {
        self.inner.sessions.read().await.len()
    }

    /// While sessions are at the bound, a request that would open one (a POST without
    /// `Mcp-Session-Id` whose message is `initialize`) is answered 503 with the error body;
    /// any other request passes (its body read back in when it had to be looked at).
    async fn admit(&self, req: Request) -> Result<Request, ApiError> {
        let opens = req.method() == Method::POST
            && !req
                .headers()
                .contains_key(berth_protocol::routes::header::MCP_SESSION_ID);
        if !opens || self.open().await < self.max {
            return Ok(req);
        }
        let (parts, body) = req.into_parts();
        let bytes = axum::body::to_bytes(body, crate::http::JSON_LIMIT)
            .await
            .map_err(|e| ApiError(Error::BadRequest(format!("reading the body: {e}"))))?;
        if is_initialize(&bytes) {
            return Err(ApiError(Error::Unavailable(
                BoundedError::Full(self.max).to_string(),
            )));
        }
        Ok(Request::from_parts(parts, Body::from(bytes)))
    }
}

/// Whether a JSON-RPC body is an `initialize` request.
fn is_initialize(body: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Method {
        method: Option<String>,
    }
    serde_json::from_slice::<Method>(body)
        .ok()
        .and_then(|m| m.method)
        .is_some_and(|m| m == "initialize")
}

impl SessionManager for Bounded {
    type Error = BoundedError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let _one_at_a_time = self.creating.lock().await;
        if self.open().await >= self.max {
            return Err(BoundedError::Full(self.max));
        }
        Ok(self.inner.create_session().await?)
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        Ok(self.inner.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.inner.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        Ok(self.inner.close_session(id).await?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.create_stream(id, message).await?)
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        Ok(self.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.create_standalone_stream(id).await?)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.resume(id, last_event_id).await?)
    }

    async fn restore_session(
        &self,
        _id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        // No session store: a session this process does not hold is gone (404).
        Ok(RestoreOutcome::NotSupported)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_args_take_wait_beside_the_create_body_and_refuse_unknown_fields() {
        let a: CreateArgs = serde_json::from_value(serde_json::json!({
            "profile": "desktop-ubuntu", "labels": {"k": "v"}, "wait": false
        }))
        .unwrap();
        assert_eq!(a.wait, Some(false));
        assert_eq!(a.create.profile, "desktop-ubuntu");
        assert_eq!(a.create.labels.get("k").map(String::as_str), Some("v"));
        let e = serde_json::from_value::<CreateArgs>(serde_json::json!({
            "profile": "desktop-ubuntu", "bogus": 1
        }))
        .unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
        let e = serde_json::from_value::<CreateArgs>(serde_json::json!({
            "profile": "desktop-ubuntu", "wait": "yes"
        }))
        .unwrap_err();
        assert!(e.to_string().contains("wait"), "{e}");
    }

    #[test]
    fn the_create_schema_is_the_wire_type_plus_wait() {
        let schema = rmcp::handler::server::common::schema_for_input::<CreateArgs>().unwrap();
        let props = schema["properties"].as_object().unwrap();
        for field in ["profile", "labels", "ttl_seconds", "wait"] {
            assert!(props.contains_key(field), "{field} missing: {props:?}");
        }
        assert_eq!(schema["required"], serde_json::json!(["profile"]));
    }

    #[test]
    fn only_an_initialize_message_opens_a_session() {
        assert!(is_initialize(
            br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#
        ));
        assert!(!is_initialize(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#
        ));
        assert!(!is_initialize(b"not json"));
    }

    #[test]
    fn a_domain_error_is_a_tool_error_with_the_rest_error_body() {
        let r = ToolError(Error::NotFound("no sandbox sb_x".into()))
            .into_call_tool_result()
            .unwrap();
        let CallToolResponse::Complete(r) = r else {
            panic!("not a complete result");
        };
        assert_eq!(r.is_error, Some(true));
        assert_eq!(
            r.structured_content,
            Some(serde_json::json!({"error": {"code": "not_found", "message": "no sandbox sb_x"}}))
        );
    }

    fn post(body: &'static str, session: Option<&str>) -> Request {
        let mut b = Request::builder().method(Method::POST).uri("/mcp");
        if let Some(s) = session {
            b = b.header(berth_protocol::routes::header::MCP_SESSION_ID, s);
        }
        b.body(Body::from(body)).unwrap()
    }

    #[tokio::test]
    async fn sessions_stop_at_the_bound_and_a_closed_one_makes_room() {
        let b = Bounded::new(1, Duration::from_secs(60));
        let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#;
        assert!(b.admit(post(init, None)).await.is_ok());
        let (first, _transport) = b.create_session().await.unwrap();
        assert_eq!(b.open().await, 1);
        assert!(matches!(
            b.create_session().await,
            Err(BoundedError::Full(1))
        ));
        // At the bound: a new session is refused with the controller's 503 ...
        let Err(refused) = b.admit(post(init, None)).await else {
            panic!("a session past the bound is admitted");
        };
        let refused = refused.into_response();
        assert_eq!(
            refused.status(),
            axum::http::StatusCode::SERVICE_UNAVAILABLE
        );
        // ... while a session's own requests, and a session-less call, pass with their body.
        assert!(b.admit(post(init, Some(first.as_ref()))).await.is_ok());
        let call = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
        let Ok(passed) = b.admit(post(call, None)).await else {
            panic!("a session-less call is refused");
        };
        let body = axum::body::to_bytes(passed.into_body(), 1024)
            .await
            .unwrap();
        assert_eq!(&body[..], call.as_bytes());
        b.close_session(&first).await.unwrap();
        assert_eq!(b.open().await, 0);
        assert!(b.create_session().await.is_ok());
    }
}
