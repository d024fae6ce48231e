//! The controls (a person taking them, the agent asking for one) and what the session view's
//! panes read: the browser's tabs and the repositories' changes.

use serde_json::json;

use super::super::{Answer, Body, ERROR, Operation, Param, Schema, int, schema, string};
use super::v1;
use crate::control::{
    AgentControl, ControlGrant, ControlKey, ControlSettings, HumanRequest, HumanRequestAnswer,
};
use crate::login::{BrowserForget, BrowserForgotten, BrowserLogin, BrowserLoginResult};
use crate::routes::native as path;
use crate::workspace::{BrowserTabs, FileDiff, GitRepos};

const JPEG: &[(&str, Schema)] = &[(
    "image/jpeg",
    |_| json!({"type": "string", "contentMediaType": "image/jpeg"}),
)];

pub const CONTROL_GET: Operation = v1(Operation::get(
    path::CONTROL,
    "control_get",
    "whether a person holds the controls, and the pending request for one",
))
.answers(&[Answer::json("200", "the controls", schema::<AgentControl>)]);

pub const CONTROL_PUT: Operation = v1(Operation::put(
    path::CONTROL,
    "control_put",
    "a person holds the controls (the controller's push): input and observation routes \
     refuse every other caller with 409 human_in_control until the lease ends",
))
.body(Body::json(schema::<ControlGrant>))
.answers(&[
    Answer::json("200", "held", schema::<AgentControl>),
    Answer::json(
        "403",
        "the controller's key is set and this call lacks it",
        ERROR,
    ),
]);

pub const CONTROL_DELETE: Operation = v1(Operation::delete(
    path::CONTROL,
    "control_delete",
    "the person handed back (the controller's push)",
))
.answers(&[
    Answer::json("200", "handed back", schema::<AgentControl>),
    Answer::json(
        "403",
        "the controller's key is set and this call lacks it",
        ERROR,
    ),
]);

pub const CONTROL_SETTINGS: Operation = v1(Operation::put(
    path::CONTROL_SETTINGS,
    "control_settings",
    "whether the agent may ask for a person (the controller's push)",
))
.body(Body::json(schema::<ControlSettings>))
.answers(&[
    Answer::json("200", "set", schema::<AgentControl>),
    Answer::json(
        "403",
        "the controller's key is set and this call lacks it",
        ERROR,
    ),
]);

pub const CONTROL_REQUEST: Operation = v1(Operation::post(
    path::CONTROL_REQUEST,
    "control_request",
    "ask for a person (request_human_control): answers once a person took the controls and \
     handed them back, declined, or the wait ended",
))
.body(Body::json(schema::<HumanRequest>))
.answers(&[
    Answer::json("200", "how it ended", schema::<HumanRequestAnswer>),
    Answer::json("403", "the sandbox does not enable requests", ERROR),
    Answer::json("409", "a request is already waiting", ERROR),
]);

pub const CONTROL_DECLINE: Operation = v1(Operation::post(
    path::CONTROL_DECLINE,
    "control_decline",
    "a person declined the pending request (the controller's push)",
))
.answers(&[
    Answer::json("200", "declined", schema::<AgentControl>),
    Answer::json(
        "403",
        "the controller's key is set and this call lacks it",
        ERROR,
    ),
]);

pub const CONTROL_KEY_PUT: Operation = v1(Operation::put(
    path::CONTROL_KEY,
    "control_key_put",
    "the controller claims the controls' pushes (once): from then on they need its key in \
     x-berth-control-key",
))
.body(Body::json(schema::<ControlKey>))
.answers(&[
    Answer::json("200", "the key holds", schema::<AgentControl>),
    Answer::json("409", "another key holds", ERROR),
]);

pub const BROWSER_LOGIN: Operation = v1(Operation::post(
    path::BROWSER_LOGIN,
    "browser_login",
    "sign the desktop's browser in to a site (the controller's login tool; its key only): the \
     form filled over CDP, the password only into a masked field, the answer a fixed phrase",
))
.body(Body::json(schema::<BrowserLogin>))
.answers(&[
    Answer::json("200", "how it went", schema::<BrowserLoginResult>),
    Answer::json("400", "a bad URL, value or bound", ERROR),
    Answer::json("403", "without the controller's key", ERROR),
]);

pub const BROWSER_FORGET: Operation = v1(Operation::post(
    path::BROWSER_FORGET,
    "browser_forget",
    "the browser's cookies and storage of these hosts cleared (the controller's key only)",
))
.body(Body::json(schema::<BrowserForget>))
.answers(&[
    Answer::json("200", "cleared", schema::<BrowserForgotten>),
    Answer::json("403", "without the controller's key", ERROR),
    Answer::json("503", "no browser", ERROR),
]);

pub const BROWSER_TABS: Operation = v1(Operation::get(
    path::BROWSER_TABS,
    "browser_tabs",
    "the browser's tabs: title, URL, the active one",
))
.answers(&[
    Answer::json("200", "the tabs", schema::<BrowserTabs>),
    Answer::json("503", "no browser", ERROR),
]);

pub const BROWSER_TAB_SCREENSHOT: Operation = v1(Operation::get(
    path::BROWSER_TAB_SCREENSHOT,
    "browser_tab_screenshot",
    "a tab's page as a JPEG",
))
.answers(&[
    Answer::media("200", "the page", JPEG),
    Answer::json("404", "no such tab", ERROR),
    Answer::json("503", "no browser", ERROR),
]);

const REPO: Param = Param::required("repo", string, "the repository's directory, as listed");
const FILE: Param = Param::required("path", string, "the file's path in the repository");

pub const GIT_REPOS: Operation = v1(Operation::get(
    path::GIT_REPOS,
    "git_repos",
    "the git repositories under the sandbox user's working directory and their changes",
))
.answers(&[Answer::json("200", "the repositories", schema::<GitRepos>)]);

pub const GIT_DIFF: Operation = v1(Operation::get(
    path::GIT_DIFF,
    "git_diff",
    "one file's unified diff from its repository's base: whole, or past 512 KiB its first and \
     last lines (preview) with the rest read by range (offset, max_bytes); binary files named",
))
.query(&[
    REPO,
    FILE,
    Param::query("offset", int, "a huge diff's part from this byte"),
    Param::query(
        "max_bytes",
        int,
        "the part's most bytes (default and at most 512 KiB)",
    ),
])
.answers(&[
    Answer::json("200", "the diff", schema::<FileDiff>),
    Answer::json(
        "400",
        "a path outside the repository, or an offset past the end",
        ERROR,
    ),
    Answer::json("404", "no such repository", ERROR),
]);
