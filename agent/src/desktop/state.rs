//! `GET /v1/desktop/state`: the facts an agent's view of the desktop depends on — the session,
//! its theme, the dock, default applications, the windows and whether a dialog is among them,
//! each app's first-run state, the programs OSWorld calls, the volume and the time zone — read
//! from the live session as the sandbox user sees it, and compared with what the image promises
//! (`EXPECTED_FILE`, written by the image builder).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use berth_protocol::desktop::{DesktopState, DesktopWindow, ExpectedDesktop, FirstRun, ScreenSize};

use crate::display::Display;
use crate::exec::CommandTable;

use super::Desktop;

/// Where an image states its expected desktop (the builder writes it).
pub const EXPECTED_FILE: &str = "/usr/share/berth/desktop-expected.json";

/// How long reading the session's settings may take.
const READ_TIMEOUT: Duration = Duration::from_secs(15);

/// Settings OSWorld's tasks read or change (`schema key`).
pub const SETTINGS: &[&str] = &[
    "org.gnome.desktop.interface gtk-theme",
    "org.gnome.desktop.interface icon-theme",
    "org.gnome.desktop.interface text-scaling-factor",
    "org.gnome.desktop.interface toolkit-accessibility",
    "org.gnome.desktop.interface enable-animations",
    "org.gnome.desktop.screensaver lock-enabled",
    "org.gnome.desktop.session idle-delay",
    "org.gnome.settings-daemon.plugins.power idle-dim",
    "org.gnome.desktop.notifications show-banners",
    "org.gnome.desktop.a11y.applications screen-magnifier-enabled",
    "org.gnome.desktop.background picture-uri",
    "org.gnome.shell favorite-apps",
    "org.gnome.shell welcome-dialog-last-shown-version",
    "org.gnome.shell.extensions.dash-to-dock dock-position",
];

/// File types whose default application OSWorld's setups open files with, or its getters ask.
pub const MIME_TYPES: &[&str] = &[
    "application/pdf",
    "text/plain",
    "application/json",
    "inode/directory",
    "image/png",
    "image/jpeg",
    "text/html",
    "video/mp4",
    "video/x-matroska",
    "video/webm",
    "audio/mpeg",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    "application/vnd.oasis.opendocument.text",
    "application/vnd.oasis.opendocument.spreadsheet",
    "application/vnd.oasis.opendocument.presentation",
];

/// One shell script, run as the sandbox user, prints every fact that needs the user's session
/// (dconf, xdg-mime, PATH, PulseAudio): `kind\tkey\tvalue` lines.
fn script() -> String {
    let q = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let mut s = String::from("export LC_ALL=C\n");
    for key in SETTINGS {
        s.push_str(&format!(
            "v=$(gsettings get {key} 2>/dev/null) && printf 'setting\\t%s\\t%s\\n' {} \"$v\"\n",
            q(key)
        ));
    }
    for mime in MIME_TYPES {
        s.push_str(&format!(
            "printf 'handler\\t%s\\t%s\\n' {m} \"$(xdg-mime query default {m} 2>/dev/null)\"\n",
            m = q(mime)
        ));
    }
    for p in berth_protocol::desktop::OSWORLD_PROGRAMS {
        s.push_str(&format!(
            "command -v {p} >/dev/null 2>&1 && printf 'program\\t%s\\t1\\n' {p} || printf 'program\\t%s\\t0\\n' {p}\n",
            p = q(p)
        ));
    }
    s.push_str(
        "printf 'volume\\t\\t%s\\n' \"$(timeout 5 pactl get-sink-volume @DEFAULT_SINK@ 2>/dev/null | head -n 1)\"\n\
         printf 'zone\\t%s\\t%s\\n' \"$(readlink -f /etc/localtime)\" \"$(date +%z)\"\n",
    );
    s
}

/// A GVariant string as `gsettings get` prints it (`'Yaru'`), unquoted.
fn unquote(v: &str) -> String {
    let v = v.trim();
    match v.strip_prefix('\'').and_then(|x| x.strip_suffix('\'')) {
        Some(inner) => inner.replace("\\'", "'"),
        None => v.to_string(),
    }
}

/// A string array as `gsettings get` prints it (`['a.desktop', 'b.desktop']`, `@as []`).
fn string_list(v: &str) -> Vec<String> {
    let v = v.trim().trim_start_matches("@as").trim();
    let Some(inner) = v.strip_prefix('[').and_then(|x| x.strip_suffix(']')) else {
        return Vec::new();
    };
    inner
        .split(',')
        .map(unquote)
        .filter(|s| !s.is_empty())
        .collect()
}

/// The first percentage of `pactl get-sink-volume` (`Volume: front-left: 26214 /  40% / …`).
fn volume_percent(line: &str) -> Option<u32> {
    line.split('/')
        .map(str::trim)
        .find_map(|part| part.strip_suffix('%')?.trim().parse().ok())
}

/// The zone name of a resolved `/etc/localtime` (`/usr/share/zoneinfo/America/New_York`).
fn zone_name(target: &str) -> Option<String> {
    let (_, zone) = target.split_once("/zoneinfo/")?;
    let zone = zone.strip_prefix("posix/").unwrap_or(zone);
    (!zone.is_empty()).then(|| zone.to_string())
}

/// The facts the script printed.
#[derive(Debug, Default, PartialEq)]
struct SessionFacts {
    settings: BTreeMap<String, String>,
    handlers: BTreeMap<String, Option<String>>,
    programs: BTreeMap<String, bool>,
    volume_percent: Option<u32>,
    time_zone: Option<String>,
    utc_offset: Option<String>,
}

fn parse(out: &str) -> SessionFacts {
    let mut f = SessionFacts::default();
    for line in out.lines() {
        let mut parts = line.splitn(3, '\t');
        let (Some(kind), Some(key), Some(value)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        match kind {
            "setting" => {
                f.settings.insert(key.to_string(), value.trim().to_string());
            }
            "handler" => {
                let v = value.trim();
                f.handlers
                    .insert(key.to_string(), (!v.is_empty()).then(|| v.to_string()));
            }
            "program" => {
                f.programs.insert(key.to_string(), value.trim() == "1");
            }
            "volume" => f.volume_percent = volume_percent(value),
            "zone" => {
                f.time_zone = zone_name(key);
                let off = value.trim();
                f.utc_offset = (!off.is_empty()).then(|| off.to_string());
            }
            _ => {}
        }
    }
    f
}

/// Each app's first-run state, from the files it leaves in the home.
fn first_run(
    home: &Path,
    gnome: bool,
    settings: &BTreeMap<String, String>,
) -> BTreeMap<String, FirstRun> {
    let mut out = BTreeMap::new();
    out.insert("vlc".into(), vlc_first_run(home));
    out.insert("libreoffice".into(), libreoffice_first_run(home));
    out.insert("chrome".into(), chrome_first_run(home));
    if gnome {
        out.insert("gnome".into(), gnome_first_run(home, settings));
    }
    out
}

/// A file under the home as text; empty when it cannot be read.
fn read_home(home: &Path, p: &str) -> String {
    std::fs::read_to_string(home.join(p)).unwrap_or_default()
}

/// VLC is set up once its privacy question is answered (vlcrc); the detail also says
/// whether its HTTP interface is on.
fn vlc_first_run(home: &Path) -> FirstRun {
    let vlcrc = read_home(home, ".config/vlc/vlcrc");
    let line = |key: &str| {
        vlcrc
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(str::trim)
    };
    let answered = line("qt-privacy-ask") == Some("0");
    let http = line("extraintf").is_some_and(|v| v.split(':').any(|i| i == "http"))
        && line("http-password").is_some_and(|v| !v.is_empty());
    FirstRun {
        done: answered,
        detail: match (vlcrc.is_empty(), answered, http) {
            (true, _, _) => "no ~/.config/vlc/vlcrc".into(),
            (false, false, _) => "the privacy question is not answered".into(),
            (false, true, true) => "privacy question answered; HTTP interface on".into(),
            (false, true, false) => "privacy question answered; HTTP interface off".into(),
        },
    }
}

/// LibreOffice is set up once its tip of the day is turned off.
fn libreoffice_first_run(home: &Path) -> FirstRun {
    let xcu = read_home(home, ".config/libreoffice/4/user/registrymodifications.xcu");
    let no_tips = xcu
        .lines()
        .any(|l| l.contains("\"ShowTipOfTheDay\"") && l.contains("<value>false</value>"));
    FirstRun {
        done: no_tips,
        detail: if no_tips {
            "no tip of the day".into()
        } else {
            "shows the tip of the day".into()
        },
    }
}

/// Chrome is set up once its profile has the files a used profile has.
fn chrome_first_run(home: &Path) -> FirstRun {
    let chrome = ".config/google-chrome";
    let missing: Vec<&str> = [
        "Local State",
        "First Run",
        "Default/Preferences",
        "Default/Bookmarks",
    ]
    .into_iter()
    .filter(|f| !home.join(chrome).join(f).exists())
    .collect();
    FirstRun {
        done: missing.is_empty(),
        detail: if missing.is_empty() {
            "a used profile (Local State, Preferences, Bookmarks)".into()
        } else {
            format!("the profile has no {}", missing.join(", "))
        },
    }
}

/// GNOME is set up once its welcome tour was shown and its lock-screen notice was seen.
fn gnome_first_run(home: &Path, settings: &BTreeMap<String, String>) -> FirstRun {
    let tour = settings
        .get("org.gnome.shell welcome-dialog-last-shown-version")
        .map(|v| unquote(v))
        .unwrap_or_default();
    let warned = home
        .join(".local/share/gnome-shell/lock-warning-shown")
        .exists();
    FirstRun {
        done: !tour.is_empty() && warned,
        detail: format!(
            "welcome tour {}; lock-screen notice {}",
            if tour.is_empty() { "pending" } else { "done" },
            if warned { "shown" } else { "pending" }
        ),
    }
}

/// The expected state the image states, if any.
pub fn expected(path: &Path) -> Result<Option<ExpectedDesktop>, String> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Reads the desktop's state now.
pub async fn read(
    desktop: &Desktop,
    display: &Display,
    commands: &CommandTable,
    home: &Path,
    expected_file: &Path,
) -> Result<DesktopState, String> {
    let out = commands
        .output_of(
            vec!["/bin/sh".into(), "-c".into(), script()],
            READ_TIMEOUT,
            1 << 20,
        )
        .await
        .map_err(|e| format!("reading the session's settings: {e}"))?;
    let facts = parse(&String::from_utf8_lossy(&out));
    let (shown, active) = display.windows_shown().map_err(|e| e.to_string())?;
    let (width, height) = display.screen_size().map_err(|e| e.to_string())?;
    let windows = shown
        .into_iter()
        .map(|(w, st)| DesktopWindow {
            focused: active == Some(w.id),
            id: w.id,
            title: w.title,
            class: w.class,
            instance: w.instance,
            x: w.x,
            y: w.y,
            width: w.width,
            height: w.height,
            maximized: st.maximized,
            dialog: st.dialog,
        })
        .collect();
    let session = desktop.session();
    let setting = |k: &str| facts.settings.get(k).map(|v| unquote(v));
    let mut state = DesktopState {
        session: session.name().into(),
        screen: ScreenSize { width, height },
        lang: session.lang().into(),
        theme: setting("org.gnome.desktop.interface gtk-theme"),
        icon_theme: setting("org.gnome.desktop.interface icon-theme"),
        favorites: facts
            .settings
            .get("org.gnome.shell favorite-apps")
            .map(|v| string_list(v))
            .unwrap_or_default(),
        first_run: first_run(home, session == super::SessionKind::Gnome, &facts.settings),
        settings: facts.settings,
        handlers: facts.handlers,
        windows,
        programs: facts.programs,
        volume_percent: facts.volume_percent,
        time_zone: facts.time_zone,
        utc_offset: facts.utc_offset,
        expected: None,
        fidelity: Vec::new(),
    };
    state.expected = expected(expected_file)?;
    if let Some(e) = &state.expected {
        state.fidelity = state.compare(e);
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gsettings_values_and_lists_are_read_as_gsettings_prints_them() {
        assert_eq!(unquote("'Yaru'"), "Yaru");
        assert_eq!(unquote("uint32 300"), "uint32 300");
        assert_eq!(unquote("'it\\'s'"), "it's");
        assert_eq!(
            string_list("['google-chrome.desktop', 'thunderbird.desktop']"),
            ["google-chrome.desktop", "thunderbird.desktop"]
        );
        assert!(string_list("@as []").is_empty());
        assert!(string_list("nonsense").is_empty());
    }

    #[test]
    fn the_scripts_lines_become_facts() {
        let out = "setting\torg.gnome.desktop.interface gtk-theme\t'Yaru'\n\
                   handler\tapplication/pdf\torg.gnome.Evince.desktop\n\
                   handler\tvideo/webm\t\n\
                   program\tbc\t1\nprogram\tcode\t0\n\
                   volume\t\tVolume: front-left: 26214 /  40% / -23.88 dB,   front-right: 26214 /  40% / -23.88 dB\n\
                   zone\t/usr/share/zoneinfo/America/Los_Angeles\t-0800\n\
                   garbage line\n";
        let f = parse(out);
        assert_eq!(
            f.settings["org.gnome.desktop.interface gtk-theme"],
            "'Yaru'"
        );
        assert_eq!(
            f.handlers["application/pdf"].as_deref(),
            Some("org.gnome.Evince.desktop")
        );
        assert_eq!(f.handlers["video/webm"], None);
        assert!(f.programs["bc"] && !f.programs["code"]);
        assert_eq!(f.volume_percent, Some(40));
        assert_eq!(f.time_zone.as_deref(), Some("America/Los_Angeles"));
        assert_eq!(f.utc_offset.as_deref(), Some("-0800"));
        assert_eq!(
            zone_name("/usr/share/zoneinfo/Etc/UTC").as_deref(),
            Some("Etc/UTC")
        );
        assert_eq!(zone_name("/etc/localtime"), None);
        assert_eq!(volume_percent("no sink"), None);
    }

    #[test]
    fn first_run_state_is_read_from_the_files_apps_leave() {
        let home = tempfile::tempdir().unwrap();
        let h = home.path();
        let none = first_run(h, true, &BTreeMap::new());
        assert!(none.values().all(|f| !f.done), "{none:?}");
        std::fs::create_dir_all(h.join(".config/vlc")).unwrap();
        std::fs::write(
            h.join(".config/vlc/vlcrc"),
            "#qt-privacy-ask=1\nqt-privacy-ask=0\nextraintf=http\nhttp-password=password\n",
        )
        .unwrap();
        std::fs::create_dir_all(h.join(".config/libreoffice/4/user")).unwrap();
        std::fs::write(
            h.join(".config/libreoffice/4/user/registrymodifications.xcu"),
            "<item oor:path=\"/org.openoffice.Office.Common/Misc\"><prop oor:name=\"ShowTipOfTheDay\" oor:op=\"fuse\"><value>false</value></prop></item>\n",
        )
        .unwrap();
        for f in [
            "Local State",
            "First Run",
            "Default/Preferences",
            "Default/Bookmarks",
        ] {
            let p = h.join(".config/google-chrome").join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "{}").unwrap();
        }
        std::fs::create_dir_all(h.join(".local/share/gnome-shell")).unwrap();
        std::fs::write(h.join(".local/share/gnome-shell/lock-warning-shown"), "").unwrap();
        let settings: BTreeMap<String, String> = [(
            "org.gnome.shell welcome-dialog-last-shown-version".to_string(),
            "'4294967295'".to_string(),
        )]
        .into();
        let done = first_run(h, true, &settings);
        assert!(done.values().all(|f| f.done), "{done:?}");
        assert_eq!(
            done["vlc"].detail,
            "privacy question answered; HTTP interface on"
        );
        assert!(!first_run(h, false, &settings).contains_key("gnome"));
    }
}
