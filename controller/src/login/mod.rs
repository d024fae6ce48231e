//! The guarded login tool: `[[login]]` sites a run enables by name (create body, lease); the
//! controller hands the sandbox's agent a site's values to fill into the desktop browser's
//! login form over CDP, and tells the caller only whether it worked, in a fixed phrase.
//!
//! Guarded: only a site the run enables, only where the sandbox's egress allow list names its
//! host, at most `max_uses` times a run; each use a names-only `login.used` event; at the end
//! of the run (a lease's next acquire) the sites' cookies and storage are cleared, and the
//! sandbox goes with its lease anyway. A run is one acquire of a lease, or a sandbox's life
//! when it was created directly.

pub mod sites;

use std::collections::BTreeMap;
use std::time::Duration;

use berth_protocol::events::EventKind;
use berth_protocol::login::{
    BrowserForget, BrowserLogin, LOGIN_HOST_REFUSED, LOGIN_LIMIT, LOGIN_NOT_ENABLED, LoginAnswer,
    LoginOutcome, LoginSiteView, LoginSites,
};
use serde_json::json;

pub use sites::Logins;
use sites::{host_refusal, totp};

use crate::ctx::Ctx;
use crate::error::{Error, Result};
use crate::lifecycle::SandboxStatus;
use crate::store::{RunLogins, SandboxRow};
use crate::util::new_id;

/// How long forgetting a run's sites may take.
const FORGET: Duration = Duration::from_secs(15);
/// The agent's wait for the browser to come up, before the site's own bound.
const BROWSER_WAIT: Duration = Duration::from_millis(berth_protocol::login::BROWSER_WAIT_MS);

/// A new run on sandbox `row` enabling `enabled`: the last run's sites are forgotten in the
/// browser first (their cookies and storage), and its counts start again.
pub async fn start_run(ctx: &Ctx, row: &SandboxRow, enabled: &[String]) -> Result<String> {
    let prev = ctx.store.run_logins(&row.id)?;
    let run = new_id("run");
    if !prev.uses.is_empty() && row.status == SandboxStatus::Running {
        forget(ctx, row, &prev).await;
    }
    ctx.store.set_run_logins(
        &row.id,
        &RunLogins {
            run: run.clone(),
            enabled: enabled.to_vec(),
            uses: BTreeMap::new(),
        },
    )?;
    Ok(run)
}

/// Clears the browser's cookies and storage of the sites `prev` used (bounded; a failure is
/// logged and put on the timeline, the new run goes on).
async fn forget(ctx: &Ctx, row: &SandboxRow, prev: &RunLogins) {
    let hosts = ctx.logins.hosts(prev.uses.keys().cloned());
    let Ok(agent) = ctx.agent(row) else { return };
    let key = crate::control::key(ctx, &row.id);
    let req = BrowserForget {
        hosts: hosts.clone(),
    };
    let sites: Vec<&String> = prev.uses.keys().collect();
    match tokio::time::timeout(FORGET, agent.browser_forget(&req, &key)).await {
        Ok(Ok(done)) => ctx.event(
            &row.id,
            EventKind::LoginForgotten,
            json!({"run": prev.run, "sites": sites, "cookies": done.cookies}),
        ),
        Ok(Err(e)) => {
            tracing::warn!(sandbox = %row.id, error = %e, "forgetting a run's logins");
            ctx.event(
                &row.id,
                EventKind::LoginForgotten,
                json!({"run": prev.run, "sites": sites, "error": e.to_string()}),
            );
        }
        Err(_) => {
            tracing::warn!(sandbox = %row.id, "forgetting a run's logins: no answer");
            ctx.event(
                &row.id,
                EventKind::LoginForgotten,
                json!({"run": prev.run, "sites": sites, "error": "no answer within 15 s"}),
            );
        }
    }
}

/// `GET …/{id}/login`.
pub fn sites(ctx: &Ctx, id: &str) -> Result<LoginSites> {
    ctx.visible_row(id)?;
    let state = ctx.store.run_logins(id)?;
    let sites = state
        .enabled
        .iter()
        .filter_map(|n| ctx.logins.sites.get(n))
        .map(|s| LoginSiteView {
            name: s.config.name.clone(),
            host: s.host.clone(),
            url: s.config.url.clone(),
            uses: state.uses.get(&s.config.name).copied().unwrap_or(0),
            max_uses: s.config.max_uses,
            description: s.config.description.clone(),
        })
        .collect();
    Ok(LoginSites {
        run: state.run,
        sites,
    })
}

/// `POST …/{id}/login`: the checks, the count, the agent's fill, the event.
pub async fn login(ctx: &Ctx, id: &str, name: &str) -> Result<LoginAnswer> {
    let row = ctx.visible_row(id)?;
    let site = ctx.logins.sites.get(name).ok_or_else(|| {
        Error::NotFound(format!(
            "no [[login]] site named {name:?} in the controller's config"
        ))
    })?;
    let state = ctx.store.run_logins(id)?;
    if !state.enabled.iter().any(|n| n == name) {
        return Err(Error::Forbidden(
            LOGIN_NOT_ENABLED,
            format!(
                "sandbox {id}'s run does not enable the login site {name:?} (enable it with \
                 \"logins\" in the create body or the lease)"
            ),
        ));
    }
    let policy = row.egress.as_ref().map(|e| &e.policy);
    if let Some(why) = host_refusal(policy, &site.host) {
        return Err(Error::Forbidden(
            LOGIN_HOST_REFUSED,
            format!("sandbox {id} may not sign in to {name:?}: {why}"),
        ));
    }
    let (_, agent) = ctx.running_agent(id)?;
    let max = site.config.max_uses;
    let Some((run, uses)) = ctx.store.count_login(id, name, max)? else {
        return Err(Error::Forbidden(
            LOGIN_LIMIT,
            format!("the run used the login site {name:?} {max} times, as many as it allows"),
        ));
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let bound = Duration::from_secs(site.config.timeout_secs);
    let req = BrowserLogin {
        url: site.config.url.clone(),
        username: site.username.clone(),
        password: site.password.clone(),
        code: site.totp.as_ref().map(|seed| totp(seed, now)),
        form: site.config.form.clone(),
        success: site.config.success.clone(),
        timeout_ms: Some(bound.as_millis() as u64),
    };
    let key = crate::control::key(ctx, id);
    let outcome = match agent
        .browser_login(&req, &key, bound + BROWSER_WAIT + Duration::from_secs(15))
        .await
    {
        Ok(r) => r.outcome,
        Err(e) => {
            // The agent's error names a route or a status, never a value.
            ctx.event(
                id,
                EventKind::LoginUsed,
                json!({"site": name, "outcome": "agent_failed", "run": run, "uses": uses}),
            );
            return Err(Error::Agent(format!(
                "the sandbox's agent failed the login to {name:?}: {e}"
            )));
        }
    };
    ctx.event(
        id,
        EventKind::LoginUsed,
        json!({"site": name, "outcome": outcome.as_str(), "run": run, "uses": uses}),
    );
    Ok(LoginAnswer {
        site: name.to_string(),
        outcome,
        message: outcome.phrase().to_string(),
        signed_in: outcome == LoginOutcome::SignedIn,
        run,
        uses,
        max_uses: max,
    })
}
