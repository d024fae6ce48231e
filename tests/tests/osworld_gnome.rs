//! OSWorld's own harness on the osworld image's GNOME desktop, through the controller on the
//! Docker provider with a warm pool of that image (each episode reset is a warm claim):
//! `clients/python/tests/gnome`, where `desktop_env.DesktopEnv` (PyPI, unchanged) solves ten
//! settings tasks through the GUI (each scores 0 left alone and 1.0 solved), opens every app
//! OSWorld uses the way its setups do (no dialog in front, maximised; a screenshot of each into
//! `tests/screenshots/`), and reads VLC's status and Chrome's profile with OSWorld's getters.
//! Every reset holds the fresh sandbox to the image's expected desktop (`check_desktop`).

use berth_tests::controller::{API_KEY, ControllerProcess, Provider, build_image};

use crate::osworld::{pytest, repo_root, summary};

#[tokio::test]
async fn osworlds_desktop_env_solves_settings_tasks_through_gnomes_gui_and_opens_every_app() {
    // `tests/test.sh` builds it; here the build finds it.
    let built = build_image(&["--profile", "desktop", "--bundle", "osworld"]).unwrap();
    let image = built["image_ref"].as_str().unwrap().to_string();
    let config = format!("[[pools]]\nprofile = \"desktop\"\nimage_ref = \"{image}\"\nsize = 2\n");
    let c = ControllerProcess::start_on(Provider::Docker, &config).await;
    let shots = repo_root().join("tests/screenshots");
    let (status, lines) = pytest(
        &["clients/python/tests/gnome"],
        &[
            ("BERTH_URL", c.base.as_ref()),
            ("BERTH_API_KEY", API_KEY.as_ref()),
            ("BERTH_OSWORLD_IMAGE", image.as_ref()),
            ("BERTH_SCREENSHOTS", shots.as_os_str()),
        ],
    );
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
