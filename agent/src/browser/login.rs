//! The login tool's hands: the controller hands over a site's values, and the desktop's browser
//! is signed in over CDP — a tab opened on the login page, the form found (by the site's
//! locators, else the way an ordinary login form is laid out), the user name and the password
//! typed with `Input.insertText` (the password only into a field that masks it), the form sent,
//! then a one-time code when the site asks for one, until the site's sign of success.
//!
//! The values live in this call's memory only: never logged, put in an event, written to a file
//! or answered; the answer is one of [`LoginOutcome`]'s fixed phrases. The tab stays open on the
//! signed-in page.

use std::sync::Arc;
use std::time::Duration;

use berth_protocol::login::{BrowserLogin, Locator, LoginOutcome, LoginSuccess};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::client::Client;
use crate::desktop::Desktop;

/// How often the page is looked at while waiting for a form, a code field or success.
const POLL: Duration = Duration::from_millis(200);
/// The longest a login waits for its form to appear once the page loaded.
const FORM_WAIT: Duration = Duration::from_secs(10);

/// Finds a login form's part on the page: `(kind, locator)` → the element or `null`. Kinds:
/// `username`, `password`, `submit`, `code`, `code_submit`. Holds no value, only locators.
const FIND: &str = r#"(function (kind, loc, codeLoc) {
  const visible = el => {
    if (!el || el.disabled) return false;
    const r = el.getBoundingClientRect();
    const st = getComputedStyle(el);
    return r.width > 0 && r.height > 0 && st.visibility !== 'hidden' && st.display !== 'none';
  };
  const norm = s => (s || '').trim().replace(/\s+/g, ' ').toLowerCase();
  const names = el => {
    const out = [];
    if (el.labels) for (const l of el.labels) out.push(l.innerText);
    const by = el.getAttribute('aria-labelledby');
    if (by) for (const id of by.split(/\s+/)) { const e = document.getElementById(id); if (e) out.push(e.innerText); }
    for (const a of ['aria-label', 'placeholder', 'title', 'name', 'id']) if (el.getAttribute(a)) out.push(el.getAttribute(a));
    if (el.tagName === 'BUTTON' || el.getAttribute('role') === 'button') out.push(el.innerText);
    if (el.tagName === 'INPUT' && (el.type === 'submit' || el.type === 'button')) out.push(el.value);
    return out.map(norm);
  };
  const auto = el => norm(el.getAttribute('autocomplete')).split(' ');
  const matches = (el, l) =>
    (!l.selector || el.matches(l.selector)) &&
    (!l.autocomplete || auto(el).includes(norm(l.autocomplete))) &&
    (!l.name || names(el).includes(norm(l.name)));
  const all = sel => Array.from(document.querySelectorAll(sel)).filter(visible);
  const fields = () => all('input:not([type=hidden]):not([type=checkbox]):not([type=radio]):not([type=submit]):not([type=button]):not([type=image]), textarea');
  const buttons = () => all('button, input[type=submit], input[type=button], input[type=image], [role=button]');
  const given = l => l && (l.selector || l.autocomplete || l.name);
  const pick = (pool, l) => pool.find(el => matches(el, l)) || null;
  // A masked field first; else one that says it is the password (the caller then refuses
  // to type into it: it does not mask).
  const password = () => {
    const fs = fields();
    const pw = fs.filter(el => el.type === 'password');
    return pw.find(el => !auto(el).includes('new-password')) || pw[0]
      || fs.find(el => auto(el).includes('current-password') || auto(el).includes('new-password')
                       || /\bpass(word)?\b|passwort|contrase|mot de passe/.test(names(el).join(' ')))
      || null;
  };
  const code = () => {
    if (given(codeLoc)) return pick(codeLoc.selector ? all(codeLoc.selector) : fields(), codeLoc);
    const fs = fields().filter(el => el.type !== 'password');
    return fs.find(el => auto(el).includes('one-time-code'))
      || fs.find(el => /one.?time|otp|totp|2fa|two.?factor|verification|authenticat|passcode|\bcode\b/.test(names(el).join(' ')))
      || null;
  };
  const submitOf = ref => {
    const form = ref && ref.form;
    const bs = buttons().filter(b => !form || b.form === form || form.contains(b));
    return bs.find(b => b.type === 'submit')
      || bs.find(b => /(sign|log) ?in|continue|next|submit|verify|confirm/.test(names(b).join(' ')))
      || bs[0] || null;
  };
  if (given(loc)) {
    const pool = (kind === 'submit' || kind === 'code_submit')
      ? (loc.selector ? all(loc.selector) : buttons())
      : (loc.selector ? all(loc.selector) : fields());
    return pick(pool, loc);
  }
  switch (kind) {
    case 'password': return password();
    case 'code': return code();
    case 'submit': return submitOf(password() || fields()[0]);
    case 'code_submit': return submitOf(code());
    case 'username': {
      const fs = fields();
      const ac = fs.find(el => auto(el).includes('username') || auto(el).includes('email'));
      if (ac) return ac;
      const pw = password();
      const scope = pw && pw.form ? fs.filter(el => el.form === pw.form) : fs;
      const before = scope.filter(el => el.type !== 'password'
        && (!pw || (el.compareDocumentPosition(pw) & Node.DOCUMENT_POSITION_FOLLOWING))
        && ['text', 'email', 'tel', ''].includes(el.type));
      return before.length ? before[before.length - 1] : null;
    }
  }
  return null;
})"#;

/// The page's state for the success check: its URL, whether an element matches, whether a
/// password field shows.
const STATE: &str = r#"(function (element) {
  const shown = el => { const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  let found = false;
  try { found = !!(element && document.querySelector(element)); } catch (e) { found = false; }
  const pw = Array.from(document.querySelectorAll('input[type=password]')).some(shown);
  return [location.href, found, pw, document.readyState];
})"#;

/// One tab of the desktop's browser, attached.
struct Tab {
    c: Arc<Client>,
    session: String,
}

impl Tab {
    async fn cdp(&self, method: &str, params: Value) -> Result<Value, ()> {
        self.c
            .call(method, params, Some(&self.session))
            .await
            .map_err(|_| ())
    }

    /// `FIND` for `kind`: the element's remote object id, if there is one.
    async fn find(
        &self,
        kind: &str,
        loc: Option<&Locator>,
        code: Option<&Locator>,
    ) -> Option<String> {
        let expr = format!(
            "{FIND}({}, {}, {})",
            json!(kind),
            json!(loc.cloned().unwrap_or_default()),
            json!(code.cloned().unwrap_or_default())
        );
        let v = self
            .cdp("Runtime.evaluate", json!({"expression": expr}))
            .await
            .ok()?;
        v["result"]["objectId"].as_str().map(str::to_string)
    }

    /// Calls `f` (a function's source) with `this` the element.
    async fn on(&self, object: &str, f: &str) -> Result<Value, ()> {
        let v = self
            .cdp(
                "Runtime.callFunctionOn",
                json!({"objectId": object, "functionDeclaration": f, "returnByValue": true}),
            )
            .await?;
        Ok(v["result"]["value"].clone())
    }

    /// Types `value` into the field as a person would paste it: focused, its text selected
    /// and replaced, `input` and `change` fired. The value goes only into `Input.insertText`.
    async fn fill(&self, object: &str, value: &str) -> Result<(), ()> {
        self.on(
            object,
            "function () { this.scrollIntoView({block: 'center'}); this.focus(); \
             if (this.select) this.select(); }",
        )
        .await?;
        self.cdp("Input.insertText", json!({"text": value})).await?;
        let n = self
            .on(
                object,
                "function () { this.dispatchEvent(new Event('change', {bubbles: true})); \
                 return this.value.length; }",
            )
            .await?;
        // The field took it whole (a length, never the value, comes back).
        match n.as_u64() == Some(value.chars().count() as u64) {
            true => Ok(()),
            false => Err(()),
        }
    }

    /// Sends the form: its submit control clicked, else the field's form submitted.
    async fn send(&self, submit: Option<String>, field: &str) -> Result<(), ()> {
        match submit {
            Some(b) => self
                .on(&b, "function () { this.click(); }")
                .await
                .map(|_| ()),
            None => self
                .on(
                    field,
                    "function () { if (this.form) { this.form.requestSubmit ? \
                     this.form.requestSubmit() : this.form.submit(); } }",
                )
                .await
                .map(|_| ()),
        }
    }

    /// The page's `[url, element found, password shown, readyState]`.
    async fn state(&self, success: &LoginSuccess) -> Option<(String, bool, bool, bool)> {
        let expr = format!("{STATE}({})", json!(success.element));
        let v = self
            .cdp(
                "Runtime.evaluate",
                json!({"expression": expr, "returnByValue": true}),
            )
            .await
            .ok()?;
        let v = &v["result"]["value"];
        Some((
            v[0].as_str().unwrap_or_default().to_string(),
            v[1].as_bool().unwrap_or(false),
            v[2].as_bool().unwrap_or(false),
            v[3] == "complete",
        ))
    }

    /// Closes the tab (a page opened only to reach its calls).
    async fn close(&self) -> Result<Value, ()> {
        let info = self.cdp("Target.getTargetInfo", json!({})).await?;
        let target = info["targetInfo"]["targetId"].clone();
        self.c
            .call("Target.closeTarget", json!({"targetId": target}), None)
            .await
            .map_err(|_| ())
    }

    async fn cookie_names(&self, url: &str) -> Vec<String> {
        let Ok(v) = self.cdp("Network.getCookies", json!({"urls": [url]})).await else {
            return Vec::new();
        };
        v["cookies"]
            .as_array()
            .map(|cs| {
                cs.iter()
                    .filter_map(|c| c["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Whether the page shows the site's sign of success (pure): every sign given holds; none
/// given, the page is on the site's host, past the login page, with no password field.
pub fn succeeded(
    s: &LoginSuccess,
    login_url: &str,
    url: &str,
    element: bool,
    password_shown: bool,
    cookies: &[String],
) -> bool {
    if s.is_empty() {
        let host = berth_protocol::egress::url_host;
        return host(url).is_some()
            && host(url) == host(login_url)
            && url != login_url
            && !password_shown;
    }
    s.url.as_ref().is_none_or(|u| url.starts_with(u.as_str()))
        && (s.element.is_none() || element)
        && s.cookie
            .as_ref()
            .is_none_or(|c| cookies.iter().any(|n| n == c))
}

/// Signs the desktop's browser in as `req` says; how it went. Bounded by `within` once the
/// browser is up (it has [`BROWSER_WAIT_MS`](berth_protocol::login::BROWSER_WAIT_MS) to come up).
pub async fn login(desktop: &Arc<Desktop>, req: &BrowserLogin, within: Duration) -> LoginOutcome {
    let wait = Duration::from_millis(berth_protocol::login::BROWSER_WAIT_MS);
    let Some(dt) = desktop.browser(wait).await else {
        return LoginOutcome::BrowserDown;
    };
    let deadline = Instant::now() + within;
    let Ok(c) = Client::connect(&format!("ws://127.0.0.1:{}{}", dt.port, dt.browser_path)).await
    else {
        return LoginOutcome::BrowserDown;
    };
    let outcome = match open_tab(&c).await {
        Some(tab) => run(&tab, req, deadline).await,
        None => LoginOutcome::BrowserDown,
    };
    c.close().await;
    outcome
}

/// A new tab in front, attached, its events on.
async fn open_tab(c: &Arc<Client>) -> Option<Tab> {
    let v = c
        .call("Target.createTarget", json!({"url": "about:blank"}), None)
        .await
        .ok()?;
    let target = v["targetId"].as_str()?.to_string();
    let _ = c
        .call("Target.activateTarget", json!({"targetId": target}), None)
        .await;
    let v = c
        .call(
            "Target.attachToTarget",
            json!({"targetId": target, "flatten": true}),
            None,
        )
        .await
        .ok()?;
    let session = v["sessionId"].as_str()?.to_string();
    for m in ["Page.enable", "Runtime.enable", "Network.enable"] {
        let _ = c.call(m, json!({}), Some(&session)).await;
    }
    Some(Tab {
        c: c.clone(),
        session,
    })
}

async fn run(tab: &Tab, req: &BrowserLogin, deadline: Instant) -> LoginOutcome {
    match sign_in(tab, req, deadline).await {
        Ok(()) => until_success(tab, req, deadline).await,
        Err(o) => o,
    }
}

/// The login page loaded, its form found and sent: the user (on its own first page when the
/// site asks for it first) and the password, typed only into a field that masks it.
async fn sign_in(tab: &Tab, req: &BrowserLogin, deadline: Instant) -> Result<(), LoginOutcome> {
    let nav = tab.cdp("Page.navigate", json!({"url": req.url})).await.ok();
    match &nav {
        None => {
            tracing::warn!("login: the browser did not navigate to the login page");
            return Err(LoginOutcome::PageNotLoaded);
        }
        Some(v) if v["errorText"].is_string() => {
            // The browser's own reason (`net::ERR_…`), never a value.
            tracing::warn!(error = %v["errorText"], "login: the login page did not load");
            return Err(LoginOutcome::PageNotLoaded);
        }
        Some(_) => {}
    }
    let form = &req.form;
    let (password, two_step) = find_password(tab, req, deadline).await?;
    let masked = tab
        .on(
            &password,
            "function () { return this.type === 'password'; }",
        )
        .await;
    if masked.ok() != Some(Value::Bool(true)) {
        return Err(LoginOutcome::FieldNotMasked);
    }
    if !two_step && let Some(user) = &req.username {
        let Some(u) = tab.find("username", form.username.as_ref(), None).await else {
            return Err(LoginOutcome::FormNotFound);
        };
        tab.fill(&u, user)
            .await
            .map_err(|_| LoginOutcome::FormNotFound)?;
    }
    let submit = tab.find("submit", form.submit.as_ref(), None).await;
    if tab.fill(&password, &req.password).await.is_err()
        || tab.send(submit, &password).await.is_err()
    {
        return Err(LoginOutcome::FormNotFound);
    }
    Ok(())
}

/// The password field (waiting a little for a page that draws its form late), and whether the
/// user was sent first on a page of its own.
async fn find_password(
    tab: &Tab,
    req: &BrowserLogin,
    deadline: Instant,
) -> Result<(String, bool), LoginOutcome> {
    let form = &req.form;
    let until = deadline.min(Instant::now() + FORM_WAIT);
    let mut two_step = false;
    loop {
        if let Some(p) = tab.find("password", form.password.as_ref(), None).await {
            return Ok((p, two_step));
        }
        if req.username.is_some()
            && !two_step
            && let Some(u) = tab.find("username", form.username.as_ref(), None).await
            && loaded(tab).await
        {
            // The user first, then the password on the next page.
            let submit = tab.find("submit", form.submit.as_ref(), None).await;
            if tab
                .fill(&u, req.username.as_deref().unwrap_or_default())
                .await
                .is_err()
                || tab.send(submit, &u).await.is_err()
            {
                return Err(LoginOutcome::FormNotFound);
            }
            two_step = true;
        }
        if Instant::now() >= until {
            return Err(LoginOutcome::FormNotFound);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// After the form was sent: the one-time code when the site asks for it, until the site's
/// sign of success or the bound.
async fn until_success(tab: &Tab, req: &BrowserLogin, deadline: Instant) -> LoginOutcome {
    let form = &req.form;
    let mut code_sent = req.code.is_none();
    let mut settle_until = Instant::now();
    let mut last = None;
    loop {
        tokio::time::sleep(POLL).await;
        let state = tab.state(&req.success).await;
        if let Some((url, element, pw, complete)) = &state {
            last = Some((page_of(url), *element, *pw, *complete));
        }
        if let Some((url, element, pw, complete)) = state
            && complete
            && Instant::now() >= settle_until
        {
            let cookies = match &req.success.cookie {
                Some(_) => tab.cookie_names(&url).await,
                None => Vec::new(),
            };
            let done = succeeded(&req.success, &req.url, &url, element, pw, &cookies);
            // Signed in, with the code typed or without being asked for one.
            if done {
                return LoginOutcome::SignedIn;
            }
            if !code_sent && let Some(field) = tab.find("code", form.code.as_ref(), None).await {
                let submit = tab
                    .find("code_submit", form.code_submit.as_ref(), form.code.as_ref())
                    .await;
                let code = req.code.as_deref().unwrap_or_default();
                if tab.fill(&field, code).await.is_err() || tab.send(submit, &field).await.is_err()
                {
                    return LoginOutcome::CodeFieldNotFound;
                }
                code_sent = true;
                settle_until = Instant::now() + POLL;
                continue;
            }
        }
        if Instant::now() >= deadline {
            // Where the page was left: its origin and path, never a query or a value.
            let (page, element, password_shown, complete) = last.unwrap_or_default();
            tracing::warn!(
                page,
                element,
                password_shown,
                complete,
                code_sent,
                "login: no sign of success within the wait"
            );
            return match code_sent {
                true => LoginOutcome::NoSuccess,
                false => LoginOutcome::CodeFieldNotFound,
            };
        }
    }
}

/// A page's URL without its query or fragment (which a form sent by GET would fill with values).
fn page_of(url: &str) -> String {
    url.split(['?', '#']).next().unwrap_or_default().to_string()
}

/// Whether the page finished loading.
async fn loaded(tab: &Tab) -> bool {
    tab.cdp(
        "Runtime.evaluate",
        json!({"expression": "document.readyState", "returnByValue": true}),
    )
    .await
    .is_ok_and(|v| v["result"]["value"] == "complete")
}

/// Clears the browser's cookies and storage of `hosts` and their subdomains: how many cookies
/// went. `None` when the browser is not running.
pub async fn forget(desktop: &Arc<Desktop>, hosts: &[String]) -> Option<u64> {
    let dt = desktop.browser(Duration::from_secs(10)).await?;
    let c = Client::connect(&format!("ws://127.0.0.1:{}{}", dt.port, dt.browser_path))
        .await
        .ok()?;
    let hosts: Vec<String> = hosts
        .iter()
        .map(|h| berth_protocol::egress::normalise(h))
        .collect();
    let ours = |domain: &str| {
        let d = domain.trim_start_matches('.').to_ascii_lowercase();
        hosts
            .iter()
            .any(|h| d == *h || d.ends_with(&format!(".{h}")) || h.ends_with(&format!(".{d}")))
    };
    let mut deleted = 0;
    let cookies = c
        .call("Storage.getCookies", json!({}), None)
        .await
        .map(|v| v["cookies"].as_array().cloned().unwrap_or_default())
        .unwrap_or_default();
    let mine: Vec<&Value> = cookies
        .iter()
        .filter(|k| ours(k["domain"].as_str().unwrap_or_default()))
        .collect();
    // Deleted one by one on a page of its own (`Network.deleteCookies` is a page's call):
    // other sites' cookies are not touched.
    if !mine.is_empty()
        && let Some(tab) = open_tab(&c).await
    {
        for k in mine {
            let del = json!({"name": k["name"], "domain": k["domain"], "path": k["path"]});
            if tab.cdp("Network.deleteCookies", del).await.is_ok() {
                deleted += 1;
            }
        }
        let _ = tab.close().await;
    }
    for h in &hosts {
        for scheme in ["https", "http"] {
            let _ = c
                .call(
                    "Storage.clearDataForOrigin",
                    json!({"origin": format!("{scheme}://{h}"), "storageTypes": "all"}),
                    None,
                )
                .await;
        }
    }
    c.close().await;
    Some(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_is_logged_without_its_query_or_fragment() {
        assert_eq!(
            page_of("https://a.test/login?user=u&pass=p#x"),
            "https://a.test/login"
        );
        assert_eq!(page_of("https://a.test/me#p"), "https://a.test/me");
        assert_eq!(page_of("about:blank"), "about:blank");
    }

    #[test]
    fn success_is_every_sign_given_or_leaving_the_login_page() {
        let none = LoginSuccess::default();
        let login = "https://login.test/login";
        assert!(!succeeded(&none, login, login, false, false, &[]));
        assert!(!succeeded(
            &none,
            login,
            "https://login.test/home",
            false,
            true,
            &[]
        ));
        assert!(succeeded(
            &none,
            login,
            "https://login.test/home",
            false,
            false,
            &[]
        ));
        assert!(!succeeded(
            &none,
            login,
            "https://other.test/",
            false,
            false,
            &[]
        ));
        let signs = LoginSuccess {
            url: Some("https://login.test/me".into()),
            element: Some("#who".into()),
            cookie: Some("session".into()),
        };
        let me = "https://login.test/me?x=1";
        assert!(succeeded(
            &signs,
            login,
            me,
            true,
            false,
            &["session".into()]
        ));
        assert!(!succeeded(
            &signs,
            login,
            me,
            false,
            false,
            &["session".into()]
        ));
        assert!(!succeeded(
            &signs,
            login,
            me,
            true,
            false,
            &["other".into()]
        ));
        assert!(!succeeded(
            &signs,
            login,
            "https://login.test/x",
            true,
            false,
            &["session".into()]
        ));
    }
}
