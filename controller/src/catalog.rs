//! The catalog of profiles, desktop apps and bundles (`images/catalog.toml`, built in).

use serde::{Deserialize, Serialize};

const BUILTIN: &str = include_str!("../../images/catalog.toml");

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub name: String,
    pub description: String,
    /// Which kind of provider serves it (`process`, `docker`, `kubernetes`, `vm`).
    pub driver_hint: String,
    /// `novnc` or `none`.
    pub viewer: String,
    /// Whether the agent runs the desktop stack.
    pub desktop: bool,
    pub enabled: bool,
    /// Resource limits where the provider enforces them (Docker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct App {
    pub name: String,
    pub description: String,
    pub packages: Vec<String>,
    pub launcher: String,
    /// Servers the app listens on inside the sandbox, by name (`vlc = 8080`): an image with
    /// the app declares them (`berth.ports`) and its sandboxes publish them as endpoints.
    #[serde(default)]
    pub ports: std::collections::BTreeMap<String, u16>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bundle {
    pub name: String,
    pub description: String,
    pub apps: Vec<String>,
    #[serde(default)]
    pub packages: Vec<String>,
    /// The sandbox user's password, and whether it may use sudo (without asking it: harness
    /// steps run `sudo` without `-S` too). That makes the user root-equivalent inside the
    /// sandbox; the agent's token stays out of its reach and `berth-agent init` restarts a
    /// killed agent.
    #[serde(default)]
    pub user_password: Option<String>,
    #[serde(default)]
    pub sudo: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    #[serde(rename = "profile")]
    pub profiles: Vec<Profile>,
    #[serde(rename = "app")]
    pub apps: Vec<App>,
    #[serde(rename = "bundle")]
    pub bundles: Vec<Bundle>,
}

impl Catalog {
    pub fn builtin() -> Catalog {
        Self::parse(BUILTIN).expect("images/catalog.toml is valid")
    }

    pub fn parse(text: &str) -> anyhow::Result<Catalog> {
        let c: Catalog = toml::from_str(text)?;
        for b in &c.bundles {
            for a in &b.apps {
                anyhow::ensure!(
                    c.apps.iter().any(|x| &x.name == a),
                    "bundle {} names unknown app {a}",
                    b.name
                );
            }
        }
        Ok(c)
    }

    pub fn profile(&self, name: &str) -> Option<&Profile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// The entries of one kind as wire objects; `None` for an unknown kind.
    pub fn list(&self, kind: &str) -> Option<Vec<serde_json::Value>> {
        let to = |v: serde_json::Result<serde_json::Value>| v.unwrap_or_default();
        Some(match kind {
            "profile" => self
                .profiles
                .iter()
                .map(|p| to(serde_json::to_value(p)))
                .collect(),
            "desktop_app" => self
                .apps
                .iter()
                .map(|a| to(serde_json::to_value(a)))
                .collect(),
            "desktop_app_bundle" => self
                .bundles
                .iter()
                .map(|b| to(serde_json::to_value(b)))
                .collect(),
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_catalog_has_the_profiles_apps_and_osworld_bundle() {
        let c = Catalog::builtin();
        assert!(c.profile("desktop").unwrap().desktop);
        assert!(!c.profile("ide").unwrap().desktop);
        assert!(!c.profile("windows").unwrap().enabled);
        let osworld = c.bundles.iter().find(|b| b.name == "osworld").unwrap();
        assert!(osworld.apps.contains(&"libreoffice".to_string()));
        assert!(osworld.packages.contains(&"wmctrl".to_string()));
        assert!(c.list("nope").is_none());
        assert_eq!(c.list("profile").unwrap()[0]["viewer"], "novnc");
    }
}
