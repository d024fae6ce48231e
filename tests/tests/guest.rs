//! The desktop image as OSWorld's harness finds it: a Docker sandbox of the real image behind
//! the controller (the agent as root, the desktop as `user`), driven through its published
//! compat endpoint with the harness's own request shapes. Everything a task's setup, getters
//! and checks call in the guest answers as on OSWorld's Ubuntu image.

use std::time::Duration;

use berth_protocol::controller::{CreateSandbox, Sandbox};
use berth_tests::controller::{ControllerProcess, Provider, build_image};
use berth_tests::wait_for;
use berth_tests::x::{decode_png, pixel};
use serde_json::{Value, json};

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

async fn desktop(c: &ControllerProcess) -> (Sandbox, String, String) {
    desktop_of(c, None).await
}

async fn desktop_of(c: &ControllerProcess, image_ref: Option<String>) -> (Sandbox, String, String) {
    let sb = c
        .client()
        .create(&CreateSandbox {
            profile: "desktop".into(),
            image_ref,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(sb.status, "running");
    let compat = sb.endpoints.compat.clone().expect("a compat endpoint");
    let cdp = sb.endpoints.cdp.clone().expect("a CDP endpoint");
    (sb, compat, cdp)
}

/// `POST /execute` as PythonController sends it.
async fn execute(compat: &str, command: Value, shell: bool) -> Value {
    let r = http()
        .post(format!("{compat}/execute"))
        .json(&json!({"command": command, "shell": shell}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{command}");
    r.json().await.unwrap()
}

async fn sh(compat: &str, script: &str) -> (String, String, i64) {
    let v = execute(compat, json!(script), true).await;
    (
        v["output"].as_str().unwrap_or_default().to_string(),
        v["error"].as_str().unwrap_or_default().to_string(),
        v["returncode"].as_i64().unwrap_or(-1),
    )
}

/// The harness's prefix for every guest-side query (`execute_python_command`).
async fn python(compat: &str, code: &str) -> Value {
    let cmd = format!("import pyautogui; import time; pyautogui.FAILSAFE = False; {code}");
    execute(compat, json!(["python", "-c", cmd]), false).await
}

async fn launch(compat: &str, command: Value) {
    let r = http()
        .post(format!("{compat}/setup/launch"))
        .json(&json!({"command": command, "shell": false}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "launch {command}");
}

/// A native `/v1` GET answered inside the container (its agent's token is in its environment).
fn native_get(sandbox_id: &str, path: &str) -> Option<Value> {
    let out = std::process::Command::new("docker")
        .args(["exec", &format!("berth-{sandbox_id}"), "sh", "-c"])
        .arg(format!(
            "curl -s -m 5 -H \"Authorization: Bearer $BERTH_AGENT_TOKEN\" 'http://127.0.0.1:5000{path}'"
        ))
        .output()
        .ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

/// `GET /terminal`'s text (None while no terminal is focused).
async fn terminal(compat: &str) -> Option<String> {
    let v: Value = http()
        .get(format!("{compat}/terminal"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    v["output"].as_str().map(str::to_string)
}

async fn get_json(url: &str) -> Value {
    http().get(url).send().await.unwrap().json().await.unwrap()
}

async fn accessibility(compat: &str) -> String {
    let v = get_json(&format!("{compat}/accessibility")).await;
    v["AT"].as_str().unwrap_or_default().to_string()
}

#[tokio::test]
async fn the_image_answers_osworlds_guest_calls_as_its_ubuntu_guest_does() {
    let c = ControllerProcess::start_on(Provider::Docker, "").await;
    let (sb, compat, cdp) = desktop(&c).await;

    // python-xlib finds the cookie: nothing but the answer on stdout.
    let v = python(&compat, "import platform; print(platform.system())").await;
    assert_eq!(v["output"], "Linux\n", "{v}");
    let v = python(
        &compat,
        "pyautogui.moveTo(321, 234); print(pyautogui.position())",
    )
    .await;
    assert_eq!(v["output"], "Point(x=321, y=234)\n", "{v}");

    // X admits the cookie's holders only; the cookie is the user's alone.
    let (out, _, _) = sh(&compat, "id -un; stat -c '%U %a' ~/.Xauthority").await;
    assert_eq!(out, "user\nuser 600\n");
    let (_, err, code) = sh(&compat, "XAUTHORITY=/dev/null xdpyinfo >/dev/null").await;
    assert_ne!(code, 0, "a client without the cookie is refused");
    assert!(err.contains("Authorization required"), "{err}");

    // The browser is Google Chrome to window matching, the tree, pkill and the profile's
    // readers, and runs in its own sandbox.
    let (out, _, _) = sh(
        &compat,
        "xdotool search --name 'Google Chrome' getwindowname",
    )
    .await;
    assert!(out.contains(" - Google Chrome"), "{out}");
    let (out, _, _) = sh(
        &compat,
        "pgrep -x chrome | wc -l; pgrep -a chrome | grep -c -- --no-sandbox; \
         test -f ~/.config/google-chrome/Local\\ State && echo profile",
    )
    .await;
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].parse::<u32>().unwrap() >= 2,
        "chrome processes: {out}"
    );
    assert_eq!(lines[1], "0", "the browser keeps its sandbox: {out}");
    assert_eq!(lines[2], "profile");
    let xml = accessibility(&compat).await;
    assert!(
        xml.contains("<application name=\"Google Chrome\""),
        "{}",
        &xml[..xml.len().min(3000)]
    );
    let r = http()
        .post(format!("{compat}/setup/activate_window"))
        .json(&json!({"window_name": "Google Chrome", "strict": false, "by_class": false}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());

    // The page starts right under the toolbar: no warning bar between them.
    let colour = [10u8, 200, 120];
    let page = "data:text/html,<body style='background:rgb(10,200,120)'>";
    let opened = http()
        .put(format!("{cdp}/json/new?{page}"))
        .send()
        .await
        .unwrap();
    assert!(opened.status().is_success());
    let (top, img) = wait_for("the page on the screen", Duration::from_secs(20), || {
        let compat = compat.clone();
        async move {
            let png = http()
                .get(format!("{compat}/screenshot"))
                .send()
                .await
                .ok()?
                .bytes()
                .await
                .ok()?;
            let img = decode_png(&png);
            let x = img.0 / 2;
            let top = (0..img.1 / 2).find(|y| pixel(&img, x, *y) == colour)?;
            Some((top, img))
        }
    })
    .await;
    // At 1080p the tab strip and toolbar end ~113 px down; the bar would add ~45 px.
    assert!(
        top < 130,
        "the page starts {top} px down: a bar is above it"
    );
    for y in top..top + 200 {
        assert_eq!(pixel(&img, img.0 / 2, y), colour, "row {y}");
    }

    // What tasks run: gsettings on GNOME's schemas (kept), PulseAudio's volume,
    // timedatectl's line 4, xdg-mime, jq, socat; sudo asks for a password here (only the
    // osworld bundle gives one).
    let (out, err, _) = sh(
        &compat,
        "gsettings set org.gnome.desktop.interface text-scaling-factor 1.25 && \
         gsettings get org.gnome.desktop.interface text-scaling-factor; \
         gsettings get org.gnome.desktop.screensaver lock-enabled; \
         gsettings get org.gnome.shell favorite-apps >/dev/null && echo shell-schema; \
         pulseaudio --start; pactl list sinks | grep '^[[:space:]]Volume:' | head -n 1 \
           | awk '{print $5}' | sed 's/%//g'; \
         timedatectl status | sed -n 4p; \
         echo '{\"a\": 5}' | jq .a; for p in socat xdg-mime gio wmctrl; do command -v $p; done | wc -l; \
         sudo -n true 2>/dev/null || echo no-sudo",
    )
    .await;
    assert_eq!(
        out,
        "1.25\ntrue\nshell-schema\n100\n                Time zone: Etc/UTC (UTC, +0000)\n5\n4\nno-sudo\n",
        "{err}"
    );
    // The session bus is where a systemd session keeps it (tasks name it outright).
    let (out, _, _) = sh(
        &compat,
        "DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/1000/bus gsettings get \
         org.gnome.desktop.interface text-scaling-factor",
    )
    .await;
    assert_eq!(out, "1.25\n");

    // A terminal's text through /terminal (the tree is read as root, the terminal is the user's).
    // OSWorld's OS tasks open it with Ctrl+Alt+T and find it by "Terminal" in its title.
    python(&compat, "pyautogui.hotkey('ctrl', 'alt', 't')").await;
    wait_for("a terminal window", Duration::from_secs(30), || {
        let compat = compat.clone();
        async move {
            let (out, _, _) = sh(&compat, "xdotool search --name Terminal getwindowname").await;
            out.contains("Terminal").then_some(())
        }
    })
    .await;
    wait_for("the terminal focused", Duration::from_secs(30), || {
        let compat = compat.clone();
        async move { terminal(&compat).await.map(|_| ()) }
    })
    .await;
    python(&compat, "pyautogui.typewrite('echo berth-$((6*7))\\n')").await;
    wait_for(
        "the command's output in /terminal",
        Duration::from_secs(30),
        || {
            let compat = compat.clone();
            async move { terminal(&compat).await?.contains("berth-42").then_some(()) }
        },
    )
    .await;

    // OSWorld's Chrome setup: pkill chrome (flushing the profile), google-chrome with its own
    // debugging port, socat onto 9222. The desktop adopts that browser, readiness comes back,
    // and the published CDP endpoint reaches it. The launch waits until the old browser has
    // quit: one started while it is still shutting down hands its request to it and exits
    // (the desktop then starts its own browser after the grace, still behind :9222).
    let before = native_get(&sb.id, "/v1/ready").unwrap()["components"]["chromium"]["pid"].clone();
    launch(&compat, json!(["pkill", "chrome"])).await;
    wait_for("the browser to quit", Duration::from_secs(20), || {
        let id = sb.id.clone();
        let before = before.clone();
        async move {
            let c = native_get(&id, "/v1/ready")?["components"]["chromium"].clone();
            (c["pid"] != before || c["ok"] != true).then_some(())
        }
    })
    .await;
    launch(
        &compat,
        json!(["google-chrome", "--remote-debugging-port=1337"]),
    )
    .await;
    launch(
        &compat,
        json!(["socat", "tcp-listen:9222,fork", "tcp:localhost:1337"]),
    )
    .await;
    let adopted = wait_for("the browser adopted", Duration::from_secs(40), || {
        let id = sb.id.clone();
        async move {
            let page = native_get(&id, "/v1/events?from_seq=0&limit=10000")?;
            page["events"]
                .as_array()?
                .iter()
                .find(|e| e["kind"] == "browser.adopted")
                .and_then(|e| e["pid"].as_u64())
        }
    })
    .await;
    wait_for("the adopted browser ready", Duration::from_secs(40), || {
        let id = sb.id.clone();
        async move {
            let r = native_get(&id, "/v1/ready")?;
            let chromium = &r["components"]["chromium"];
            (r["ready"] == true && chromium["ok"] == true && chromium["pid"] == adopted)
                .then_some(())
        }
    })
    .await;
    let (out, _, _) = sh(
        &compat,
        "pgrep -a chrome | grep -v -- --type= | grep -c -- '--remote-debugging-port=1337'; \
         ss -ltn | grep -c '127.0.0.1:1337'",
    )
    .await;
    assert_eq!(out, "1\n1\n", "the user's browser, on its own port");
    let v = get_json(&format!("{cdp}/json/version")).await;
    assert!(v["webSocketDebuggerUrl"].is_string(), "{v}");
    let events = native_get(&sb.id, "/v1/events?from_seq=0&limit=10000").unwrap();
    let events = events["events"].as_array().unwrap();
    assert!(
        events.iter().any(|e| e["kind"] == "browser.adopted"),
        "{events:#?}"
    );
    assert!(
        !events
            .iter()
            .any(|e| e["kind"] == "component.gave_up" && e["component"] == "chromium"),
        "the supervisor did not fight the user's browser"
    );
    c.client().delete(&sb.id).await.unwrap();
}

#[tokio::test]
async fn the_osworld_bundle_has_osworlds_apps_account_and_sudo_and_its_agent_outlives_the_user() {
    // `tests/test.sh` builds it; here the build finds it.
    let built = build_image(&["--profile", "desktop", "--bundle", "osworld"]).unwrap();
    let image = built["image_ref"].as_str().unwrap().to_string();
    assert!(image.starts_with("berth-desktop-osworld:"), "{built}");
    let c = ControllerProcess::start_on(Provider::Docker, "").await;
    let (sb, compat, _) = desktop_of(&c, Some(image.clone())).await;
    assert_eq!(sb.image_ref, image);
    // VLC's HTTP interface is a declared port, published like compat and CDP.
    let vlc = sb.endpoints.ports.get("vlc").expect("a vlc endpoint");
    assert!(vlc.starts_with("http://127.0.0.1:"), "{vlc}");

    // OSWorld's guest account: its password, and sudo with -S and without.
    let (out, err, _) = sh(
        &compat,
        "echo password | sudo -S -k whoami 2>/dev/null; sudo -n whoami; \
         for p in libreoffice vlc gimp thunderbird; do command -v $p; done | wc -l",
    )
    .await;
    assert_eq!(out, "root\nroot\n4\n", "{err}");
    // The password is OSWorld's (sudo asks none: its setups also run plain `sudo`).
    let (out, err, _) = sh(
        &compat,
        "sudo python3 -W ignore -c \"import crypt, spwd; h = spwd.getspnam('user').sp_pwd; \
         print(crypt.crypt('password', h) == h, crypt.crypt('wrong', h) == h)\"",
    )
    .await;
    assert_eq!(out, "True False\n", "{err}");

    // The user can now kill the agent; `berth-agent init` brings it back.
    let container = format!("berth-{}", sb.id);
    let agent_pid = || {
        let out = std::process::Command::new("docker")
            .args(["exec", &container, "pgrep", "-f", "berth-agent [-]-listen"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let before = agent_pid();
    assert!(!before.is_empty());
    let killed = std::process::Command::new("docker")
        .args(["exec", "-u", "user", &container, "sh", "-c"])
        .arg("echo password | sudo -S pkill -KILL -f 'berth-agent [-]-listen'")
        .status()
        .unwrap();
    assert!(killed.success());
    wait_for(
        "the agent back after the user killed it",
        Duration::from_secs(60),
        || {
            let compat = compat.clone();
            async move {
                let r = http().get(format!("{compat}/platform")).send().await.ok()?;
                let text = r.text().await.ok()?;
                (text == "Linux").then_some(())
            }
        },
    )
    .await;
    wait_for("the desktop ready again", Duration::from_secs(60), || {
        let id = sb.id.clone();
        async move { (native_get(&id, "/v1/ready")?["ready"] == true).then_some(()) }
    })
    .await;
    let after = agent_pid();
    assert!(!after.is_empty() && after != before, "{before} -> {after}");
    c.client().delete(&sb.id).await.unwrap();
}
