//! Viewer access for browsers: a one-time, short-lived URL that, opened once, sets an HttpOnly
//! cookie scoped to that sandbox's path. Only hashes of tokens are stored; no API key or agent
//! token ever sits in a URL.

use std::sync::Arc;

use crate::ctx::Ctx;
use crate::error::{Error, Result};
use crate::util::{now_ms, random_hex, sha256_hex};
use berth_protocol::routes::controller::sandbox_base;

/// How long a minted URL can be opened.
pub const URL_TTL_MS: i64 = 120_000;
/// How long the cookie it sets lasts.
pub const SESSION_TTL_MS: i64 = 12 * 3600 * 1000;
pub const COOKIE: &str = "berth_viewer";

/// The viewer's and the ports' one-time URLs and the sessions they open.
pub struct Viewers {
    ctx: Arc<Ctx>,
}

impl Viewers {
    pub fn new(ctx: Arc<Ctx>) -> Viewers {
        Viewers { ctx }
    }

    /// `POST …/{id}/viewer` → a one-time URL.
    /// For a profile whose viewer is a browser IDE: a one-time preview URL of the IDE's port.
    pub fn mint_viewer_url(&self, sandbox_id: &str) -> Result<String> {
        let row = self.ctx.visible_row(sandbox_id)?;
        let profile = self.ctx.catalog.profile(&row.profile);
        if let Some((_, port)) = profile.and_then(|p| p.ide()) {
            return Ok(self.mint_port_url(sandbox_id, port, None)?.0);
        }
        if !profile.is_some_and(|p| p.desktop) {
            return Err(Error::Unprocessable(format!(
                "sandbox {sandbox_id} runs profile {} which has no desktop to view",
                row.profile
            )));
        }
        if !row.live() {
            return Err(Error::Conflict(format!(
                "sandbox {sandbox_id} is {}",
                row.status
            )));
        }
        let token = random_hex(32);
        self.ctx.store.insert_viewer_token(
            &sha256_hex(token.as_bytes()),
            sandbox_id,
            "url",
            now_ms() + URL_TTL_MS,
        )?;
        Ok(format!(
            "{}{}vnc/?t={token}",
            self.ctx.public_url,
            sandbox_base(sandbox_id)
        ))
    }

    /// Opens a one-time URL: the session cookie value, exactly once.
    pub fn open_viewer_url(&self, sandbox_id: &str, token: &str) -> Result<String> {
        if !self
            .ctx
            .store
            .use_viewer_token(&sha256_hex(token.as_bytes()), sandbox_id)?
        {
            return Err(Error::Unauthorized(
                "this viewer link was already used or has expired; ask for a new one with \
                 POST /sandbox/sandboxes/v1/{id}/viewer"
                    .into(),
            ));
        }
        let session = random_hex(32);
        self.ctx.store.insert_viewer_token(
            &sha256_hex(session.as_bytes()),
            sandbox_id,
            "session",
            now_ms() + SESSION_TTL_MS,
        )?;
        Ok(session)
    }

    pub fn viewer_session_ok(&self, sandbox_id: &str, cookie: &str) -> bool {
        self.ctx
            .store
            .viewer_session_valid(&sha256_hex(cookie.as_bytes()), sandbox_id)
            .unwrap_or(false)
    }
}

/// The cookie a preview URL sets, scoped to its port's path.
pub const PORT_COOKIE: &str = "berth_port";
/// The query parameter carrying a preview URL's one-time token.
pub const PORT_TOKEN_PARAM: &str = "berth_preview";
/// How long a preview URL can be opened, by default and at most.
pub const PORT_URL_TTL_SECS: u64 = 120;
pub const PORT_URL_MAX_TTL_SECS: u64 = 3600;

/// The path a preview is served under (its cookie's `Path`).
pub fn port_path(sandbox_id: &str, port: u16) -> String {
    format!("{}ports/{port}/", sandbox_base(sandbox_id))
}

/// The scope preview tokens are stored under, in the viewer tokens' `sandbox_id` column: one
/// port of one sandbox, never equal to a sandbox id, so a viewer token never opens a preview
/// and a preview token never opens the viewer or another port.
fn port_scope(sandbox_id: &str, port: u16) -> String {
    format!("{sandbox_id}/ports/{port}")
}

impl Viewers {
    /// `POST …/{id}/ports/{port}/url` → a one-time URL and when it expires (RFC 3339).
    pub fn mint_port_url(
        &self,
        sandbox_id: &str,
        port: u16,
        ttl_secs: Option<u64>,
    ) -> Result<(String, String)> {
        let ttl = ttl_secs.unwrap_or(PORT_URL_TTL_SECS);
        if !(1..=PORT_URL_MAX_TTL_SECS).contains(&ttl) {
            return Err(Error::BadRequest(format!(
                "ttl_seconds must be 1-{PORT_URL_MAX_TTL_SECS}, not {ttl}"
            )));
        }
        let row = self.ctx.visible_row(sandbox_id)?;
        if !row.live() {
            return Err(Error::Conflict(format!(
                "sandbox {sandbox_id} is {}",
                row.status
            )));
        }
        let token = random_hex(32);
        let expires = now_ms() + (ttl as i64) * 1000;
        self.ctx.store.insert_viewer_token(
            &sha256_hex(token.as_bytes()),
            &port_scope(sandbox_id, port),
            "url",
            expires,
        )?;
        let url = format!(
            "{}{}?{PORT_TOKEN_PARAM}={token}",
            self.ctx.public_url,
            port_path(sandbox_id, port)
        );
        Ok((url, crate::util::rfc3339(expires)))
    }

    /// Opens a preview URL: the session cookie's value, exactly once.
    pub fn open_port_url(&self, sandbox_id: &str, port: u16, token: &str) -> Result<String> {
        let scope = port_scope(sandbox_id, port);
        if !self
            .ctx
            .store
            .use_viewer_token(&sha256_hex(token.as_bytes()), &scope)?
        {
            return Err(Error::Unauthorized(format!(
                "this preview link was already used or has expired; ask for a new one with \
                 POST /sandbox/sandboxes/v1/{sandbox_id}/ports/{port}/url"
            )));
        }
        let session = random_hex(32);
        self.ctx.store.insert_viewer_token(
            &sha256_hex(session.as_bytes()),
            &scope,
            "session",
            now_ms() + SESSION_TTL_MS,
        )?;
        Ok(session)
    }

    pub fn port_session_ok(&self, sandbox_id: &str, port: u16, cookie: &str) -> bool {
        self.ctx
            .store
            .viewer_session_valid(
                &sha256_hex(cookie.as_bytes()),
                &port_scope(sandbox_id, port),
            )
            .unwrap_or(false)
    }
}
