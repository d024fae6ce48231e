//! The catalog of profiles, desktop apps and bundles (`images/catalog.toml`, built in).

use serde::{Deserialize, Serialize};

const BUILTIN: &str = include_str!("../../images/catalog.toml");

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// The canonical name (the seed's: `desktop-ubuntu`, `ide-ubuntu`, …).
    pub name: String,
    /// Other names the profile answers to (`desktop`, `ide`): a create, lease, pool or config
    /// may use them; what the controller stores and reports is `name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
    pub description: String,
    /// The provider that serves it when the config maps it to none (`process`, `docker`,
    /// `kubernetes`, `vm`); the catalog route reports the one serving it on this controller.
    pub driver_hint: String,
    /// The viewer kind: `novnc` (a desktop), `jupyterlab` (a browser IDE the agent serves on
    /// its port, see [`ide_port`]) or `none`.
    pub viewer: String,
    /// Whether the agent runs the desktop stack.
    pub desktop: bool,
    pub enabled: bool,
    /// Resource limits (see `berth_protocol::controller::Limits`; the config's `[limits]`
    /// overrides them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_shares: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_mb: Option<u64>,
}

/// The port a browser-IDE viewer kind is served on inside the sandbox (loopback, reached
/// through the preview route); `None` for kinds that are not an IDE.
pub fn ide_port(viewer: &str) -> Option<u16> {
    match viewer {
        "jupyterlab" => Some(8888),
        _ => None,
    }
}

impl Profile {
    /// The IDE the agent serves for this profile (`--ide`) and its port.
    pub fn ide(&self) -> Option<(&str, u16)> {
        ide_port(&self.viewer).map(|port| (self.viewer.as_str(), port))
    }
}

/// A release the image builder fetches (an app that is no Debian package): the tarball's URL,
/// its pinned sha256, the directory it is unpacked into (its top directory stripped), and the
/// commands linked into /usr/bin (`code = "bin/code"`: /usr/bin/code → `<dir>/bin/code`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Download {
    pub url: String,
    pub sha256: String,
    pub dir: String,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub bin: std::collections::BTreeMap<String, String>,
}

/// A launcher the image builder writes to /usr/share/applications for an app that brings none
/// (a downloaded release): what the dock, the app grid and `xdg-open` find.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DesktopEntry {
    pub file: String,
    pub name: String,
    pub exec: String,
    pub icon: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wm_class: Option<String>,
    pub categories: String,
}

impl DesktopEntry {
    /// The file's text.
    pub fn render(&self) -> String {
        let mut text = format!(
            "[Desktop Entry]\nType=Application\nName={}\nExec={}\nIcon={}\nTerminal=false\n\
             Categories={}\nStartupNotify=true\n",
            self.name, self.exec, self.icon, self.categories
        );
        if let Some(c) = &self.wm_class {
            text.push_str(&format!("StartupWMClass={c}\n"));
        }
        text
    }

    /// A file name of its own, and no line breaks in a value (each is one line of the file).
    pub fn check(&self) -> Result<(), String> {
        let file_ok = self.file.ends_with(".desktop")
            && !self.file.contains('/')
            && !self.file.starts_with('.');
        if !file_ok {
            return Err(format!(
                "desktop entry file {:?} must be NAME.desktop",
                self.file
            ));
        }
        let values = [&self.name, &self.exec, &self.icon, &self.categories];
        if values
            .into_iter()
            .chain(&self.wm_class)
            .any(|v| v.contains(['\n', '\r']))
        {
            return Err(format!(
                "desktop entry {}: a value holds a line break",
                self.file
            ));
        }
        Ok(())
    }
}

/// Whether `url` names the loopback host over plain HTTP (a local mirror or a test's server:
/// the pinned sha256 still decides what is installed).
fn loopback_http(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    };
    matches!(host, "127.0.0.1" | "localhost" | "[::1]")
}

impl Download {
    /// Refuses what the builder could not install safely: a URL that is not https (or plain
    /// http to the loopback host), a sha256 that is not 64 hex digits, a directory outside
    /// /opt, a command link that leaves the directory.
    pub fn check(&self) -> Result<(), String> {
        if !(self.url.starts_with("https://") || loopback_http(&self.url))
            || self.url.contains(char::is_whitespace)
        {
            return Err(format!("download url {:?} must be an https URL", self.url));
        }
        if self.sha256.len() != 64 || !self.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "download {} needs its sha256 pinned (64 hex digits), not {:?}",
                self.url, self.sha256
            ));
        }
        let dir = std::path::Path::new(&self.dir);
        let under_opt = dir.starts_with("/opt")
            && dir.components().count() > 2
            && dir.components().all(|c| {
                matches!(
                    c,
                    std::path::Component::RootDir | std::path::Component::Normal(_)
                )
            });
        if !under_opt {
            return Err(format!(
                "download dir {:?} must be a directory under /opt",
                self.dir
            ));
        }
        for (name, target) in &self.bin {
            let name_ok = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
                && !name.starts_with('.');
            let target_ok = std::path::Path::new(target)
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)))
                && !target.is_empty();
            if !name_ok || !target_ok {
                return Err(format!(
                    "download bin {name:?} = {target:?}: a command name and a relative path inside {}",
                    self.dir
                ));
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct App {
    pub name: String,
    pub description: String,
    #[serde(default)]
    pub packages: Vec<String>,
    pub launcher: String,
    /// Servers the app listens on inside the sandbox, by name (`vlc = 8080`): an image with
    /// the app declares them (`berth.ports`) and its sandboxes publish them as endpoints.
    #[serde(default)]
    pub ports: std::collections::BTreeMap<String, u16>,
    /// A release the image builder downloads and unpacks (an app Debian does not package).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub download: Option<Download>,
    /// Its launcher, when what is installed brings none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desktop_entry: Option<DesktopEntry>,
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
    /// The desktop session its images run (`gnome`: a `[sessions.gnome]` recipe); the
    /// profile's XFCE when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
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
        let mut names = std::collections::BTreeSet::new();
        for p in &c.profiles {
            for n in std::iter::once(&p.name).chain(&p.aliases) {
                anyhow::ensure!(names.insert(n.as_str()), "profile name {n} is used twice");
            }
        }
        for a in &c.apps {
            for port in a.ports.keys() {
                anyhow::ensure!(
                    !berth_protocol::controller::RESERVED_ENDPOINT_NAMES.contains(&port.as_str()),
                    "app {} declares a port named {port}, which endpoints use themselves",
                    a.name
                );
            }
        }
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

    /// The profile `name` names, canonically or by an alias.
    pub fn profile(&self, name: &str) -> Option<&Profile> {
        self.profiles
            .iter()
            .find(|p| p.name == name || p.aliases.iter().any(|a| a == name))
    }

    /// The canonical name of a profile name or alias; an unknown name as it is.
    pub fn canonical<'a>(&'a self, name: &'a str) -> &'a str {
        self.profile(name).map_or(name, |p| p.name.as_str())
    }

    /// Every name a create accepts, canonical first: `desktop-ubuntu (alias desktop), …`.
    pub fn known_profiles(&self) -> String {
        self.profiles
            .iter()
            .map(|p| match p.aliases.is_empty() {
                true => p.name.clone(),
                false => format!("{} (alias {})", p.name, p.aliases.join(", ")),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The port an app declares under `name` (`vlc` → 8080), from any app.
    pub fn declared_port(&self, name: &str) -> Option<u16> {
        self.apps.iter().find_map(|a| a.ports.get(name).copied())
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
        assert!(c.profile("desktop-ubuntu").unwrap().desktop);
        assert!(!c.profile("ide-ubuntu").unwrap().desktop);
        assert!(!c.profile("desktop-windows").unwrap().enabled);
        assert!(!c.profile("desktop-macos").unwrap().enabled);
        let osworld = c.bundles.iter().find(|b| b.name == "osworld").unwrap();
        assert!(osworld.apps.contains(&"libreoffice".to_string()));
        assert!(osworld.packages.contains(&"wmctrl".to_string()));
        assert!(c.list("nope").is_none());
        assert_eq!(c.list("profile").unwrap()[0]["viewer"], "novnc");
        assert_eq!(c.profile("ide-ubuntu").unwrap().viewer, "jupyterlab");
        assert_eq!(
            c.profile("ide-ubuntu").unwrap().ide(),
            Some(("jupyterlab", 8888))
        );
        assert_eq!(c.profile("desktop-ubuntu").unwrap().ide(), None);
        assert_eq!(c.declared_port("vlc"), Some(8080));
    }

    /// The catalog's profile entries as `GET /sandbox/v1/catalog?kind=profile` serves them
    /// (before the route puts the serving provider in `driver_hint`).
    #[test]
    fn the_profile_entries_are_golden() {
        let items = Catalog::builtin().list("profile").unwrap();
        let names: Vec<&str> = items.iter().filter_map(|p| p["name"].as_str()).collect();
        assert_eq!(
            names,
            [
                "desktop-ubuntu",
                "ide-ubuntu",
                "custom",
                "desktop-windows",
                "desktop-macos"
            ]
        );
        let without_description = |mut v: serde_json::Value| {
            assert!(v["description"].as_str().is_some_and(|d| !d.is_empty()));
            v.as_object_mut().unwrap().remove("description");
            serde_json::to_string(&v).unwrap()
        };
        assert_eq!(
            without_description(items[0].clone()),
            r#"{"aliases":["desktop"],"cpu_shares":1024,"cpus":2.0,"desktop":true,"driver_hint":"process","enabled":true,"memory_mb":4096,"name":"desktop-ubuntu","pids":2048,"shm_mb":512,"viewer":"novnc"}"#
        );
        assert_eq!(
            without_description(items[1].clone()),
            r#"{"aliases":["ide"],"cpu_shares":1024,"cpus":1.0,"desktop":false,"driver_hint":"process","enabled":true,"memory_mb":2048,"name":"ide-ubuntu","pids":1024,"shm_mb":64,"viewer":"jupyterlab"}"#
        );
        assert_eq!(
            without_description(items[2].clone()),
            r#"{"aliases":["byo"],"cpu_shares":1024,"cpus":1.0,"desktop":false,"driver_hint":"docker","enabled":true,"memory_mb":2048,"name":"custom","pids":1024,"shm_mb":64,"viewer":"none"}"#
        );
        assert_eq!(
            without_description(items[3].clone()),
            r#"{"aliases":["windows"],"desktop":true,"driver_hint":"vm","enabled":false,"name":"desktop-windows","viewer":"novnc"}"#
        );
        assert_eq!(
            without_description(items[4].clone()),
            r#"{"aliases":["macos"],"desktop":true,"driver_hint":"vm","enabled":false,"name":"desktop-macos","viewer":"novnc"}"#
        );
    }

    #[test]
    fn the_older_names_are_aliases_of_the_seeds() {
        let c = Catalog::builtin();
        for (alias, name) in [
            ("desktop", "desktop-ubuntu"),
            ("ide", "ide-ubuntu"),
            ("windows", "desktop-windows"),
            ("macos", "desktop-macos"),
        ] {
            assert_eq!(c.profile(alias).unwrap().name, name);
            assert_eq!(c.canonical(alias), name);
            assert_eq!(c.canonical(name), name);
        }
        assert_eq!(c.canonical("nope"), "nope");
        assert!(c.profile("desktop-ubuntu-x").is_none());
        assert!(
            c.known_profiles()
                .starts_with("desktop-ubuntu (alias desktop), ide-ubuntu")
        );
    }

    #[test]
    fn downloads_need_https_a_pinned_sha256_and_a_directory_under_opt() {
        let app = Catalog::builtin()
            .apps
            .into_iter()
            .find(|a| a.name == "openvscode")
            .unwrap();
        let d = app.download.unwrap();
        assert!(
            d.url
                .starts_with("https://github.com/gitpod-io/openvscode-server/")
        );
        assert!(d.check().unwrap_err().contains("sha256 pinned"));
        let ok = Download {
            sha256: "ab".repeat(32),
            ..d.clone()
        };
        assert_eq!(ok.check(), Ok(()));
        for bad in [
            Download {
                url: "http://x/y.tgz".into(),
                ..ok.clone()
            },
            Download {
                dir: "/usr/local/x".into(),
                ..ok.clone()
            },
            Download {
                dir: "/opt".into(),
                ..ok.clone()
            },
            Download {
                dir: "/opt/../etc".into(),
                ..ok.clone()
            },
            Download {
                sha256: "zz".repeat(32),
                ..ok.clone()
            },
            Download {
                url: "http://127.0.0.1.example.com/y.tgz".into(),
                ..ok.clone()
            },
            Download {
                bin: [("code".to_string(), "../../usr/bin/sh".to_string())].into(),
                ..ok.clone()
            },
            Download {
                bin: [("../code".to_string(), "bin/code".to_string())].into(),
                ..ok.clone()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
        // A local mirror or a test's server over plain HTTP: the sha256 still decides.
        for url in [
            "http://127.0.0.1:8123/vs.tgz",
            "http://localhost/x",
            "http://[::1]:9/x",
        ] {
            let local = Download {
                url: url.into(),
                ..ok.clone()
            };
            assert_eq!(local.check(), Ok(()), "{url}");
        }
        // VS Code is pinned, its command linked and its launcher written.
        let vscode = Catalog::builtin()
            .apps
            .into_iter()
            .find(|a| a.name == "vscode")
            .unwrap();
        let d = vscode.download.as_ref().unwrap();
        assert_eq!(d.check(), Ok(()));
        assert_eq!(d.bin.get("code").map(String::as_str), Some("bin/code"));
        let entry = vscode.desktop_entry.as_ref().unwrap();
        assert_eq!(entry.check(), Ok(()));
        let text = entry.render();
        assert!(text.contains("Exec=/usr/bin/code %F\n"), "{text}");
        assert!(text.contains("StartupWMClass=Code\n"), "{text}");
        let mut bad = entry.clone();
        bad.name.push_str("\nExec=evil");
        assert!(bad.check().is_err());
    }

    #[test]
    fn a_name_used_twice_or_a_reserved_port_name_is_refused() {
        let profile = |name: &str, aliases: &str| {
            format!(
                "[[profile]]\nname = \"{name}\"\naliases = [{aliases}]\ndescription = \"\"\n\
                 driver_hint = \"process\"\nviewer = \"none\"\ndesktop = false\nenabled = true\n"
            )
        };
        let app = |port: &str| {
            format!(
                "[[app]]\nname = \"a\"\ndescription = \"\"\npackages = []\nlauncher = \"a\"\n\
                 ports = {{ {port} = 1 }}\n"
            )
        };
        let ok = format!("bundle = []\n{}{}", profile("x", "\"y\""), app("web"));
        assert!(Catalog::parse(&ok).is_ok(), "{ok}");
        let twice = format!(
            "bundle = []\n{}{}{}",
            profile("x", "\"y\""),
            profile("y", ""),
            app("web")
        );
        let e = Catalog::parse(&twice).unwrap_err().to_string();
        assert!(e.contains("used twice"), "{e}");
        let reserved = format!("bundle = []\n{}{}", profile("x", ""), app("preview"));
        let e = Catalog::parse(&reserved).unwrap_err().to_string();
        assert!(e.contains("endpoints use themselves"), "{e}");
    }
}
