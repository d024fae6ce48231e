//! The guarded login tool: the controller signs a sandbox's own browser in to a site of its
//! `[[login]]` config, handing the agent the values to fill over CDP. The answers, events and
//! lists here carry names and outcomes only, never a value.

use serde::{Deserialize, Serialize};

/// Error code: the sandbox's run does not enable that site (or any).
pub const LOGIN_NOT_ENABLED: &str = "login_not_enabled";
/// Error code: the site's host is not on the sandbox's egress allow list.
pub const LOGIN_HOST_REFUSED: &str = "login_host_refused";
/// Error code: the run used the site as often as its `max_uses` lets it.
pub const LOGIN_LIMIT: &str = "login_limit";
/// Error code: the call did not carry the controller's key (the agent's login routes).
pub const LOGIN_CONTROLLER_ONLY: &str = "login_controller_only";

/// The longest a login waits for its page, its form and the site's sign of success.
pub const MAX_LOGIN_TIMEOUT_MS: u64 = 120_000;
/// The default wait.
pub const DEFAULT_LOGIN_TIMEOUT_MS: u64 = 30_000;
/// How long the agent waits for the desktop's browser to come up before a login's own wait
/// (its page, form and sign of success) starts: a first start on a loaded host is slow.
pub const BROWSER_WAIT_MS: u64 = 20_000;
/// The longest value a login fills.
pub const MAX_VALUE_BYTES: usize = 4096;

/// How one field or control is found on the page. Given several, an element must match all;
/// none given, the tool's default for that field applies.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Locator {
    /// A CSS selector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The element's `autocomplete` attribute (`username`, `current-password`,
    /// `one-time-code`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autocomplete: Option<String>,
    /// Its accessible name: its label's text, `aria-label`, `placeholder`, `title`, or a
    /// button's text (compared without case, surrounding space ignored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Locator {
    pub fn is_empty(&self) -> bool {
        self.selector.is_none() && self.autocomplete.is_none() && self.name.is_none()
    }
}

/// Where the form's parts are: by default an ordinary login form is found (a visible
/// password field, the user-name field before it, its form's submit control; a one-time-code
/// field by `autocomplete="one-time-code"` or its name).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginForm {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<Locator>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<Locator>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submit: Option<Locator>,
    /// The one-time-code field (a site with a TOTP secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<Locator>,
    /// The control that sends the code (default: its form's submit control).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_submit: Option<Locator>,
}

/// How success is recognised: every sign given must hold. None given, success is a page
/// without a password field on the site's host.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginSuccess {
    /// The page's URL starts with this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// A CSS selector that matches an element of the page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub element: Option<String>,
    /// A cookie by this name is set for the site.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<String>,
}

impl LoginSuccess {
    pub fn is_empty(&self) -> bool {
        self.url.is_none() && self.element.is_none() && self.cookie.is_none()
    }
}

/// How a login ended. Each has one fixed phrase ([`LoginOutcome::phrase`]); nothing of the
/// page or of a value is ever added to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LoginOutcome {
    SignedIn,
    /// The login page did not load (or answered an error).
    PageNotLoaded,
    /// No login form on the page.
    FormNotFound,
    /// The password field shows what is typed (not `type="password"`): nothing was typed.
    FieldNotMasked,
    /// The site asked for no one-time code where one was expected.
    CodeFieldNotFound,
    /// The site gave no sign of success within the wait.
    NoSuccess,
    /// The desktop's browser is not running.
    BrowserDown,
}

impl LoginOutcome {
    pub fn phrase(self) -> &'static str {
        match self {
            LoginOutcome::SignedIn => "Signed in.",
            LoginOutcome::PageNotLoaded => "Not signed in: the login page did not load.",
            LoginOutcome::FormNotFound => {
                "Not signed in: no login form was found on the login page; nothing was typed."
            }
            LoginOutcome::FieldNotMasked => {
                "Not signed in: the password field does not mask what is typed; nothing was typed."
            }
            LoginOutcome::CodeFieldNotFound => {
                "Not signed in: the site asked for no one-time code where one was expected."
            }
            LoginOutcome::NoSuccess => {
                "Not signed in: the site gave no sign of success within the wait."
            }
            LoginOutcome::BrowserDown => "Not signed in: the desktop's browser is not running.",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            LoginOutcome::SignedIn => "signed_in",
            LoginOutcome::PageNotLoaded => "page_not_loaded",
            LoginOutcome::FormNotFound => "form_not_found",
            LoginOutcome::FieldNotMasked => "field_not_masked",
            LoginOutcome::CodeFieldNotFound => "code_field_not_found",
            LoginOutcome::NoSuccess => "no_success",
            LoginOutcome::BrowserDown => "browser_down",
        }
    }
}

/// `POST /v1/browser/login` (the agent; the controller's key only): sign the desktop's
/// browser in. The values are used once and kept nowhere.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserLogin {
    /// The login page (`https://…`).
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    pub password: String,
    /// The current one-time code, when the site asks for one after the password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(default)]
    pub form: LoginForm,
    #[serde(default)]
    pub success: LoginSuccess,
    /// The whole login's bound (1 ms – [`MAX_LOGIN_TIMEOUT_MS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

impl std::fmt::Debug for BrowserLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrowserLogin")
            .field("url", &self.url)
            .field("form", &self.form)
            .field("success", &self.success)
            .finish_non_exhaustive()
    }
}

impl BrowserLogin {
    /// The bound, or why the request cannot be served (a name or a number, never a value).
    pub fn checked(&self) -> Result<std::time::Duration, String> {
        if !(self.url.starts_with("https://") || self.url.starts_with("http://")) {
            return Err("url must be an http:// or https:// URL".into());
        }
        let long = |v: &Option<String>| v.as_ref().is_some_and(|v| v.len() > MAX_VALUE_BYTES);
        if self.password.is_empty() || self.password.len() > MAX_VALUE_BYTES {
            return Err(format!("password must be 1-{MAX_VALUE_BYTES} bytes"));
        }
        if long(&self.username) || long(&self.code) {
            return Err(format!("values must be at most {MAX_VALUE_BYTES} bytes"));
        }
        let ms = self.timeout_ms.unwrap_or(DEFAULT_LOGIN_TIMEOUT_MS);
        if !(1..=MAX_LOGIN_TIMEOUT_MS).contains(&ms) {
            return Err(format!("timeout_ms must be 1-{MAX_LOGIN_TIMEOUT_MS}"));
        }
        Ok(std::time::Duration::from_millis(ms))
    }
}

/// The agent's answer to a login.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct BrowserLoginResult {
    pub outcome: LoginOutcome,
    /// The outcome's fixed phrase.
    pub message: String,
}

/// `POST /v1/browser/forget` (the agent; the controller's key only): the browser's cookies
/// and storage of these hosts (and their subdomains) cleared.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserForget {
    pub hosts: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct BrowserForgotten {
    /// Cookies deleted.
    pub cookies: u64,
}

/// `POST /sandbox/sandboxes/v1/{id}/login`: sign the sandbox's browser in to an enabled site.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginRequest {
    /// The site's name in the controller's `[[login]]` config.
    pub site: String,
}

/// How a login went: names and counts only.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct LoginAnswer {
    pub site: String,
    pub outcome: LoginOutcome,
    /// The outcome's fixed phrase.
    pub message: String,
    pub signed_in: bool,
    /// The run the login counts against (a lease's acquire, or the sandbox).
    pub run: String,
    /// Logins to this site in this run, this one included, and the most it allows.
    pub uses: u32,
    pub max_uses: u32,
}

/// One site a run may sign in to.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct LoginSiteView {
    pub name: String,
    pub host: String,
    pub url: String,
    pub uses: u32,
    pub max_uses: u32,
    /// What the config says the site is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// `GET /sandbox/sandboxes/v1/{id}/login`: the sites the sandbox's run enables.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct LoginSites {
    pub run: String,
    pub sites: Vec<LoginSiteView>,
}

/// What the agent's MCP server lists as the `login` tool: the names the run enables (the
/// controller's push), never a value.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
pub struct LoginTool {
    pub sites: Vec<String>,
}

/// A login site's name: 1-64 of `a-z`, `0-9`, `-`, `_` (pure).
pub fn name_ok(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// The MCP tool's name and its description for `sites`.
pub const TOOL: &str = "login";

pub fn tool_description(sites: &[String]) -> String {
    format!(
        "Sign the desktop's browser in to a site this run enables ({}), without seeing the \
         password: the controller fills the site's login form itself and answers whether it \
         worked. The browser then shows the signed-in page; continue from there. Give the \
         site's name.",
        sites.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_login_request_never_prints_its_values() {
        let l = BrowserLogin {
            url: "https://x.test/login".into(),
            username: Some("alice-user".into()),
            password: "pw-secret".into(),
            code: Some("123456".into()),
            form: LoginForm::default(),
            success: LoginSuccess::default(),
            timeout_ms: None,
        };
        let s = format!("{l:?}");
        assert!(!s.contains("pw-secret") && !s.contains("alice-user") && !s.contains("123456"));
        assert!(l.checked().is_ok());
        let bad = BrowserLogin {
            url: "file:///etc/passwd".into(),
            ..l.clone()
        };
        assert!(bad.checked().is_err());
        let long = BrowserLogin {
            password: "x".repeat(MAX_VALUE_BYTES + 1),
            ..l.clone()
        };
        let e = long.checked().unwrap_err();
        assert!(!e.contains("xxx"), "{e}");
        let slow = BrowserLogin {
            timeout_ms: Some(MAX_LOGIN_TIMEOUT_MS + 1),
            ..l
        };
        assert!(slow.checked().is_err());
    }

    #[test]
    fn every_outcome_has_a_fixed_phrase() {
        for o in [
            LoginOutcome::SignedIn,
            LoginOutcome::PageNotLoaded,
            LoginOutcome::FormNotFound,
            LoginOutcome::FieldNotMasked,
            LoginOutcome::CodeFieldNotFound,
            LoginOutcome::NoSuccess,
            LoginOutcome::BrowserDown,
        ] {
            let wire = serde_json::to_value(o).unwrap();
            assert_eq!(wire, o.as_str());
            assert!(o.phrase().ends_with('.'));
        }
    }
}
