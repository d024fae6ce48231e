//! The `[[login]]` sites: checked, their values read once at start, and the pure parts of a
//! login (TOTP codes, hosts, the allow-list rule).

use std::collections::BTreeMap;

use berth_protocol::egress::{self, Egress, HostVerdict};
use berth_protocol::login::MAX_LOGIN_TIMEOUT_MS;
use hmac::{Hmac, Mac};

use crate::config::{LoginConfig, read_secret};
use crate::error::{Error, Result};

/// A TOTP code's digits and period (RFC 6238's defaults, what authenticator apps use).
const TOTP_DIGITS: u32 = 6;
const TOTP_PERIOD: u64 = 30;

/// One configured site with its values read.
pub struct Site {
    pub config: LoginConfig,
    pub host: String,
    pub username: Option<String>,
    pub password: String,
    pub totp: Option<Vec<u8>>,
}

/// The configured sites (values read once, at start).
#[derive(Default)]
pub struct Logins {
    pub sites: BTreeMap<String, Site>,
}

impl std::fmt::Debug for Logins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.sites.keys()).finish()
    }
}

pub use berth_protocol::login::name_ok;

pub use berth_protocol::egress::url_host;

/// `[[login]]` checked without reading a value (names, URLs, bounds).
pub fn validate(sites: &[LoginConfig]) -> anyhow::Result<()> {
    let mut seen = std::collections::BTreeSet::new();
    for s in sites {
        let what = format!("[[login]] {:?}", s.name);
        anyhow::ensure!(
            name_ok(&s.name),
            "{what}: name must be 1-64 of a-z, 0-9, '-', '_'"
        );
        anyhow::ensure!(seen.insert(s.name.clone()), "{what}: named twice");
        anyhow::ensure!(
            url_host(&s.url).is_some(),
            "{what}: url must be an http:// or https:// URL with a host"
        );
        anyhow::ensure!(
            s.max_uses >= 1 && s.max_uses <= 1000,
            "{what}: max_uses must be 1-1000"
        );
        anyhow::ensure!(
            s.timeout_secs >= 1 && s.timeout_secs * 1000 <= MAX_LOGIN_TIMEOUT_MS,
            "{what}: timeout_secs must be 1-{}",
            MAX_LOGIN_TIMEOUT_MS / 1000
        );
        anyhow::ensure!(
            !(s.username.is_some()
                && (s.username_secret.is_some() || s.username_secret_file.is_some())),
            "{what}: give username or username_secret(_file), not both"
        );
    }
    Ok(())
}

/// A base32 TOTP seed (spaces and case ignored, padding optional).
pub fn totp_seed(text: &str) -> anyhow::Result<Vec<u8>> {
    let mut s: String = text
        .chars()
        .filter(|c| !c.is_whitespace() && *c != '=')
        .collect::<String>()
        .to_ascii_uppercase();
    while !s.len().is_multiple_of(8) {
        s.push('=');
    }
    let seed = data_encoding::BASE32
        .decode(s.as_bytes())
        .map_err(|_| anyhow::anyhow!("the TOTP secret is not base32"))?;
    anyhow::ensure!(!seed.is_empty(), "the TOTP secret is empty");
    Ok(seed)
}

/// The TOTP code of `seed` at `unix_secs` (RFC 6238 with HMAC-SHA-1, 30 s, 6 digits; pure).
pub fn totp(seed: &[u8], unix_secs: u64) -> String {
    let counter = (unix_secs / TOTP_PERIOD).to_be_bytes();
    let mut mac = <Hmac<sha1::Sha1> as Mac>::new_from_slice(seed).expect("HMAC takes any key");
    mac.update(&counter);
    let h = mac.finalize().into_bytes();
    let at = (h[h.len() - 1] & 0x0f) as usize;
    let bin = u32::from_be_bytes([h[at] & 0x7f, h[at + 1], h[at + 2], h[at + 3]]);
    format!(
        "{:0width$}",
        bin % 10u32.pow(TOTP_DIGITS),
        width = TOTP_DIGITS as usize
    )
}

/// Why a site's host may not be signed in to from a sandbox with `policy`, or `None`.
pub fn host_refusal(policy: Option<&Egress>, host: &str) -> Option<String> {
    match policy {
        Some(p @ Egress::Rules(_)) => match egress::host_verdict(p, host) {
            HostVerdict::Deny(d) => Some(format!(
                "its egress allow list does not name {host} ({})",
                d.as_str()
            )),
            _ => None,
        },
        _ => Some(format!(
            "it has no egress allow list: the login tool signs in only to hosts an allow list \
             names ({host})"
        )),
    }
}

impl Logins {
    /// The sites of `[[login]]`, their values read now.
    pub fn load(configs: &[LoginConfig]) -> anyhow::Result<Logins> {
        validate(configs)?;
        let mut sites = BTreeMap::new();
        for c in configs {
            let what = format!("[[login]] {:?}", c.name);
            let username = match (&c.username, &c.username_secret, &c.username_secret_file) {
                (Some(u), _, _) => Some(u.clone()),
                (None, None, None) => None,
                (None, v, f) => Some(read_secret(v.as_deref(), f.as_deref(), &what)?),
            };
            let password = read_secret(c.secret.as_deref(), c.secret_file.as_deref(), &what)?;
            let totp = match (&c.totp_secret, &c.totp_secret_file) {
                (None, None) => None,
                (v, f) => Some(
                    totp_seed(&read_secret(v.as_deref(), f.as_deref(), &what)?)
                        .map_err(|e| anyhow::anyhow!("{what}: {e}"))?,
                ),
            };
            let host = match &c.host {
                Some(h) => egress::normalise(h),
                None => url_host(&c.url).unwrap_or_default(),
            };
            sites.insert(
                c.name.clone(),
                Site {
                    config: c.clone(),
                    host,
                    username,
                    password,
                    totp,
                },
            );
        }
        Ok(Logins { sites })
    }

    /// The names a create or lease enables, each configured (400 otherwise).
    pub fn check(&self, names: &[String]) -> Result<()> {
        for n in names {
            if !self.sites.contains_key(n) {
                let known: Vec<&str> = self.sites.keys().map(String::as_str).collect();
                return Err(Error::BadRequest(format!(
                    "logins: no [[login]] site named {n:?} in the controller's config (it has: {})",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                )));
            }
        }
        Ok(())
    }

    pub fn hosts(&self, names: impl IntoIterator<Item = String>) -> Vec<String> {
        let mut hosts: Vec<String> = names
            .into_iter()
            .filter_map(|n| self.sites.get(&n).map(|s| s.host.clone()))
            .collect();
        hosts.sort();
        hosts.dedup();
        hosts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totp_codes_are_rfc_6238s() {
        // RFC 6238's SHA-1 vectors (8 digits there; the last 6 here).
        let seed = b"12345678901234567890";
        for (t, code) in [
            (59, "287082"),
            (1111111109, "081804"),
            (1111111111, "050471"),
            (1234567890, "005924"),
            (2000000000, "279037"),
        ] {
            assert_eq!(totp(seed, t), code, "t={t}");
        }
        // The same seed as base32, as authenticator apps take it.
        let b32 = "GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ";
        assert_eq!(totp_seed(b32).unwrap(), seed);
        assert_eq!(
            totp_seed("gezd gnbv gy3t qojq gezd gnbv gy3t qojq").unwrap(),
            seed
        );
        assert!(totp_seed("not base32!").is_err());
    }

    #[test]
    fn sites_are_named_and_reached_through_an_allow_list() {
        assert_eq!(
            url_host("https://Login.Test:8443/x?y").as_deref(),
            Some("login.test")
        );
        assert_eq!(url_host("ftp://x").as_deref(), None);
        assert!(name_ok("crm-1") && !name_ok("CRM") && !name_ok(""));
        use berth_protocol::egress::{EgressMode, EgressRules};
        let rules = Egress::Rules(EgressRules {
            allow: vec!["login.test".into()],
            deny_private: false,
        });
        assert!(host_refusal(Some(&rules), "login.test").is_none());
        assert!(host_refusal(Some(&rules), "other.test").is_some());
        assert!(host_refusal(Some(&Egress::Mode(EgressMode::Open)), "login.test").is_some());
        assert!(host_refusal(None, "login.test").is_some());
    }

    #[test]
    fn a_config_with_a_bad_site_is_refused_at_start() {
        let site = |name: &str, url: &str| LoginConfig {
            name: name.into(),
            url: url.into(),
            host: None,
            description: None,
            username: Some("u".into()),
            username_secret: None,
            username_secret_file: None,
            secret: Some("BERTH_TEST_NO_SUCH_VARIABLE".into()),
            secret_file: None,
            totp_secret: None,
            totp_secret_file: None,
            form: Default::default(),
            success: Default::default(),
            max_uses: 3,
            timeout_secs: 30,
        };
        assert!(validate(&[site("a", "https://a.test/login")]).is_ok());
        assert!(validate(&[site("A", "https://a.test/login")]).is_err());
        assert!(validate(&[site("a", "a.test/login")]).is_err());
        assert!(validate(&[site("a", "https://a.test"), site("a", "https://b.test")]).is_err());
        let e = Logins::load(&[site("a", "https://a.test/login")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("BERTH_TEST_NO_SUCH_VARIABLE"), "{e}");
    }
}
