//! The session view: one page per sandbox (desktop, terminal, files, timeline, artifacts,
//! episode), opened by a one-time URL that sets an HttpOnly cookie scoped to the page's path.
//! The page is plain HTML, an ES module and CSS embedded here; its third-party JavaScript
//! comes from Debian packages on the controller's host (`[session]` in the config): noVNC
//! served as its files are, xterm.js's CommonJS modules (`node-xterm`) joined into one
//! browser script by [`xterm_bundle`].

use std::sync::Arc;

use std::path::{Component, Path, PathBuf};

use crate::ctx::Ctx;
use crate::error::{Error, Result};
use crate::util::{now_ms, random_hex, rfc3339, sha256_hex};
use crate::viewer::{SESSION_TTL_MS, URL_TTL_MS};
use berth_protocol::routes::controller::sandbox_base;

/// The cookie the session URL sets.
pub const COOKIE: &str = "berth_session";
/// The query parameter carrying the one-time token.
pub const TOKEN_PARAM: &str = "t";

pub const INDEX_HTML: &str = include_str!("session/index.html");
pub const APP_JS: &str = include_str!("session/app.js");
pub const STYLE_CSS: &str = include_str!("session/style.css");

/// The page's path (the cookie's `Path`).
pub fn page_path(sandbox_id: &str) -> String {
    format!("{}session/", sandbox_base(sandbox_id))
}

/// The scope session tokens are stored under in the viewer tokens' `sandbox_id` column: never
/// a sandbox id nor a port's scope, so a session token opens nothing but this sandbox's
/// session view and a viewer or preview token never opens it.
fn scope(sandbox_id: &str) -> String {
    format!("{sandbox_id}/session")
}

/// The session view's one-time URLs and the cookie it sets.
pub struct Sessions {
    ctx: Arc<Ctx>,
}

impl Sessions {
    pub fn new(ctx: Arc<Ctx>) -> Sessions {
        Sessions { ctx }
    }

    /// `POST …/{id}/session` → a one-time URL and when it expires (RFC 3339). Any sandbox the
    /// caller may see, deleted ones too: their timeline, artifacts and episode still render.
    pub fn mint_session_url(&self, sandbox_id: &str) -> Result<(String, String)> {
        self.ctx.visible_row(sandbox_id)?;
        let token = random_hex(32);
        let expires = now_ms() + URL_TTL_MS;
        self.ctx.store.insert_viewer_token(
            &sha256_hex(token.as_bytes()),
            &scope(sandbox_id),
            "url",
            expires,
        )?;
        let url = format!(
            "{}{}?{TOKEN_PARAM}={token}",
            self.ctx.public_url,
            page_path(sandbox_id)
        );
        Ok((url, rfc3339(expires)))
    }

    /// Opens a one-time session URL: the cookie's value, exactly once.
    pub fn open_session_url(&self, sandbox_id: &str, token: &str) -> Result<String> {
        let scope = scope(sandbox_id);
        if !self
            .ctx
            .store
            .use_viewer_token(&sha256_hex(token.as_bytes()), &scope)?
        {
            return Err(Error::Unauthorized(format!(
                "this session link was already used or has expired; ask for a new one with \
                 POST /sandbox/sandboxes/v1/{sandbox_id}/session (berth sandbox open {sandbox_id})"
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

    pub fn session_cookie_ok(&self, sandbox_id: &str, cookie: &str) -> bool {
        self.ctx
            .store
            .viewer_session_valid(&sha256_hex(cookie.as_bytes()), &scope(sandbox_id))
            .unwrap_or(false)
    }
}

/// `rel` (a URL path below a served directory, already percent-decoded) inside `root`, or
/// `None` when it leaves it (`..`, an absolute path, a NUL).
pub fn contained(root: &Path, rel: &str) -> Option<PathBuf> {
    if rel.is_empty() || rel.contains('\0') || rel.contains('\\') {
        return None;
    }
    let mut out = root.to_path_buf();
    for c in Path::new(rel).components() {
        match c {
            Component::Normal(p) => out.push(p),
            _ => return None,
        }
    }
    Some(out)
}

/// The most xterm.js source the bundle reads (the package's modules are ~370 KB).
const XTERM_MAX_BYTES: u64 = 8 << 20;

/// xterm.js for a browser: every module of `dir/lib` but the tests, each wrapped as a
/// CommonJS function, and a small `require` resolving the relative paths they use. Defines
/// `window.Terminal` (with the `fit` addon applied when present). Debian's `libjs-xterm`
/// ships only a stub `xterm.js` that `require`s these modules, and no bundler is used here.
pub fn xterm_bundle(dir: &Path) -> std::io::Result<String> {
    let lib = dir.join("lib");
    let mut files = Vec::new();
    collect_js(&lib, &lib, &mut files, 0)?;
    if !files.iter().any(|(id, _)| id == "public/Terminal.js") {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{} has no public/Terminal.js", lib.display()),
        ));
    }
    files.sort();
    let mut total = 0u64;
    let mut out = String::from(
        "/* xterm.js from Debian's node-xterm, joined by berth */\n(function () {\n\
         'use strict';\nvar defs = {}, cache = {};\n\
         function resolve(from, req) {\n\
         var parts = from.split('/'); parts.pop();\n\
         req.split('/').forEach(function (p) {\n\
         if (p === '..') parts.pop(); else if (p !== '.' && p !== '') parts.push(p);\n\
         });\n\
         var id = parts.join('/');\n\
         return defs[id + '.js'] ? id + '.js' : id;\n}\n\
         function load(id) {\n\
         if (cache[id]) return cache[id].exports;\n\
         if (!defs[id]) throw new Error('xterm bundle: no module ' + id);\n\
         var module = cache[id] = {exports: {}};\n\
         defs[id].call(module.exports, function (r) { return load(resolve(id, r)); }, \
         module, module.exports);\n\
         return module.exports;\n}\n",
    );
    for (id, path) in &files {
        let src = std::fs::read_to_string(path)?;
        total += src.len() as u64;
        if total > XTERM_MAX_BYTES {
            return Err(std::io::Error::other(format!(
                "{} holds more than {XTERM_MAX_BYTES} bytes of JavaScript",
                lib.display()
            )));
        }
        let src = src
            .lines()
            .filter(|l| !l.starts_with("//# sourceMappingURL="))
            .collect::<Vec<_>>()
            .join("\n");
        out.push_str(&format!(
            "defs[{}] = function (require, module, exports) {{\n{src}\n}};\n",
            serde_json::to_string(id).unwrap_or_default()
        ));
    }
    out.push_str(
        "var T = load('public/Terminal.js').Terminal;\n\
         if (defs['addons/fit/fit.js']) T.applyAddon(load('addons/fit/fit.js'));\n\
         window.Terminal = T;\n})();\n",
    );
    Ok(out)
}

fn collect_js(
    root: &Path,
    dir: &Path,
    out: &mut Vec<(String, PathBuf)>,
    depth: u32,
) -> std::io::Result<()> {
    if depth > 8 {
        return Ok(());
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let kind = entry.file_type()?;
        if kind.is_dir() {
            collect_js(root, &path, out, depth + 1)?;
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".js") || name.ends_with(".test.js") || name.contains("TestUtils") {
            continue;
        }
        let Ok(rel) = path.strip_prefix(root) else {
            continue;
        };
        out.push((rel.to_string_lossy().replace('\\', "/"), path));
    }
    Ok(())
}

/// The page's Content-Security-Policy: its own origin only (scripts from files, never
/// inline), WebSockets to the host it was loaded from, and no framing.
pub fn csp(host: Option<&str>) -> String {
    let ws = host
        .filter(|h| {
            h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        })
        .map(|h| format!(" ws://{h} wss://{h}"))
        .unwrap_or_default();
    format!(
        "default-src 'self'; script-src 'self'; connect-src 'self'{ws}; \
         img-src 'self' data: blob:; media-src 'self' blob:; style-src 'self' 'unsafe-inline'; \
         font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; \
         frame-ancestors 'none'"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contained_paths_stay_inside_their_root() {
        let root = Path::new("/usr/share/novnc");
        assert_eq!(
            contained(root, "core/rfb.js"),
            Some(PathBuf::from("/usr/share/novnc/core/rfb.js"))
        );
        assert_eq!(contained(root, "../etc/passwd"), None);
        assert_eq!(contained(root, "core/../../etc/passwd"), None);
        assert_eq!(contained(root, "/etc/passwd"), None);
        assert_eq!(contained(root, ""), None);
        assert_eq!(contained(root, "a\0b"), None);
    }

    #[test]
    fn the_csp_names_only_a_plain_host_for_websockets() {
        let c = csp(Some("127.0.0.1:8780"));
        assert!(c.contains("connect-src 'self' ws://127.0.0.1:8780 wss://127.0.0.1:8780;"));
        assert!(c.contains("script-src 'self';"));
        assert!(c.contains("frame-ancestors 'none'"));
        let evil = csp(Some("x; script-src *"));
        assert!(!evil.contains("script-src *"), "{evil}");
        assert!(evil.contains("connect-src 'self';"));
    }

    #[test]
    fn the_xterm_bundle_joins_modules_and_resolves_relative_requires() {
        let d = tempfile::tempdir().unwrap();
        let lib = d.path().join("lib");
        std::fs::create_dir_all(lib.join("public")).unwrap();
        std::fs::create_dir_all(lib.join("common")).unwrap();
        std::fs::write(
            lib.join("public/Terminal.js"),
            "var E = require(\"../common/E\");\nexports.Terminal = E.E;\n\
             //# sourceMappingURL=Terminal.js.map",
        )
        .unwrap();
        std::fs::write(lib.join("common/E.js"), "exports.E = function () {};").unwrap();
        std::fs::write(lib.join("common/E.test.js"), "require('chai');").unwrap();
        let b = xterm_bundle(d.path()).unwrap();
        assert!(b.contains("defs[\"public/Terminal.js\"]"));
        assert!(b.contains("defs[\"common/E.js\"]"));
        assert!(!b.contains("chai"), "tests are left out");
        assert!(!b.contains("sourceMappingURL"));
        assert!(b.contains("window.Terminal = T;"));
        let empty = tempfile::tempdir().unwrap();
        assert!(xterm_bundle(empty.path()).is_err());
    }
}
