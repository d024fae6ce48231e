//! Credentials given at a sandbox's create: checked against its egress policy, kept sealed in
//! the store (the record shows only their hosts and headers), handed to the egress proxy's edge
//! for that sandbox alone, and handed again after a restart.

use berth_protocol::controller::{CredentialView, SandboxCredential};
use berth_protocol::egress::{self, Egress, HostVerdict};

use super::Sandboxes;
use crate::ctx::Ctx;
use crate::egress::edge::Credential;
use crate::error::{Error, Result};
use crate::store::SandboxRow;

/// At most this many per sandbox, each secret at most this long.
const MAX_CREDENTIALS: usize = 32;
const MAX_SECRET: usize = 8 * 1024;

/// The edge's form of a credential given at create.
fn built(c: &SandboxCredential) -> anyhow::Result<Credential> {
    crate::egress::credential(
        &c.host,
        c.header.as_deref().unwrap_or("Authorization"),
        c.value.as_deref(),
        c.basic_user.as_deref(),
        &c.secret,
    )
}

/// Whether `creds` may be given to a sandbox with `policy`: each well formed, for a host the
/// policy sends through the proxy.
pub fn check(policy: &Egress, creds: &[SandboxCredential]) -> std::result::Result<(), String> {
    if creds.is_empty() {
        return Ok(());
    }
    if !matches!(policy, Egress::Rules(_)) {
        return Err(
            "credentials need an egress allow list (a sandbox with \"open\" egress \
                    skips the proxy that adds them)"
                .into(),
        );
    }
    if creds.len() > MAX_CREDENTIALS {
        return Err(format!("at most {MAX_CREDENTIALS} credentials"));
    }
    for c in creds {
        if c.secret.len() > MAX_SECRET {
            return Err(format!(
                "credential for {}: the secret is over {MAX_SECRET} bytes",
                c.host
            ));
        }
        built(c).map_err(|e| format!("credential for {}: {e}", c.host))?;
        // A wildcard's names are checked by one of them.
        let host = match c.host.trim().strip_prefix("*.") {
            Some(rest) => format!("berth-check.{rest}"),
            None => c.host.clone(),
        };
        if let HostVerdict::Deny(d) = egress::host_verdict(policy, &host) {
            return Err(format!(
                "credential for {}: the egress policy refuses it ({}); allow it too",
                c.host,
                d.as_str()
            ));
        }
    }
    Ok(())
}

impl Sandboxes {
    pub(super) fn check_credentials(
        &self,
        policy: &Egress,
        creds: &[SandboxCredential],
    ) -> Result<()> {
        check(policy, creds).map_err(Error::BadRequest)?;
        if !creds.is_empty() && self.ctx.edge.get().is_none() {
            return Err(Error::BadRequest(
                "this controller has no egress proxy to add credentials".into(),
            ));
        }
        Ok(())
    }

    /// Seals `creds` into the sandbox's row, lists them in its record and grants them: the
    /// row as it is then.
    pub(super) fn keep_credentials(
        &self,
        row: SandboxRow,
        creds: &[SandboxCredential],
    ) -> Result<SandboxRow> {
        if creds.is_empty() {
            return Ok(row);
        }
        let id = row.id.as_str();
        let json = serde_json::to_string(creds).map_err(|e| Error::Internal(e.to_string()))?;
        self.ctx.store.set_credentials(id, &json)?;
        let views: Vec<CredentialView> = creds
            .iter()
            .map(|c| CredentialView {
                host: egress::normalise(&c.host),
                header: c.header.clone().unwrap_or_else(|| "Authorization".into()),
            })
            .collect();
        self.ctx.store.edit_egress(id, |r| r.credentials = views)?;
        grant(&self.ctx, id, creds);
        self.ctx.get_row(id)
    }
}

fn grant(ctx: &Ctx, id: &str, creds: &[SandboxCredential]) {
    let Some(edge) = ctx.edge.get() else {
        return;
    };
    let built: Vec<Credential> = creds.iter().filter_map(|c| built(c).ok()).collect();
    edge.grant(id, built);
}

/// After a restart: the credentials of every live sandbox, granted again.
pub fn regrant_all(ctx: &Ctx) {
    let rows = ctx.store.sandboxes(&[]).unwrap_or_default();
    for row in rows.into_iter().filter(|r| r.status.live()) {
        match ctx.store.credentials(&row.id) {
            Ok(Some(json)) => match serde_json::from_str::<Vec<SandboxCredential>>(&json) {
                Ok(creds) => grant(ctx, &row.id, &creds),
                Err(e) => tracing::warn!(sandbox = %row.id, error = %e, "credentials unreadable"),
            },
            Ok(None) => {}
            Err(e) => tracing::warn!(sandbox = %row.id, error = %e, "credentials unreadable"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_protocol::egress::{EgressMode, EgressRules};

    fn cred(host: &str) -> SandboxCredential {
        SandboxCredential {
            host: host.into(),
            header: None,
            value: None,
            basic_user: None,
            secret: "s3cret".into(),
        }
    }

    #[test]
    fn credentials_need_the_proxy_and_an_allowed_host() {
        let rules = Egress::Rules(EgressRules {
            allow: vec!["api.test".into(), "*.corp.test".into()],
            deny_private: true,
        });
        assert!(check(&rules, &[cred("api.test"), cred("*.corp.test")]).is_ok());
        assert!(check(&Egress::Mode(EgressMode::Open), &[]).is_ok());
        let open = check(&Egress::Mode(EgressMode::Open), &[cred("api.test")]).unwrap_err();
        assert!(open.contains("allow list"), "{open}");
        let refused = check(&rules, &[cred("other.test")]).unwrap_err();
        assert!(refused.contains("not_allowed"), "{refused}");
        let mut bad = cred("api.test");
        bad.value = Some("no placeholder".into());
        assert!(check(&rules, &[bad]).unwrap_err().contains("{secret}"));
        let mut empty = cred("api.test");
        empty.secret.clear();
        assert!(check(&rules, &[empty]).unwrap_err().contains("empty"));
        let mut big = cred("api.test");
        big.secret = "x".repeat(MAX_SECRET + 1);
        assert!(check(&rules, &[big]).is_err());
        assert!(check(&rules, &vec![cred("api.test"); MAX_CREDENTIALS + 1]).is_err());
        // What the record shows never holds the secret.
        assert!(!format!("{:?}", cred("api.test")).contains("s3cret"));
    }
}
