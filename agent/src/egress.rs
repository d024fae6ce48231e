//! A sandbox behind the controller's egress proxy: the proxy's CA installed where programs
//! look for trusted certificates (the system bundle, Chrome's policy), and the proxy written
//! where programs look for one without reading the environment (apt, Chrome under GNOME,
//! PAM's `/etc/environment` for `sudo` and logins). Run as root at start, before the desktop.

use std::path::Path;

use base64::Engine;
use berth_protocol::egress::trust;

/// Chrome's and Chromium's managed policy directories.
const POLICY_DIRS: [&str; 2] = [
    "etc/chromium/policies/managed",
    "etc/opt/chrome/policies/managed",
];
const POLICY_FILE: &str = "berth-egress.json";
const APT_FILE: &str = "etc/apt/apt.conf.d/95berth-egress-proxy";

/// What the controller set: the CA (PEM) and the proxy (`http://host:port`).
#[derive(Debug, Default)]
pub struct Setting {
    pub ca_pem: Option<String>,
    pub proxy: Option<String>,
    pub no_proxy: Option<String>,
}

impl Setting {
    pub fn from_env() -> Setting {
        let var = |n: &str| std::env::var(n).ok().filter(|v| !v.is_empty());
        Setting {
            ca_pem: var(trust::CA_VAR),
            proxy: var("https_proxy").or_else(|| var("http_proxy")),
            no_proxy: var("no_proxy"),
        }
    }
}

/// Installs `s` under `root` (`/` in a sandbox); nothing when the sandbox is not behind the
/// proxy. Each file is written whole; the bundle gets the CA once.
pub fn install(s: &Setting, root: &Path) -> std::io::Result<()> {
    let Some(proxy) = &s.proxy else {
        return Ok(());
    };
    let mut policy = serde_json::Map::new();
    // Chrome's bypass list: `;`-separated, IPv6 addresses in brackets.
    let bypass: Vec<String> = (s.no_proxy.as_deref().unwrap_or_default().split(','))
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| match e.contains(':') && !e.starts_with('[') {
            true => format!("[{e}]"),
            false => e.to_string(),
        })
        .collect();
    let bypass = bypass.join(";");
    policy.insert(
        "ProxySettings".into(),
        serde_json::json!({
            "ProxyMode": "fixed_servers",
            "ProxyServer": proxy,
            "ProxyBypassList": bypass,
        }),
    );
    // No password is kept by the browser: the login tool's sign-ins leave nothing in the
    // profile beyond the session's cookies, and no "Save password?" offer for an agent to
    // accept.
    policy.insert("PasswordManagerEnabled".into(), serde_json::json!(false));
    if let Some(pem) = &s.ca_pem {
        let der = pem_body(pem).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the egress CA is not a PEM certificate",
            )
        })?;
        write(
            &root.join(trust::CA_FILE.trim_start_matches('/')),
            pem.as_bytes(),
        )?;
        add_to_bundle(&root.join(trust::BUNDLE.trim_start_matches('/')), pem)?;
        policy.insert("CACertificates".into(), serde_json::json!([der]));
    }
    let policy = serde_json::to_vec_pretty(&serde_json::Value::Object(policy))?;
    for dir in POLICY_DIRS {
        write(&root.join(dir).join(POLICY_FILE), &policy)?;
    }
    let apt = format!("Acquire::http::Proxy \"{proxy}\";\nAcquire::https::Proxy \"{proxy}\";\n");
    write(&root.join(APT_FILE), apt.as_bytes())?;
    add_environment(&root.join("etc/environment"), proxy, s.no_proxy.as_deref())
}

/// The base64 DER of a PEM certificate (its body, lines joined), checked to decode.
fn pem_body(pem: &str) -> Option<String> {
    let body = pem
        .trim()
        .strip_prefix("-----BEGIN CERTIFICATE-----")?
        .split("-----END CERTIFICATE-----")
        .next()?;
    let b64: String = body.split_whitespace().collect();
    base64::engine::general_purpose::STANDARD
        .decode(&b64)
        .ok()?;
    Some(b64)
}

fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("berth-tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

fn add_to_bundle(bundle: &Path, pem: &str) -> std::io::Result<()> {
    let have = std::fs::read_to_string(bundle).unwrap_or_default();
    if have.contains(pem.trim()) {
        return Ok(());
    }
    let mut all = have;
    if !all.is_empty() && !all.ends_with('\n') {
        all.push('\n');
    }
    all.push_str(pem.trim());
    all.push('\n');
    write(bundle, all.as_bytes())
}

/// `/etc/environment` with the proxy variables (replacing earlier ones).
fn add_environment(path: &Path, proxy: &str, no_proxy: Option<&str>) -> std::io::Result<()> {
    let names = crate::account::PROXY_VARS;
    let have = std::fs::read_to_string(path).unwrap_or_default();
    let mut out: Vec<String> = have
        .lines()
        .filter(|l| !names.iter().any(|n| l.starts_with(&format!("{n}="))))
        .map(str::to_string)
        .collect();
    for n in names.iter().filter(|n| !n.eq_ignore_ascii_case("no_proxy")) {
        out.push(format!("{n}={proxy}"));
    }
    if let Some(np) = no_proxy {
        out.push(format!("no_proxy={np}"));
        out.push(format!("NO_PROXY={np}"));
    }
    write(path, (out.join("\n") + "\n").as_bytes())
}

/// At the agent's start: installs what the controller set, when the agent may (root).
pub fn install_from_env() {
    let s = Setting::from_env();
    if s.proxy.is_none() {
        return;
    }
    if !nix::unistd::Uid::effective().is_root() {
        tracing::info!("egress: not root, so the proxy's CA and settings are left to the image");
        return;
    }
    match install(&s, Path::new("/")) {
        Ok(()) => tracing::info!(ca = s.ca_pem.is_some(), "egress: proxy settings installed"),
        Err(e) => tracing::warn!(error = %e, "egress: installing the proxy's settings failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEM: &str = "-----BEGIN CERTIFICATE-----\nQUJD\nREVG\n-----END CERTIFICATE-----\n";

    #[test]
    fn the_ca_and_the_proxy_land_where_programs_look_once() {
        let root = tempfile::tempdir().unwrap();
        let bundle = root.path().join(trust::BUNDLE.trim_start_matches('/'));
        std::fs::create_dir_all(bundle.parent().unwrap()).unwrap();
        std::fs::write(
            &bundle,
            "-----BEGIN CERTIFICATE-----\nWFla\n-----END CERTIFICATE-----",
        )
        .unwrap();
        std::fs::create_dir_all(root.path().join("etc")).unwrap();
        std::fs::write(
            root.path().join("etc/environment"),
            "PATH=/bin\nhttp_proxy=http://old\n",
        )
        .unwrap();
        let s = Setting {
            ca_pem: Some(PEM.into()),
            proxy: Some("http://172.30.0.1:3128".into()),
            no_proxy: Some("localhost,127.0.0.1,::1".into()),
        };
        install(&s, root.path()).unwrap();
        install(&s, root.path()).unwrap();
        let b = std::fs::read_to_string(&bundle).unwrap();
        assert_eq!(b.matches("QUJD").count(), 1, "{b}");
        assert!(b.starts_with("-----BEGIN CERTIFICATE-----\nWFla"));
        let policy: serde_json::Value = serde_json::from_slice(
            &std::fs::read(root.path().join(POLICY_DIRS[0]).join(POLICY_FILE)).unwrap(),
        )
        .unwrap();
        assert_eq!(policy["CACertificates"][0], "QUJDREVG");
        assert_eq!(
            policy["ProxySettings"]["ProxyServer"],
            "http://172.30.0.1:3128"
        );
        assert_eq!(
            policy["ProxySettings"]["ProxyBypassList"],
            "localhost;127.0.0.1;[::1]"
        );
        let env = std::fs::read_to_string(root.path().join("etc/environment")).unwrap();
        assert!(env.starts_with("PATH=/bin\n"), "{env}");
        assert_eq!(env.matches("http_proxy=").count(), 1, "{env}");
        assert!(env.contains("https_proxy=http://172.30.0.1:3128\n"));
        let apt = std::fs::read_to_string(root.path().join(APT_FILE)).unwrap();
        assert!(apt.contains("Acquire::https::Proxy \"http://172.30.0.1:3128\";"));
        assert!(
            root.path()
                .join(trust::CA_FILE.trim_start_matches('/'))
                .exists()
        );
    }

    #[test]
    fn nothing_without_a_proxy_and_no_garbage_as_a_ca() {
        let root = tempfile::tempdir().unwrap();
        install(&Setting::default(), root.path()).unwrap();
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
        let s = Setting {
            ca_pem: Some("not a certificate".into()),
            proxy: Some("http://p:1".into()),
            no_proxy: None,
        };
        assert!(install(&s, root.path()).is_err());
    }
}
