//! The benchmarks' desktop: a 1920x1080 Xvfb with XFCE's settings daemon (the image's X
//! settings), window manager, panel and desktop, and two Tk windows, as a computer-use session
//! looks; optionally Chromium on a page served from the machine.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use berth_tests::x::XServer;

struct Kill(Vec<Child>);

impl Drop for Kill {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub struct Desktop {
    _kids: Kill,
    _dirs: Vec<tempfile::TempDir>,
    // Last: the X server goes after its clients.
    pub x: XServer,
}

/// The browser's two pages: each a full-page button (no link: no status bubble on hover) that
/// goes to the other.
const PAGES: [(&str, &str, &str, &str); 2] = [
    ("a.html", "Page A", "#204080", "b.html"),
    ("b.html", "Page B", "#40a020", "a.html"),
];

impl Desktop {
    pub fn start() -> Desktop {
        Desktop::start_with(false)
    }

    /// The desktop with Chromium at +1000+220 (880x560) showing page A, whose content goes to
    /// page B when clicked (and B back to A).
    pub fn with_browser() -> Desktop {
        Desktop::start_with(true)
    }

    fn start_with(browser: bool) -> Desktop {
        let x = XServer::start(1920, 1080);
        let home = tempfile::tempdir().unwrap();
        // python3-xlib wants the file to exist.
        std::fs::write(home.path().join(".Xauthority"), b"").unwrap();
        let xdg = write_xsettings(home.path());
        let mut kids = Kill(Vec::new());
        kids.0.push(spawn_session(&x.display, &xdg, home.path()));
        let out = start_probe_windows(&x.display, &mut kids);
        let mut dirs = vec![home, out];
        if browser {
            let (site, profile) = start_browser(&x.display, dirs[0].path(), &mut kids);
            dirs.push(site);
            dirs.push(profile);
        }
        Desktop {
            _kids: kids,
            _dirs: dirs,
            x,
        }
    }
}

/// The image's X settings (GTK's animations off), served by xfsettingsd as in the image:
/// written under `home`, whose `xdg` config directory is returned.
fn write_xsettings(home: &Path) -> PathBuf {
    let xdg = home.join("xdg");
    let channel = xdg.join("xfce4/xfconf/xfce-perchannel-xml");
    std::fs::create_dir_all(&channel).unwrap();
    std::fs::write(
        channel.join("xsettings.xml"),
        include_str!("../../../../images/xfce/xsettings.xml"),
    )
    .unwrap();
    xdg
}

/// XFCE's session on `display`: the settings daemon, then xfwm4, the panel and the desktop.
fn spawn_session(display: &str, xdg: &Path, home: &Path) -> Child {
    Command::new("dbus-run-session")
        .args([
            "--",
            "sh",
            "-c",
            // As the image's session: the settings daemon owns its selection before
            // the others start (a panel started first keeps GTK's animations on).
            concat!(
                "xfsettingsd --no-daemon & /usr/bin/python3 -c '",
                "import time, Xlib.display\n",
                "d = Xlib.display.Display()\n",
                "a = d.intern_atom(\"_XSETTINGS_S0\")\n",
                "while d.get_selection_owner(a) in (0, None): time.sleep(0.05)\n",
                "'; xfwm4 --compositor=off & xfce4-panel & xfdesktop & wait"
            ),
        ])
        .env("DISPLAY", display)
        .env("XDG_CONFIG_DIRS", format!("{}:/etc/xdg", xdg.display()))
        .env("HOME", home)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("xfwm4, xfce4-panel, xfdesktop")
}

/// The two Tk probe windows (the first one an opener), each waited for until it is up; the
/// returned directory holds their output.
fn start_probe_windows(display: &str, kids: &mut Kill) -> tempfile::TempDir {
    let probe = concat!(env!("CARGO_MANIFEST_DIR"), "/apps/probe.py");
    let out = tempfile::tempdir().unwrap();
    for (i, geometry) in ["900x600+60+80", "700x500+1000+200"].iter().enumerate() {
        let dir = out.path().join(format!("w{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut args = vec![
            "--out".to_string(),
            dir.display().to_string(),
            "--geometry".into(),
            geometry.to_string(),
        ];
        if i == 0 {
            args.push("--opener".into());
        }
        kids.0.push(
            Command::new("/usr/bin/python3")
                .arg(probe)
                .args(&args)
                .env("DISPLAY", display)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("python3-tk"),
        );
        berth_tests::wait_until("a probe window", Duration::from_secs(20), || {
            dir.join("ready").exists()
        });
    }
    out
}

/// The [`PAGES`] served over HTTP from the machine and Chromium showing page A, waited for
/// until its window is up. Returns the site's directory and the browser's profile.
fn start_browser(
    display: &str,
    home: &Path,
    kids: &mut Kill,
) -> (tempfile::TempDir, tempfile::TempDir) {
    let site = tempfile::tempdir().unwrap();
    for (file, title, colour, next) in PAGES {
        std::fs::write(
            site.path().join(file),
            format!(
                "<!doctype html><title>{title}</title>\
                 <body style=\"margin:0;background:{colour};height:100vh\" \
                 onclick=\"location.href='{next}'\">\
                 <h1 style=\"color:white;font:40px sans-serif;margin:40px\">{title}</h1>"
            ),
        )
        .unwrap();
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    kids.0.push(
        Command::new("/usr/bin/python3")
            .args([
                "-m",
                "http.server",
                "--bind",
                "127.0.0.1",
                &port.to_string(),
            ])
            .current_dir(site.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3's http.server"),
    );
    let profile = tempfile::tempdir().unwrap();
    kids.0
        .push(spawn_chromium(display, home, profile.path(), port));
    berth_tests::wait_until("Chromium on page A", Duration::from_secs(60), || {
        Command::new("xdotool")
            .args(["search", "--name", "^Page A"])
            .env("DISPLAY", display)
            .output()
            .is_ok_and(|o| o.status.success())
    });
    (site, profile)
}

/// Chromium at +1000+220 (880x560) on page A of the site served on `port`.
fn spawn_chromium(display: &str, home: &Path, profile: &Path, port: u16) -> Child {
    Command::new("chromium")
        .args([
            "--no-sandbox",
            "--no-first-run",
            "--no-default-browser-check",
            "--password-store=basic",
            "--disable-features=Translate",
            "--window-position=1000,220",
            "--window-size=880,560",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("http://127.0.0.1:{port}/a.html"))
        .env("DISPLAY", display)
        .env("HOME", home)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium")
}
