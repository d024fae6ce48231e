//! The benchmarks' desktop: a 1920x1080 Xvfb with XFCE's window manager, panel and desktop,
//! and two Tk windows, as a computer-use session looks.

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

impl Desktop {
    pub fn start() -> Desktop {
        let x = XServer::start(1920, 1080);
        let home = tempfile::tempdir().unwrap();
        let mut kids = Kill(Vec::new());
        kids.0.push(
            Command::new("dbus-run-session")
                .args([
                    "--",
                    "sh",
                    "-c",
                    "xfwm4 --compositor=off & xfce4-panel & xfdesktop & wait",
                ])
                .env("DISPLAY", &x.display)
                .env("HOME", home.path())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("xfwm4, xfce4-panel, xfdesktop"),
        );
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
                    .env("DISPLAY", &x.display)
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
        Desktop {
            _kids: kids,
            _dirs: vec![home, out],
            x,
        }
    }
}
