//! Viewer access for browsers: a one-time, short-lived URL that, opened once, sets an HttpOnly
//! cookie scoped to that sandbox's path. Only hashes of tokens are stored; no API key or agent
//! token ever sits in a URL.

use crate::error::{Error, Result};
use crate::sandbox::Controller;
use crate::util::{now_ms, random_hex, sha256_hex};

/// How long a minted URL can be opened.
pub const URL_TTL_MS: i64 = 120_000;
/// How long the cookie it sets lasts.
pub const SESSION_TTL_MS: i64 = 12 * 3600 * 1000;
pub const COOKIE: &str = "berth_viewer";

pub fn base_path(sandbox_id: &str) -> String {
    format!("/sandbox/sandboxes/v1/{sandbox_id}/")
}

impl Controller {
    /// `POST …/{id}/viewer` → a one-time URL.
    pub fn mint_viewer_url(&self, sandbox_id: &str) -> Result<String> {
        let row = self.visible_row(sandbox_id)?;
        if !self
            .catalog
            .profile(&row.profile)
            .is_some_and(|p| p.desktop)
        {
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
        self.store.insert_viewer_token(
            &sha256_hex(token.as_bytes()),
            sandbox_id,
            "url",
            now_ms() + URL_TTL_MS,
        )?;
        Ok(format!(
            "{}{}vnc/?t={token}",
            self.public_url,
            base_path(sandbox_id)
        ))
    }

    /// Opens a one-time URL: the session cookie value, exactly once.
    pub fn open_viewer_url(&self, sandbox_id: &str, token: &str) -> Result<String> {
        if !self
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
        self.store.insert_viewer_token(
            &sha256_hex(session.as_bytes()),
            sandbox_id,
            "session",
            now_ms() + SESSION_TTL_MS,
        )?;
        Ok(session)
    }

    pub fn viewer_session_ok(&self, sandbox_id: &str, cookie: &str) -> bool {
        self.store
            .viewer_session_valid(&sha256_hex(cookie.as_bytes()), sandbox_id)
            .unwrap_or(false)
    }
}
