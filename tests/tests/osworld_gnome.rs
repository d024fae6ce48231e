//! OSWorld's own harness on the osworld image's GNOME desktop, through the controller on the
//! Docker provider with a warm pool of that image (each episode reset is a warm claim):
//! `clients/python/tests/gnome`, where `desktop_env.DesktopEnv` (PyPI, unchanged) solves ten
//! settings tasks through the GUI (each scores 0 left alone and 1.0 solved), opens every app
//! OSWorld uses the way its setups do (no dialog in front, maximised; a screenshot of each into
//! `tests/screenshots/`), and reads VLC's status and Chrome's profile with OSWorld's getters.
//! Every reset holds the fresh sandbox to the image's expected desktop (`check_desktop`).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use berth_tests::controller::{API_KEY, ControllerProcess, Provider, build_image};

use crate::osworld::{repo_root, summary};

#[tokio::test]
async fn osworlds_desktop_env_solves_settings_tasks_through_gnomes_gui_and_opens_every_app() {
    // `tests/test.sh` builds it; here the build finds it.
    let built = build_image(&["--profile", "desktop", "--bundle", "osworld"]).unwrap();
    let image = built["image_ref"].as_str().unwrap().to_string();
    let config = format!("[[pools]]\nprofile = \"desktop\"\nimage_ref = \"{image}\"\nsize = 2\n");
    let c = ControllerProcess::start_on(Provider::Docker, &config).await;
    let mut child = Command::new("timeout")
        .args(["--kill-after=10", "1500", "python3", "-m", "pytest"])
        .args([
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "clients/python/tests/gnome",
        ])
        .current_dir(repo_root())
        .env("BERTH_URL", &c.base)
        .env("BERTH_API_KEY", API_KEY)
        .env("BERTH_OSWORLD_IMAGE", &image)
        .env("BERTH_SCREENSHOTS", repo_root().join("tests/screenshots"))
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 with pytest (tests/setup.sh installs it)");
    let stderr = child.stderr.take().unwrap();
    let err_thread = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("pytest: {line}");
        }
    });
    let mut lines = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
    {
        println!("pytest: {line}");
        lines.push(line);
    }
    let status = child.wait().unwrap();
    let _ = err_thread.join();
    let summary = summary(&lines);
    assert!(
        status.success(),
        "pytest failed ({status}): {summary}\ncontroller log:\n{}",
        c.log_text()
    );
    // Ten GUI tasks and the apps test: none may skip here (the image and OSWorld's code exist).
    assert!(
        summary.contains("11 passed"),
        "{summary}\n{}",
        lines.join("\n")
    );
    assert!(!summary.contains("skipped"), "{summary}");
}
