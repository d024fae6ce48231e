//! The controller's API: `X-Api-Key` on every operation but health, metrics, the document
//! and the browser-facing ones (which also take their cookie).

use serde_json::{Value, json};

use super::native::{COMPUTER_ANSWERS, FORMAT, IMAGE, MP4, QUALITY, SCALE};
use super::{
    ANY, Answer, Body, ERROR, Operation, Param, Schema, alive, binary, boolean, int, object,
    schema, string,
};
use crate::control::{ControlView, TakeControl};
use crate::controller::*;
use crate::routes::controller as path;
use crate::workpiece::*;
use crate::{ComputerBody, OutputPage, UploadResult};

const KEY: &[&str] = &["apiKey"];
const VIEWER: &[&str] = &["apiKey", "viewerCookie"];
const PREVIEW: &[&str] = &["apiKey", "previewCookie"];
const SESSION: &[&str] = &["apiKey", "sessionCookie"];

/// An operation behind the API key (or `security`), with the native error answers.
const fn keyed(op: Operation) -> Operation {
    op.security(KEY).native_errors()
}

const NOT_RUNNING: Answer = Answer::json("409", "not running", ERROR);
const BYTES: &[(&str, Schema)] = &[("application/octet-stream", binary)];
const ZIP: &[(&str, Schema)] = &[("application/zip", binary)];
const ZIP_OR_ATIF: &[(&str, Schema)] = &[("application/zip", binary), ("application/json", object)];
const PATH: Param = Param::required("path", string, "absolute, or relative to the home");

pub const HEALTHZ: Operation = Operation::get(path::HEALTHZ, "healthz", "liveness (no auth)")
    .native_errors()
    .answers(&[Answer::json("200", "alive", alive)]);

pub const METRICS: Operation =
    Operation::get(path::METRICS, "metrics", "Prometheus metrics (no auth)")
        .native_errors()
        .answers(&[Answer::media(
            "200",
            "the metrics",
            &[("text/plain", string)],
        )]);

pub const OPENAPI: Operation = Operation::get(path::OPENAPI, "openapi", "this document (no auth)")
    .answers(&[Answer::json("200", "the OpenAPI 3.1 document", object)]);

// Sandboxes and runs.

pub const SANDBOX_CREATE: Operation = keyed(Operation::post(
    path::SANDBOXES,
    "sandbox_create",
    "create a sandbox (or claim a warm one)",
))
.query(&[Param::query(
    "wait",
    boolean,
    "false: answer at once and get ready in the background",
)])
.body(Body::json(schema::<CreateSandbox>))
.answers(&[
    Answer::json("201", "the sandbox", schema::<Sandbox>),
    Answer::json("422", "valid but impossible", ERROR),
    Answer::json("503", "no capacity", ERROR),
]);

pub const SANDBOX_LIST: Operation =
    keyed(Operation::get(path::SANDBOXES, "sandbox_list", "sandboxes"))
        .query(&[
            Param::query(
                "label",
                |_| json!({"type": "string", "pattern": "^[^=]+=.*$"}),
                "key=value filter",
            ),
            Param::query(
                "status",
                |_| {
                    json!({"type": "string",
                   "enum": ["pending", "starting", "running", "stopping", "stopped", "failed"]})
                },
                "status filter",
            ),
        ])
        .answers(&[Answer::json("200", "the sandboxes", schema::<SandboxList>)]);

pub const SANDBOX_GET: Operation = keyed(Operation::get(
    path::SANDBOX,
    "sandbox_get",
    "one sandbox",
))
.answers(&[Answer::json("200", "the sandbox", schema::<Sandbox>)]);

pub const SANDBOX_DELETE: Operation = keyed(Operation::delete(
    path::SANDBOX,
    "sandbox_delete",
    "destroy a sandbox",
))
.answers(&[Answer::json(
    "200",
    "the sandbox, stopped",
    schema::<Sandbox>,
)]);

pub const SANDBOX_VIEWER: Operation = keyed(Operation::post(
    path::SANDBOX_VIEWER,
    "sandbox_viewer",
    "a one-time viewer URL",
))
.answers(&[
    Answer::json("200", "the URL", schema::<ViewerUrl>),
    NOT_RUNNING,
]);

pub const SANDBOX_EXEC: Operation = keyed(Operation::post(
    path::SANDBOX_EXEC,
    "sandbox_exec",
    "run a command in a sandbox",
))
.body(Body::json(schema::<RunRequest>))
.answers(&[
    Answer::json("200", "the run", schema::<Run>),
    NOT_RUNNING,
    Answer::json("502", "the agent failed", ERROR),
    Answer::json("503", "not ready", ERROR),
]);

pub const RUN_GET: Operation = keyed(Operation::get(path::RUN, "run_get", "one run"))
    .answers(&[Answer::json("200", "the run", schema::<Run>)]);

pub const RUN_OUTPUT: Operation = keyed(Operation::get(
    path::RUN_OUTPUT,
    "run_output",
    "a run's output from a seq",
))
.query(&[
    Param::query("from_seq", int, "byte offset to read from"),
    Param::query("limit", int, "unused here; accepted"),
])
.answers(&[Answer::json(
    "200",
    "chunks from from_seq",
    schema::<OutputPage>,
)]);

pub const SANDBOX_EVENTS: Operation = keyed(Operation::get(
    path::SANDBOX_EVENTS,
    "sandbox_events",
    "a sandbox's timeline",
))
.query(&[
    Param::query("from_seq", int, "first seq"),
    Param::query("limit", int, "at most this many events"),
])
.answers(&[Answer::json("200", "a page of events", |g| {
    json!({"type": "object", "required": ["events"],
           "properties": {"events": {"type": "array", "items": {"type": "object"}},
                          "next_seq": int(g)}})
})]);

// Episodes and artifacts.

pub const GITHUB_REPOSITORIES: Operation = keyed(Operation::get(
    path::GITHUB_REPOSITORIES,
    "github_repositories",
    "the GitHub repositories the configured token reads (`[egress.github]`)",
))
.answers(&[
    Answer::json("200", "the repositories", schema::<GithubRepositoryList>),
    Answer::json("404", "no `[egress.github]` in the config", ERROR),
    Answer::json("502", "GitHub failed or refused the token", ERROR),
]);

pub const SANDBOX_GITHUB_CLONE: Operation = keyed(Operation::post(
    path::SANDBOX_GITHUB_CLONE,
    "github_clone_repository",
    "clone a GitHub repository into a sandbox behind the egress proxy; the proxy adds the \
     token to that repository's requests (clone, fetch, push, its API), which never enters \
     the sandbox",
))
.body(Body::json(schema::<GithubClone>))
.answers(&[
    Answer::json("200", "cloned", schema::<GithubCloned>),
    Answer::json("400", "not owner/name, or a bad path or branch", ERROR),
    Answer::json("404", "no `[egress.github]` in the config", ERROR),
    Answer::json(
        "409",
        "not running, or its egress policy does not send the GitHub host through the proxy",
        ERROR,
    ),
    Answer::json("502", "git clone failed (its output in the error)", ERROR),
]);

const REPOSITORY: Param = Param::required(
    "repository",
    string,
    "owner/name: a repository cloned into this sandbox",
);
const GITHUB_LIST: &[Param] = &[
    REPOSITORY,
    Param::query(
        "state",
        |_| json!({"type": "string", "enum": ["open", "closed", "all"]}),
        "default open",
    ),
    Param::query("page", int, "from 1"),
    Param::query("per_page", int, "1-100, default 30"),
];
const GITHUB_REFUSED: Answer = Answer::json(
    "403",
    "the repository was not cloned into this sandbox (github_repository_not_cloned)",
    ERROR,
);
const GITHUB_ABSENT: Answer = Answer::json(
    "404",
    "no `[egress.github]` in the config, or no such pull request or issue",
    ERROR,
);
const GITHUB_FAILED: Answer = Answer::json("502", "GitHub failed or refused the token", ERROR);

pub const SANDBOX_GITHUB_PULLS: Operation = keyed(Operation::get(
    path::SANDBOX_GITHUB_PULLS,
    "github_pull_requests",
    "the pull requests of a repository cloned into the sandbox (a page of them), read by the \
     controller with its token",
))
.query(GITHUB_LIST)
.answers(&[
    Answer::json("200", "a page of pull requests", schema::<GithubPullList>),
    Answer::json("400", "not owner/name, or a bad state or page", ERROR),
    GITHUB_REFUSED,
    GITHUB_ABSENT,
    GITHUB_FAILED,
]);

pub const SANDBOX_GITHUB_PULL: Operation = keyed(Operation::get(
    path::SANDBOX_GITHUB_PULL,
    "github_pull_request",
    "one pull request of a repository cloned into the sandbox: its description, diff, files, \
     reviews and review comments (a large text as an artifact with a preview)",
))
.query(&[REPOSITORY])
.answers(&[
    Answer::json("200", "the pull request", schema::<GithubPull>),
    Answer::json("400", "not owner/name, or not a number", ERROR),
    GITHUB_REFUSED,
    GITHUB_ABSENT,
    GITHUB_FAILED,
]);

pub const SANDBOX_GITHUB_ISSUES: Operation = keyed(Operation::get(
    path::SANDBOX_GITHUB_ISSUES,
    "github_issues",
    "the issues of a repository cloned into the sandbox (a page of them; GitHub lists pull \
     requests among them, marked)",
))
.query(GITHUB_LIST)
.answers(&[
    Answer::json("200", "a page of issues", schema::<GithubIssueList>),
    Answer::json("400", "not owner/name, or a bad state or page", ERROR),
    GITHUB_REFUSED,
    GITHUB_ABSENT,
    GITHUB_FAILED,
]);

pub const SANDBOX_GITHUB_ISSUE: Operation = keyed(Operation::get(
    path::SANDBOX_GITHUB_ISSUE,
    "github_issue",
    "one issue of a repository cloned into the sandbox, with its comments",
))
.query(&[REPOSITORY])
.answers(&[
    Answer::json("200", "the issue", schema::<GithubIssue>),
    Answer::json("400", "not owner/name, or not a number", ERROR),
    GITHUB_REFUSED,
    GITHUB_ABSENT,
    GITHUB_FAILED,
]);

pub const SANDBOX_LOGIN_SITES: Operation = keyed(Operation::get(
    path::SANDBOX_LOGIN,
    "login_sites",
    "the `[[login]]` sites the sandbox's run may sign its browser in to (names, hosts, uses)",
))
.answers(&[Answer::json(
    "200",
    "the sites",
    schema::<crate::login::LoginSites>,
)]);

pub const SANDBOX_LOGIN: Operation = keyed(Operation::post(
    path::SANDBOX_LOGIN,
    "login",
    "sign the sandbox's browser in to an enabled site: the controller hands the agent the \
     values, which never reach the caller; the answer is a fixed phrase",
))
.body(Body::json(schema::<crate::login::LoginRequest>))
.answers(&[
    Answer::json(
        "200",
        "signed in, or why not",
        schema::<crate::login::LoginAnswer>,
    ),
    Answer::json(
        "403",
        "the run does not enable the site (login_not_enabled), its host is not on the \
         egress allow list (login_host_refused), or the run used it max_uses times \
         (login_limit)",
        ERROR,
    ),
    Answer::json("404", "no such site in the config", ERROR),
    NOT_RUNNING,
    Answer::json("502", "the agent failed", ERROR),
]);

pub const SANDBOX_EPISODE: Operation = keyed(Operation::get(
    path::SANDBOX_EPISODE,
    "sandbox_episode",
    "the episode bundle (zip: recording.mp4, actions.jsonl, screenshots/, \
     timeline.jsonl, episode.json, trajectory.json), kept as an `episode` artifact \
     (X-Artifact-Id); once the sandbox is gone, the last kept bundle; `format=atif`: its \
     ATIF trajectory (JSON)",
))
.query(&[
    Param::query(
        "recording",
        string,
        "the recording to bundle (default: the one most actions fall in)",
    ),
    Param::query(
        "format",
        string,
        "`bundle` (default: the zip) or `atif` (the bundle's ATIF-v1.8 trajectory)",
    ),
])
.answers(&[
    Answer::media("200", "the bundle, or its ATIF trajectory", ZIP_OR_ATIF),
    Answer::media("206", "the requested range", ZIP),
    Answer::json("404", "no such sandbox, or none kept", ERROR),
    Answer::json("413", "the bundle passes artifact_max_file_bytes", ERROR),
]);

// Workpieces.

const PNG: &[(&str, Schema)] = &[("image/png", binary)];
const WORKPIECE_MISSING: Answer = Answer::json("404", "no such sandbox or workpiece", ERROR);

pub const WORKPIECE_LIST: Operation = keyed(Operation::get(
    path::WORKPIECES,
    "workpiece_list",
    "the sandbox's workpieces (decks, sheets, documents, PDFs) with their versions; kept after \
     the sandbox ends",
))
.answers(&[
    Answer::json("200", "the workpieces", schema::<WorkpieceList>),
    Answer::json("404", "no such sandbox", ERROR),
]);

pub const WORKPIECE_CREATE: Operation = keyed(Operation::post(
    path::WORKPIECES,
    "workpiece_create",
    "a new, valid document of a kind at a path in the sandbox (titled when a title is given), \
     or the file there registered (`existing`); its first version is kept as an artifact",
))
.body(Body::json(schema::<CreateWorkpiece>))
.answers(&[
    Answer::json("201", "the workpiece", schema::<Workpiece>),
    Answer::json(
        "400",
        "no kind, a path whose extension is not of the kind, a file that is not of its kind",
        ERROR,
    ),
    Answer::json("404", "no such sandbox, or (existing) no file there", ERROR),
    Answer::json(
        "409",
        "not running, a file already at the path, or a workpiece there already",
        ERROR,
    ),
    Answer::json("413", "the file passes the workpiece size limit", ERROR),
    Answer::json(
        "422",
        "the sandbox user cannot read or write the path, or the image has no LibreOffice",
        ERROR,
    ),
]);

pub const WORKPIECE_GET: Operation = keyed(Operation::get(
    path::WORKPIECE,
    "workpiece_get",
    "one workpiece and its versions (a change made in the sandbox is recorded first)",
))
.answers(&[
    Answer::json("200", "the workpiece", schema::<Workpiece>),
    WORKPIECE_MISSING,
]);

pub const WORKPIECE_CONTENT: Operation = keyed(Operation::get(
    path::WORKPIECE_CONTENT,
    "workpiece_read",
    "a version's structured content, paged: a deck's slides (titles, text frames, notes), a \
     sheet's sheets, used range, values and formulas, a document's paragraphs with styles and \
     tables, a PDF's pages' text, form fields and annotations",
))
.query(&[
    Param::query("version", int, "default: the latest"),
    Param::query("page", int, "the page of the answer, from 0"),
    Param::query(
        "sheet",
        string,
        "a sheet's name (sheets; default the first)",
    ),
])
.answers(&[
    Answer::json("200", "the content", object),
    WORKPIECE_MISSING,
    Answer::json(
        "409",
        "the sandbox is not running (only the kept previews remain)",
        ERROR,
    ),
]);

pub const WORKPIECE_VERSION_PAGE: Operation = keyed(Operation::get(
    path::WORKPIECE_VERSION_PAGE,
    "workpiece_version_page",
    "a version's page (slide, sheet print page, PDF page) rendered as PNG, from 1",
))
.answers(&[
    Answer::media("200", "the page", PNG),
    Answer::json("404", "no such version or page", ERROR),
]);

pub const WORKPIECE_OPEN: Operation = keyed(Operation::post(
    path::WORKPIECE_OPEN,
    "workpiece_open",
    "opens the workpiece in the desktop's editor (LibreOffice Impress, Calc, Writer; the PDF \
     viewer)",
))
.answers(&[
    Answer::json("200", "opened", object),
    WORKPIECE_MISSING,
    Answer::json("409", "not running, or the sandbox has no desktop", ERROR),
]);

pub const WORKPIECE_PROPOSE: Operation = keyed(Operation::post(
    path::WORKPIECE_PROPOSALS,
    "workpiece_propose",
    "proposes an ordered list of typed edit operations against the latest version: checked \
     and applied to a copy at once (the preview), pending until a person accepts or rejects it",
))
.body(Body::json(schema::<ProposeEdits>))
.answers(&[
    Answer::json("201", "the proposal", schema::<Proposal>),
    Answer::json(
        "400",
        "an operation the kind has not, a missing sheet/slide/page/paragraph, a formula \
         LibreOffice refuses (the error names the operation and its index)",
        ERROR,
    ),
    WORKPIECE_MISSING,
    Answer::json(
        "409",
        "not running, or base_version is not the latest",
        ERROR,
    ),
]);

pub const WORKPIECE_PROPOSALS: Operation = keyed(Operation::get(
    path::WORKPIECE_PROPOSALS,
    "workpiece_proposals",
    "the workpiece's proposals, newest first",
))
.query(&[Param::query(
    "status",
    string,
    "pending, accepted or rejected",
)])
.answers(&[
    Answer::json("200", "the proposals", schema::<ProposalList>),
    WORKPIECE_MISSING,
]);

pub const WORKPIECE_PROPOSAL: Operation = keyed(Operation::get(
    path::WORKPIECE_PROPOSAL,
    "workpiece_proposal",
    "one proposal: status, operations, preview",
))
.answers(&[
    Answer::json("200", "the proposal", schema::<Proposal>),
    WORKPIECE_MISSING,
]);

pub const WORKPIECE_PROPOSAL_PAGE: Operation = keyed(Operation::get(
    path::WORKPIECE_PROPOSAL_PAGE,
    "workpiece_proposal_page",
    "a page of the proposal's result rendered as PNG, from 1",
))
.answers(&[
    Answer::media("200", "the page", PNG),
    Answer::json("404", "no such proposal or page", ERROR),
]);

pub const WORKPIECE_ACCEPT: Operation = keyed(Operation::post(
    path::WORKPIECE_ACCEPT,
    "workpiece_accept",
    "a person accepts a proposal: its result becomes the next version and replaces the file \
     in the sandbox atomically",
))
.answers(&[
    Answer::json("200", "the proposal, accepted", schema::<Proposal>),
    WORKPIECE_MISSING,
    Answer::json(
        "409",
        "not running, rejected already, or its base is no longer the latest version (both named)",
        ERROR,
    ),
]);

pub const WORKPIECE_REJECT: Operation = keyed(Operation::post(
    path::WORKPIECE_REJECT,
    "workpiece_reject",
    "a person rejects a proposal: the file stays as it is",
))
.body(Body::json(schema::<Decision>).optional())
.answers(&[
    Answer::json("200", "the proposal, rejected", schema::<Proposal>),
    WORKPIECE_MISSING,
    Answer::json("409", "accepted already", ERROR),
]);

pub const CONTROL_GET: Operation = keyed(Operation::get(
    path::CONTROL,
    "control_get",
    "who holds the controls of the desktop, and the agent's pending request for a person",
))
.answers(&[Answer::json("200", "the controls", schema::<ControlView>)]);

pub const CONTROL_TAKE: Operation = keyed(Operation::post(
    path::CONTROL,
    "control_take",
    "a person takes the controls (an exclusive, expiring lease; its holder renews it with \
     x-berth-control): the agent's input and observations are refused with 409 \
     human_in_control until they hand back",
))
.body(Body::json(schema::<TakeControl>).optional())
.answers(&[
    Answer::json(
        "200",
        "held (the token only on a take)",
        schema::<ControlView>,
    ),
    Answer::json(
        "409",
        "another person holds them (control_held), or not running",
        ERROR,
    ),
]);

const FORCE: Param = Param::query(
    "force",
    boolean,
    "hand back a lease the caller does not hold",
);

pub const CONTROL_RETURN: Operation = keyed(Operation::delete(
    path::CONTROL,
    "control_return",
    "the holder hands the controls back (x-berth-control), or the API key with force",
))
.query(&[FORCE])
.answers(&[
    Answer::json("200", "handed back", schema::<ControlView>),
    Answer::json("409", "the caller does not hold them (not_holder)", ERROR),
]);

pub const CONTROL_DECLINE: Operation = keyed(Operation::post(
    path::CONTROL_DECLINE,
    "control_decline",
    "a person declines the agent's pending request for one",
))
.answers(&[
    Answer::json("200", "declined", schema::<ControlView>),
    Answer::json("409", "no request waiting", ERROR),
]);

pub const SANDBOX_ARTIFACT_PUBLISH: Operation = keyed(Operation::post(
    path::SANDBOX_ARTIFACTS,
    "sandbox_artifact_publish",
    "publish a file or directory (as a zip) of the sandbox as an artifact",
))
.body(Body::json(schema::<PublishArtifact>))
.answers(&[
    Answer::json("201", "the artifact", schema::<Artifact>),
    Answer::json("400", "a relative path or a bad name", ERROR),
    Answer::json("404", "no such sandbox, path or run", ERROR),
    Answer::json("409", "the sandbox is not running", ERROR),
    Answer::json(
        "413",
        "past artifact_max_file_bytes or artifact_max_entries",
        ERROR,
    ),
    Answer::json("502", "the agent failed", ERROR),
]);

const RUN_FILTER: Param = Param::query("run", |_| json!({"type": "string"}), "only this run's");

pub const SANDBOX_ARTIFACT_LIST: Operation = keyed(Operation::get(
    path::SANDBOX_ARTIFACTS,
    "sandbox_artifact_list",
    "the sandbox's artifacts (also after it was deleted)",
))
.query(&[RUN_FILTER])
.answers(&[Answer::json(
    "200",
    "the artifacts, oldest first",
    schema::<ArtifactList>,
)]);

pub const ARTIFACT_LIST: Operation = keyed(Operation::get(
    path::ARTIFACTS,
    "artifact_list",
    "artifacts",
))
.query(&[
    Param::query(
        "sandbox",
        |_| json!({"type": "string"}),
        "only this sandbox's",
    ),
    RUN_FILTER,
])
.answers(&[
    Answer::json("200", "the artifacts, oldest first", schema::<ArtifactList>),
    Answer::json("400", "an unknown query parameter", ERROR),
]);

pub const ARTIFACT_GET: Operation = keyed(Operation::get(
    path::ARTIFACT,
    "artifact_get",
    "an artifact's bytes (one Range honoured; ETag is its SHA-256)",
))
.answers(&[
    Answer::media("200", "the bytes, with the artifact's content type", ANY),
    Answer::media("206", "the range asked for", ANY),
    Answer::empty("304", "If-None-Match matched"),
    Answer::json("404", "no such artifact", ERROR),
    Answer::json("416", "the range cannot be served", ERROR),
]);

pub const ARTIFACT_DELETE: Operation = keyed(Operation::delete(
    path::ARTIFACT,
    "artifact_delete",
    "delete an artifact",
))
.answers(&[
    Answer::json("200", "the artifact deleted", schema::<Artifact>),
    Answer::json("404", "no such artifact", ERROR),
]);

// Through to the agent.

pub const SANDBOX_SCREENSHOT: Operation = keyed(Operation::get(
    path::SANDBOX_SCREENSHOT,
    "sandbox_screenshot",
    "the sandbox's screen",
))
.query(&[FORMAT, QUALITY, SCALE])
.answers(&[Answer::media("200", "the image", IMAGE), NOT_RUNNING]);

pub const SANDBOX_COMPUTER: Operation = keyed(Operation::post(
    path::SANDBOX_COMPUTER,
    "sandbox_computer",
    "a computer-use action (Anthropic's or OpenAI's) or a batch, run by the sandbox's agent",
))
.body(Body::json(schema::<ComputerBody>))
.answers(SANDBOX_COMPUTER_ANSWERS);

/// The agent's computer answers, and 409 when the sandbox is not running.
const SANDBOX_COMPUTER_ANSWERS: &[Answer] = &[
    NOT_RUNNING,
    COMPUTER_ANSWERS[0],
    COMPUTER_ANSWERS[1],
    COMPUTER_ANSWERS[2],
    COMPUTER_ANSWERS[3],
];

pub const SANDBOX_FILES_GET: Operation = keyed(Operation::get(
    path::SANDBOX_FILES,
    "sandbox_files_get",
    "download a file from the sandbox",
))
.query(&[PATH])
.answers(&[
    Answer::media("200", "the bytes", BYTES),
    Answer::media("206", "the requested range", BYTES),
    NOT_RUNNING,
]);

pub const SANDBOX_FILES_PUT: Operation = keyed(Operation::put(
    path::SANDBOX_FILES,
    "sandbox_files_put",
    "upload a file to the sandbox",
))
.query(&[PATH])
.body(Body::new("application/octet-stream", binary))
.answers(&[
    Answer::json("201", "written", schema::<UploadResult>),
    NOT_RUNNING,
]);

// The viewer: the API key or the viewer cookie.

pub const VNC_INDEX: Operation = keyed(Operation::get(
    path::VNC_INDEX,
    "sandbox_vnc_index",
    "the noVNC page",
))
.security(VIEWER)
.query(&[Param::query(
    "t",
    string,
    "a one-time viewer token (sets the cookie)",
)])
.answers(&[Answer::empty("303", "to the page")]);

pub const VNC_WS: Operation = keyed(Operation::get(
    path::VNC_WS,
    "sandbox_vnc_ws",
    "noVNC's WebSocket",
))
.security(VIEWER)
.answers(&[Answer::empty("101", "RFB over WebSocket")]);

pub const VNC_FILE: Operation = keyed(Operation::get(
    path::VNC_FILE,
    "sandbox_vnc_file",
    "noVNC's static files",
))
.security(VIEWER)
.answers(&[Answer::media("200", "the file", ANY)]);

pub const STREAM_MP4: Operation = keyed(Operation::get(
    path::STREAM_MP4,
    "sandbox_stream_mp4",
    "the live screen as fragmented MP4",
))
.security(VIEWER)
.answers(&[Answer::media("200", "the stream", MP4)]);

pub const STREAM_WS: Operation = keyed(Operation::get(
    path::STREAM,
    "sandbox_stream_ws",
    "the live screen over a WebSocket",
))
.security(VIEWER)
.answers(&[Answer::empty("101", "fragmented MP4 in binary messages")]);

// Relays: the sandbox's agent (its native API, the agent's token added here) and the preview
// of a port inside the sandbox (the API key or that port's cookie); MCP.

pub const SANDBOX_AGENT: Operation = Operation::relay(
    path::SANDBOX_AGENT,
    "sandbox_agent",
    "the sandbox's agent /v1/{path} (see the agent's document)",
)
.security(KEY);

const PREVIEW_SUMMARY: &str = "the preview of 127.0.0.1:{port} in the sandbox (HTTP, WebSocket)";

pub const SANDBOX_PREVIEW: Operation =
    Operation::relay(path::SANDBOX_PORT, "sandbox_preview", PREVIEW_SUMMARY).security(PREVIEW);

pub const SANDBOX_PREVIEW_ROOT: Operation = Operation::relay(
    path::SANDBOX_PORT_ROOT,
    "sandbox_preview_root",
    PREVIEW_SUMMARY,
)
.security(PREVIEW);

/// It redirects to [`SANDBOX_PREVIEW_ROOT`].
pub const SANDBOX_PREVIEW_BARE: Operation = Operation::relay(
    path::SANDBOX_PORT_BARE,
    "sandbox_preview_bare",
    PREVIEW_SUMMARY,
)
.security(PREVIEW);

pub const SANDBOX_MCP: Operation = Operation::mcp(
    path::SANDBOX_MCP,
    "sandbox_mcp",
    "the sandbox's MCP server (its agent's /mcp, relayed)",
)
.security(KEY);

pub const MCP: Operation = Operation::mcp(
    path::MCP,
    "controller_mcp",
    "MCP (Streamable HTTP): sandbox and lease tools",
)
.security(KEY);

pub const SANDBOX_PORT_URL: Operation = keyed(Operation::post(
    path::SANDBOX_PORT_URL,
    "sandbox_port_url",
    "a browser URL for a port's preview",
))
.body(Body::json(schema::<PortUrlRequest>).optional())
.answers(&[
    Answer::json(
        "201",
        "the URL (it sets the port's cookie)",
        schema::<PortUrl>,
    ),
    NOT_RUNNING,
]);

// The session view: minted with the API key, then the API key or the session cookie.

pub const SANDBOX_SESSION: Operation = keyed(Operation::post(
    path::SANDBOX_SESSION,
    "sandbox_session",
    "a one-time URL for the sandbox's session view",
))
.answers(&[Answer::json(
    "200",
    "the URL (it sets the session cookie once opened)",
    schema::<SessionUrl>,
)]);

pub const SESSION_PAGE: Operation = keyed(Operation::get(
    path::SESSION_INDEX,
    "sandbox_session_page",
    "the session view: desktop, terminal, files, timeline, artifacts, episode",
))
.security(SESSION)
.query(&[Param::query(
    "t",
    string,
    "a one-time session token (sets the cookie, then 303)",
)])
.answers(&[
    Answer::media("200", "the page", &[("text/html", string)]),
    Answer::empty("303", "to the page, the cookie set"),
]);

pub const SESSION_PATH: Operation = keyed(Operation::get(
    path::SESSION_PATH,
    "sandbox_session_path",
    "the session view's assets and its api/… routes (info, events, artifacts, \
     episode, workpieces and their pages, open, accept and reject, and the agent's pty, \
     fs/list, files and vnc/websockify)",
))
.security(SESSION)
.answers(&[Answer::media("200", "the asset or answer", ANY)]);

// Leases.

pub const LEASE_ACQUIRE: Operation = keyed(Operation::post(
    path::LEASES,
    "lease_acquire",
    "acquire a lease (idempotent per thread_id)",
))
.body(Body::json(schema::<AcquireLease>))
.answers(&[
    Answer::json("200", "the lease", schema::<Lease>),
    Answer::json("422", "valid but impossible", ERROR),
    Answer::json("503", "no capacity", ERROR),
]);

pub const LEASE_RENEW: Operation = keyed(Operation::post(
    path::LEASE_RENEW,
    "lease_renew",
    "extend a lease",
))
.body(Body::json(schema::<RenewLease>))
.answers(&[
    Answer::json("200", "the lease", schema::<Lease>),
    Answer::json("409", "released", ERROR),
]);

pub const LEASE_RELEASE: Operation = keyed(Operation::delete(
    path::LEASE,
    "lease_release",
    "release a lease (destroys its sandbox)",
))
.answers(&[Answer::json("200", "released", |_| {
    json!({"type": "object", "required": ["lease_id", "released"],
           "properties": {"lease_id": {"type": "string"}, "released": {"type": "boolean"}}})
})]);

// Images, catalog, pools.

pub const IMAGE_BUILD: Operation = keyed(Operation::post(
    path::IMAGES_BUILD,
    "image_build",
    "build an image (a job)",
))
.body(Body::json(schema::<BuildImage>))
.answers(&[
    Answer::json("200", "built already", schema::<ImageJob>),
    Answer::json("202", "building", schema::<ImageJob>),
]);

pub const IMAGE_JOB: Operation = keyed(Operation::get(path::IMAGE, "image_job", "an image job"))
    .answers(&[Answer::json("200", "the job", schema::<ImageJob>)]);

pub const CATALOG: Operation = keyed(Operation::get(path::CATALOG, "catalog", "the catalog"))
    .query(&[Param::query(
        "kind",
        |_| json!({"type": "string", "enum": ["profile", "desktop_app", "desktop_app_bundle"]}),
        "what to list (default profile)",
    )])
    .answers(&[Answer::json("200", "the entries", schema::<CatalogList>)]);

pub const POOLS: Operation = keyed(Operation::get(path::POOLS, "pools", "the warm pools"))
    .answers(&[Answer::json("200", "the pools", schema::<PoolList>)]);

pub const POOL_ADJUST: Operation = keyed(Operation::put(
    path::POOL,
    "pool_adjust",
    "pause or resize a warm pool",
))
.body(Body::json(schema::<AdjustPool>))
.answers(&[Answer::json("200", "the pools", schema::<PoolList>)]);

/// In the order the document lists them.
pub const ALL: &[&Operation] = &[
    &HEALTHZ,
    &METRICS,
    &OPENAPI,
    &SANDBOX_CREATE,
    &SANDBOX_LIST,
    &SANDBOX_GET,
    &SANDBOX_DELETE,
    &SANDBOX_VIEWER,
    &SANDBOX_EXEC,
    &RUN_GET,
    &RUN_OUTPUT,
    &SANDBOX_EVENTS,
    &SANDBOX_EPISODE,
    &GITHUB_REPOSITORIES,
    &SANDBOX_GITHUB_CLONE,
    &SANDBOX_GITHUB_PULLS,
    &SANDBOX_GITHUB_PULL,
    &SANDBOX_GITHUB_ISSUES,
    &SANDBOX_GITHUB_ISSUE,
    &SANDBOX_LOGIN_SITES,
    &SANDBOX_LOGIN,
    &WORKPIECE_LIST,
    &WORKPIECE_CREATE,
    &WORKPIECE_GET,
    &WORKPIECE_CONTENT,
    &WORKPIECE_VERSION_PAGE,
    &WORKPIECE_OPEN,
    &WORKPIECE_PROPOSE,
    &WORKPIECE_PROPOSALS,
    &WORKPIECE_PROPOSAL,
    &WORKPIECE_PROPOSAL_PAGE,
    &WORKPIECE_ACCEPT,
    &WORKPIECE_REJECT,
    &CONTROL_GET,
    &CONTROL_TAKE,
    &CONTROL_RETURN,
    &CONTROL_DECLINE,
    &SANDBOX_ARTIFACT_PUBLISH,
    &SANDBOX_ARTIFACT_LIST,
    &ARTIFACT_LIST,
    &ARTIFACT_GET,
    &ARTIFACT_DELETE,
    &SANDBOX_SCREENSHOT,
    &SANDBOX_COMPUTER,
    &SANDBOX_FILES_GET,
    &SANDBOX_FILES_PUT,
    &VNC_INDEX,
    &VNC_WS,
    &VNC_FILE,
    &STREAM_MP4,
    &STREAM_WS,
    &SANDBOX_AGENT,
    &SANDBOX_PREVIEW,
    &SANDBOX_PREVIEW_ROOT,
    &SANDBOX_PREVIEW_BARE,
    &SANDBOX_MCP,
    &MCP,
    &SANDBOX_PORT_URL,
    &SANDBOX_SESSION,
    &SESSION_PAGE,
    &SESSION_PATH,
    &LEASE_ACQUIRE,
    &LEASE_RENEW,
    &LEASE_RELEASE,
    &IMAGE_BUILD,
    &IMAGE_JOB,
    &CATALOG,
    &POOLS,
    &POOL_ADJUST,
];

pub fn security_schemes() -> Value {
    json!({
        "apiKey": {"type": "apiKey", "in": "header", "name": "X-Api-Key"},
        "viewerCookie": {"type": "apiKey", "in": "cookie", "name": "berth_viewer"},
        "previewCookie": {"type": "apiKey", "in": "cookie", "name": "berth_port",
                          "description": "set by the URL of POST …/ports/{port}/url"},
        "sessionCookie": {"type": "apiKey", "in": "cookie", "name": "berth_session",
                          "description": "set by the URL of POST …/{id}/session"},
    })
}
