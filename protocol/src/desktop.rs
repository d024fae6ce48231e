//! The workstation: `GET /v1/ready`, `GET /v1/browser` (and `POST /v1/browser/restart`, which
//! answers the same once the new browser is up), `GET /v1/a11y`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `GET /v1/ready[?wait=30s]`: 200 when `ready`, 503 otherwise, the same body either way.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default, schemars::JsonSchema)]
pub struct ReadyReport {
    pub ready: bool,
    /// The desktop's components and the end-to-end checks, by name.
    pub components: BTreeMap<String, ComponentStatus>,
}

/// One component's or check's condition.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct ComponentStatus {
    pub ok: bool,
    /// `starting`, `up`, `down`, `gave_up`, `stopped`.
    pub state: String,
    pub reason: String,
    /// RFC 3339: when `ok`, `state` or `reason` last changed.
    pub since: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    pub restarts: u32,
}

/// `GET /v1/browser`, `POST /v1/browser/restart`. Fields are alphabetical: the order the agent
/// has always sent them in.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct BrowserInfo {
    /// The TCP relay's bound address (`--cdp-listen`), when it has one.
    pub cdp_listen: Option<String>,
    pub pid: Option<u32>,
    pub protocol_version: Option<String>,
    pub targets: Vec<BrowserTarget>,
    pub user_agent: Option<String>,
    /// `Chrome/…`.
    pub version: Option<String>,
    /// The browser target through this surface's WebSocket relay.
    pub ws_url: String,
}

/// One CDP target, reached through the WebSocket relay at `ws_url`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct BrowserTarget {
    pub id: Option<String>,
    pub title: Option<String>,
    /// `page`, `browser`, `service_worker`, …
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub url: Option<String>,
    pub ws_url: String,
}

/// `GET /v1/a11y`: every application on the AT-SPI bus with its tree.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default, schemars::JsonSchema)]
pub struct A11yTree {
    pub applications: Vec<A11yNode>,
}

/// One accessible object.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default, schemars::JsonSchema)]
pub struct A11yNode {
    /// The role name with spaces as dashes (`push-button`), `unknown` when empty.
    pub role: String,
    pub name: String,
    /// pyatspi's `STATE_*` names, lowercased (`enabled`, `showing`, …).
    pub states: Vec<String>,
    pub attributes: BTreeMap<String, String>,
    /// Screen position and size, for nodes that are visible and showing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub screencoord: Option<(i32, i32)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<(i32, i32)>,
    pub image: bool,
    pub selection: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<A11yValue>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub actions: Vec<A11yAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<A11yNode>,
}

impl A11yNode {
    pub fn has_state(&self, s: &str) -> bool {
        self.states.iter().any(|x| x == s)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default, schemars::JsonSchema)]
pub struct A11yAction {
    pub name: String,
    pub description: String,
    pub keybinding: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default, schemars::JsonSchema)]
pub struct A11yValue {
    pub current: f64,
    pub min: f64,
    pub max: f64,
    pub step: f64,
}

/// The programs OSWorld's setups, getters and checks run in the guest (docs/src/images/osworld.md: "The osworld
/// image" lists them with the tasks that call them).
pub const OSWORLD_PROGRAMS: &[&str] = &[
    "python",
    "python3",
    "bash",
    "sudo",
    "wmctrl",
    "xdotool",
    "xdg-open",
    "xdg-mime",
    "gsettings",
    "gio",
    "dconf",
    "ffmpeg",
    "socat",
    "curl",
    "pkill",
    "pgrep",
    "ps",
    "killall",
    "timedatectl",
    "pulseaudio",
    "pactl",
    "bc",
    "zip",
    "unzip",
    "tar",
    "gzip",
    "file",
    "git",
    "jq",
    "xsel",
    "xclip",
    "sar",
    "expect",
    "diff",
    "awk",
    "find",
    "getent",
    "update-desktop-database",
    "google-chrome",
    "google-chrome-stable",
    "libreoffice",
    "soffice",
    "gimp",
    "vlc",
    "thunderbird",
    "nautilus",
    "gnome-terminal",
    "gedit",
    "evince",
    "eog",
    "totem",
    "vim",
    "code",
];

/// `GET /v1/desktop/state`: what an agent's view of the desktop depends on, read from the live
/// session, with the image's expected state and every difference from it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default, schemars::JsonSchema)]
pub struct DesktopState {
    /// `gnome`, `xfce`.
    pub session: String,
    pub screen: ScreenSize,
    /// The locale programs run in (`LANG`).
    pub lang: String,
    /// GTK theme and icon theme (`org.gnome.desktop.interface`), when the session has them.
    pub theme: Option<String>,
    pub icon_theme: Option<String>,
    /// The dock's favourites (`org.gnome.shell favorite-apps`), in order.
    pub favorites: Vec<String>,
    /// Settings OSWorld's tasks read or change, as `gsettings get SCHEMA KEY` prints them
    /// (`"org.gnome.desktop.interface text-scaling-factor": "1.0"`); a key the image lacks is
    /// absent.
    pub settings: BTreeMap<String, String>,
    /// The default application of each file type (`xdg-mime query default`), `null` for none.
    pub handlers: BTreeMap<String, Option<String>>,
    /// Every top-level window the window manager manages.
    pub windows: Vec<DesktopWindow>,
    /// First-run state by app (`vlc`, `libreoffice`, `chrome`, `gnome`): done, and what says so.
    pub first_run: BTreeMap<String, FirstRun>,
    /// The programs OSWorld's setups, getters and checks call in the guest, and whether each is
    /// on the sandbox user's PATH.
    pub programs: BTreeMap<String, bool>,
    /// The default sink's volume in percent (PulseAudio), when there is one.
    pub volume_percent: Option<u32>,
    /// The system time zone (`America/Los_Angeles`) and its offset now (`-0800`).
    pub time_zone: Option<String>,
    pub utc_offset: Option<String>,
    /// What the image promises (`/usr/share/berth/desktop-expected.json`), when it says.
    pub expected: Option<ExpectedDesktop>,
    /// Each expected item against what is here (empty without `expected`).
    pub fidelity: Vec<FidelityRow>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default, schemars::JsonSchema)]
pub struct ScreenSize {
    pub width: u32,
    pub height: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default, schemars::JsonSchema)]
pub struct DesktopWindow {
    pub id: u32,
    pub title: String,
    /// WM_CLASS class and instance names.
    pub class: String,
    pub instance: String,
    pub x: i32,
    pub y: i32,
    pub width: u32,
    pub height: u32,
    pub maximized: bool,
    /// A dialog (`_NET_WM_WINDOW_TYPE_DIALOG`, or transient for another window).
    pub dialog: bool,
    pub focused: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default, schemars::JsonSchema)]
pub struct FirstRun {
    pub done: bool,
    pub detail: String,
}

/// An image's expected desktop state (the builder writes it from the session's recipe).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExpectedDesktop {
    pub session: String,
    pub lang: String,
    pub theme: Option<String>,
    pub icon_theme: Option<String>,
    #[serde(default)]
    pub favorites: Vec<String>,
    /// Settings whose value must be exactly this.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    #[serde(default)]
    pub handlers: BTreeMap<String, String>,
    /// Apps whose first run must be done.
    #[serde(default)]
    pub first_run: Vec<String>,
    /// Programs that must be present.
    #[serde(default)]
    pub programs: Vec<String>,
    /// No dialog is open (a fresh desktop shows none).
    #[serde(default)]
    pub no_dialogs: bool,
    /// The volume is below its maximum (OSWorld's "turn the volume up" must not hold).
    #[serde(default)]
    pub volume_below_max: bool,
    /// The time zone is not UTC+0 (OSWorld's "set the time zone to UTC+0" must not hold).
    #[serde(default)]
    pub time_zone_not_utc: bool,
    /// Windows by their WM_CLASS instance, each with the `instance.class` it must carry as
    /// `wmctrl -lx` prints it (`"Mail": "Mail.thunderbird"`): what OSWorld's steps name when
    /// they close or activate a window by class. Checked on the windows open at the time.
    #[serde(default)]
    pub window_classes: BTreeMap<String, String>,
}

/// One expected item and what is there.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default, schemars::JsonSchema)]
pub struct FidelityRow {
    /// What is checked (`theme`, `favorites`, `handler application/pdf`, `program bc`, …).
    pub item: String,
    pub ok: bool,
    pub expected: String,
    pub actual: String,
}

impl DesktopState {
    /// Each item of `expected` against this state (pure: the agent answers it, `berth verify`
    /// and `berth.osworld` read it).
    pub fn compare(&self, expected: &ExpectedDesktop) -> Vec<FidelityRow> {
        let mut rows = Vec::new();
        self.compare_look(expected, &mut rows);
        self.compare_configuration(expected, &mut rows);
        self.compare_conditions(expected, &mut rows);
        self.compare_window_classes(expected, &mut rows);
        rows
    }

    /// Each open window of an instance `expected.window_classes` names against the class it
    /// must carry; a row saying so when none is open (a fresh desktop has no app windows).
    fn compare_window_classes(&self, expected: &ExpectedDesktop, rows: &mut Vec<FidelityRow>) {
        for (instance, want) in &expected.window_classes {
            let open: Vec<String> = self
                .windows
                .iter()
                .filter(|w| &w.instance == instance)
                .map(|w| format!("{}.{}", w.instance, w.class))
                .collect();
            rows.push(FidelityRow::of(
                format!("window class {instance}"),
                want.clone(),
                if open.is_empty() {
                    "(no such window open)".into()
                } else {
                    open.join(", ")
                },
                open.iter().all(|c| c == want),
            ));
        }
    }

    /// The session, locale, themes and dock favourites.
    fn compare_look(&self, expected: &ExpectedDesktop, rows: &mut Vec<FidelityRow>) {
        rows.push(FidelityRow::of(
            "session".into(),
            expected.session.clone(),
            self.session.clone(),
            self.session == expected.session,
        ));
        rows.push(FidelityRow::of(
            "lang".into(),
            expected.lang.clone(),
            self.lang.clone(),
            self.lang == expected.lang,
        ));
        for (item, want, got) in [
            ("theme", &expected.theme, &self.theme),
            ("icon theme", &expected.icon_theme, &self.icon_theme),
        ] {
            if want.is_some() {
                rows.push(FidelityRow::of(
                    item.into(),
                    or_none(want),
                    or_none(got),
                    want == got,
                ));
            }
        }
        if !expected.favorites.is_empty() {
            rows.push(FidelityRow::of(
                "favorites".into(),
                expected.favorites.join(" "),
                self.favorites.join(" "),
                self.favorites == expected.favorites,
            ));
        }
    }

    /// The settings, file handlers, first-run states and programs.
    fn compare_configuration(&self, expected: &ExpectedDesktop, rows: &mut Vec<FidelityRow>) {
        for (key, want) in &expected.settings {
            let got = self.settings.get(key);
            rows.push(FidelityRow::of(
                format!("setting {key}"),
                want.clone(),
                got.cloned().unwrap_or_else(|| "(no such key)".into()),
                got == Some(want),
            ));
        }
        for (mime, want) in &expected.handlers {
            let got = self.handlers.get(mime).cloned().flatten();
            rows.push(FidelityRow::of(
                format!("handler {mime}"),
                want.clone(),
                or_none(&got),
                got.as_ref() == Some(want),
            ));
        }
        for app in &expected.first_run {
            let got = self.first_run.get(app);
            rows.push(FidelityRow::of(
                format!("first run {app}"),
                "done".into(),
                got.map(|f| f.detail.clone())
                    .unwrap_or_else(|| "not known".into()),
                got.is_some_and(|f| f.done),
            ));
        }
        for p in &expected.programs {
            let present = self.programs.get(p).copied().unwrap_or(false);
            rows.push(FidelityRow::of(
                format!("program {p}"),
                "present".into(),
                if present { "present" } else { "missing" }.into(),
                present,
            ));
        }
    }

    /// The conditions a task must not find already met: no dialog open, the volume below its
    /// maximum, a time zone other than UTC+0.
    fn compare_conditions(&self, expected: &ExpectedDesktop, rows: &mut Vec<FidelityRow>) {
        if expected.no_dialogs {
            let dialogs: Vec<&str> = self
                .windows
                .iter()
                .filter(|w| w.dialog)
                .map(|w| w.title.as_str())
                .collect();
            rows.push(FidelityRow::of(
                "no dialog open".into(),
                "none".into(),
                if dialogs.is_empty() {
                    "none".into()
                } else {
                    dialogs.join(", ")
                },
                dialogs.is_empty(),
            ));
        }
        if expected.volume_below_max {
            let v = self.volume_percent;
            rows.push(FidelityRow::of(
                "volume below maximum".into(),
                "< 100 %".into(),
                v.map(|v| format!("{v} %"))
                    .unwrap_or_else(|| "(no sink)".into()),
                v.is_some_and(|v| v < 100),
            ));
        }
        if expected.time_zone_not_utc {
            let off = self.utc_offset.clone();
            rows.push(FidelityRow::of(
                "time zone not UTC+0".into(),
                "an offset other than +0000".into(),
                format!("{} ({})", or_none(&self.time_zone), or_none(&off)),
                off.as_deref().is_some_and(|o| o != "+0000" && o != "-0000"),
            ));
        }
    }
}

impl FidelityRow {
    /// A row: the item, what is expected, what is there, and whether that will do.
    fn of(item: String, expected: String, actual: String, ok: bool) -> FidelityRow {
        FidelityRow {
            item,
            ok,
            expected,
            actual,
        }
    }
}

/// An optional value as a row shows it: `(none)` when absent.
fn or_none(v: &Option<String>) -> String {
    v.clone().unwrap_or_else(|| "(none)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expected() -> ExpectedDesktop {
        ExpectedDesktop {
            session: "gnome".into(),
            lang: "en_US.UTF-8".into(),
            theme: Some("Yaru".into()),
            icon_theme: Some("Yaru".into()),
            favorites: vec!["a.desktop".into(), "b.desktop".into()],
            settings: [("s k".to_string(), "true".to_string())].into(),
            handlers: [("application/pdf".to_string(), "e.desktop".to_string())].into(),
            first_run: vec!["vlc".into()],
            programs: vec!["bc".into()],
            no_dialogs: true,
            volume_below_max: true,
            time_zone_not_utc: true,
            window_classes: [("Mail".to_string(), "Mail.thunderbird".to_string())].into(),
        }
    }

    fn matching() -> DesktopState {
        DesktopState {
            session: "gnome".into(),
            lang: "en_US.UTF-8".into(),
            theme: Some("Yaru".into()),
            icon_theme: Some("Yaru".into()),
            favorites: vec!["a.desktop".into(), "b.desktop".into()],
            settings: [("s k".to_string(), "true".to_string())].into(),
            handlers: [("application/pdf".to_string(), Some("e.desktop".to_string()))].into(),
            first_run: [(
                "vlc".to_string(),
                FirstRun {
                    done: true,
                    detail: "ok".into(),
                },
            )]
            .into(),
            programs: [("bc".to_string(), true)].into(),
            volume_percent: Some(40),
            time_zone: Some("America/Los_Angeles".into()),
            utc_offset: Some("-0800".into()),
            windows: vec![DesktopWindow {
                title: "Untitled - Writer".into(),
                maximized: true,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_state_that_matches_passes_every_row() {
        let rows = matching().compare(&expected());
        assert!(rows.iter().all(|r| r.ok), "{rows:#?}");
        assert_eq!(rows.len(), 13, "{rows:#?}");
        // No window of the instance open: the row says so and passes.
        let row = rows.iter().find(|r| r.item == "window class Mail").unwrap();
        assert_eq!(row.actual, "(no such window open)");
        // Open with the class it must carry.
        let mut s = matching();
        s.windows.push(DesktopWindow {
            instance: "Mail".into(),
            class: "thunderbird".into(),
            ..Default::default()
        });
        assert!(s.compare(&expected()).iter().all(|r| r.ok));
    }

    #[test]
    fn each_difference_is_named_with_what_was_expected_and_found() {
        type Change = Box<dyn Fn(&mut DesktopState)>;
        let cases: Vec<(&str, Change)> = vec![
            ("session", Box::new(|s| s.session = "xfce".into())),
            (
                "icon theme",
                Box::new(|s| s.icon_theme = Some("Adwaita".into())),
            ),
            ("favorites", Box::new(|s| s.favorites.reverse())),
            (
                "setting s k",
                Box::new(|s| {
                    s.settings.clear();
                }),
            ),
            (
                "handler application/pdf",
                Box::new(|s| {
                    s.handlers.insert("application/pdf".into(), None);
                }),
            ),
            ("first run vlc", Box::new(|s| s.first_run.clear())),
            (
                "program bc",
                Box::new(|s| {
                    s.programs.insert("bc".into(), false);
                }),
            ),
            (
                "no dialog open",
                Box::new(|s| {
                    s.windows.push(DesktopWindow {
                        title: "Tip of the Day".into(),
                        dialog: true,
                        ..Default::default()
                    })
                }),
            ),
            (
                "volume below maximum",
                Box::new(|s| s.volume_percent = Some(100)),
            ),
            (
                "time zone not UTC+0",
                Box::new(|s| s.utc_offset = Some("+0000".into())),
            ),
            (
                "window class Mail",
                Box::new(|s| {
                    s.windows.push(DesktopWindow {
                        instance: "Mail".into(),
                        class: "thunderbird-default".into(),
                        ..Default::default()
                    })
                }),
            ),
        ];
        for (item, change) in cases {
            let mut s = matching();
            change(&mut s);
            let failed: Vec<FidelityRow> = s
                .compare(&expected())
                .into_iter()
                .filter(|r| !r.ok)
                .collect();
            assert_eq!(failed.len(), 1, "{item}: {failed:#?}");
            assert_eq!(failed[0].item, item);
            assert_ne!(failed[0].expected, failed[0].actual, "{item}");
        }
        let mut s = matching();
        s.windows.push(DesktopWindow {
            title: "Tip of the Day".into(),
            dialog: true,
            ..Default::default()
        });
        let row = s.compare(&expected()).into_iter().find(|r| !r.ok).unwrap();
        assert_eq!(row.actual, "Tip of the Day");
    }
}
