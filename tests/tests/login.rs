//! The guarded login tool, end to end: a Docker sandbox of the desktop image behind the
//! controller's egress proxy, leased with login sites enabled, signs its own Chrome in to the
//! test's sites (a container of the test's own: a form and a session cookie; a second site
//! with a TOTP step) through the MCP SDK on the sandbox's MCP URL and through REST. Then the
//! password and the TOTP seed are searched for in every answer, event, log, episode entry,
//! screenshot, recording, file and process environment: none, while the same searches find
//! them where they must be. Refusals (a host off the allow list, past the count, a run that
//! enables nothing), bad input (an unknown site, a page without a form, a password field that
//! does not mask, a site that never signals success) and the run's end (the next acquire of
//! the lease) clearing the sites' cookies.

use std::time::{Duration, Instant};

use berth_protocol::controller::{AcquireLease, ControllerClient};
use berth_protocol::egress::{Egress, EgressRules};
use berth_tests::controller::{API_KEY, ControllerProcess};
use berth_tests::egress::{LOGIN_HOSTS, LoginSite, docker, scan_environments};

/// Playwright for Python over the sandbox's CDP endpoint: `page URL` prints the text of the
/// open tab at URL (or of a new one sent there); `cookies` the browser's cookies as JSON
/// (domain, name); `value URL SELECTOR` an input's value length in the tab at URL.
const BROWSER: &str = r#"
import json, sys
from playwright.sync_api import sync_playwright
with sync_playwright() as p:
    browser = p.chromium.connect_over_cdp(sys.argv[1], timeout=30000)
    ctx = browser.contexts[0]
    if sys.argv[2] == "cookies":
        print(json.dumps([[c["domain"], c["name"]] for c in ctx.cookies()]))
    elif sys.argv[2] == "value":
        pages = [pg for pg in ctx.pages if pg.url.startswith(sys.argv[3])]
        print(json.dumps([len(pg.eval_on_selector(sys.argv[4], "e => e.value")) for pg in pages]))
    else:
        pages = [pg for pg in ctx.pages if pg.url == sys.argv[3]]
        page = pages[0] if pages else ctx.new_page()
        if not pages:
            page.goto(sys.argv[3], timeout=15000)
        print("URL", page.url)
        print("PAGE", page.inner_text("body"))
"#;

/// The Python client (`berth.Client`): the run's sites with their uses, and a login past the
/// count (the error's status and code).
const PYTHON_CLIENT: &str = r#"
import json, sys
from berth import BerthError, Client
c = Client(sys.argv[1], sys.argv[2])
sites = c.login_sites(sys.argv[3])
out = {"uses": {s["name"]: s["uses"] for s in sites["sites"]}}
try:
    c.login(sys.argv[3], "plain")
except BerthError as e:
    out["refused"] = [e.status, e.code]
print(json.dumps(out))
"#;

fn browser(cdp: &str, args: &[&str]) -> String {
    let mut all = vec![cdp];
    all.extend_from_slice(args);
    berth_tests::playwright(BROWSER, &all, 120)
}

fn config(image: &str, site: &LoginSite, proxy_port: u16) -> String {
    let ip = site.ip();
    let hosts: String = LOGIN_HOSTS
        .iter()
        .map(|h| format!("\"{h}\" = [\"{ip}\"]\n"))
        .collect();
    let pw = site.password_file.display();
    let seed = site.seed_file.display();
    format!(
        "docker_image = \"{image}\"\n[providers]\ndesktop = \"docker\"\n\
         [egress]\nproxy_port = {proxy_port}\n[egress.hosts]\n{hosts}\
         [[login]]\nname = \"plain\"\nurl = \"https://login.test/login\"\nusername = \"alice\"\n\
         secret_file = \"{pw}\"\nsuccess = {{ element = \"#who\" }}\nmax_uses = 2\ntimeout_secs = 90\n\
         description = \"the test's plain login\"\n\
         [[login]]\nname = \"totp\"\nurl = \"https://totp.test/login\"\nusername = \"bob\"\n\
         secret_file = \"{pw}\"\ntotp_secret_file = \"{seed}\"\n\
         success = {{ url = \"https://totp.test/me\", cookie = \"session\" }}\ntimeout_secs = 90\n\
         [[login]]\nname = \"broken\"\nurl = \"https://broken.test/login\"\nusername = \"eve\"\n\
         secret_file = \"{pw}\"\ntimeout_secs = 5\n\
         [[login]]\nname = \"never\"\nurl = \"https://never.test/login\"\nusername = \"carol\"\n\
         secret_file = \"{pw}\"\nsuccess = {{ element = \"#who\" }}\ntimeout_secs = 5\n\
         [[login]]\nname = \"unmasked\"\nurl = \"https://unmasked.test/login\"\n\
         username = \"dan\"\nsecret_file = \"{pw}\"\n\
         [[login]]\nname = \"offlist\"\nurl = \"https://offlist.test/login\"\n\
         username = \"frank\"\nsecret_file = \"{pw}\"\n"
    )
}

/// The official MCP SDK on the sandbox's MCP URL: its tools, then a `login` per site.
fn mcp_login(url: &str, sites: &[&str]) -> serde_json::Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/mcp_controller/client.py");
    let out = std::process::Command::new("timeout")
        .args(["300", "python3", script, "login", url, API_KEY])
        .args(sites)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&text).unwrap()
}

/// `POST …/{id}/login`: the status and the JSON body.
async fn rest_login(cl: &ControllerClient, id: &str, site: &str) -> (u16, serde_json::Value) {
    let r = cl
        .request(
            reqwest::Method::POST,
            &format!("/sandbox/sandboxes/v1/{id}/login"),
        )
        .json(&serde_json::json!({"site": site}))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

fn lease(logins: &[&str]) -> AcquireLease {
    AcquireLease {
        thread_id: "login-thread".into(),
        profile: "desktop".into(),
        ttl_seconds: Some(1800),
        egress: Some(Egress::Rules(EgressRules {
            allow: LOGIN_HOSTS[..5].iter().map(|h| h.to_string()).collect(),
            deny_private: false,
        })),
        logins: logins.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// `grep -rlaF` for the needles over a container's file system (without /proc, /sys, /dev):
/// the files holding any.
fn files_holding(container: &str, needles: &[&str]) -> Vec<String> {
    let pattern: String = needles.iter().map(|n| format!(" -e '{n}'")).collect();
    let out = docker(&[
        "exec",
        container,
        "sh",
        "-c",
        &format!(
            "grep -rlaF{pattern} / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev \
             2>/dev/null; echo searched"
        ),
    ]);
    out.lines()
        .filter(|l| *l != "searched")
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn the_login_tool_signs_the_browser_in_and_never_shows_a_secret() {
    let image = berth_tests::controller::build_desktop_image().unwrap()["image_ref"]
        .as_str()
        .unwrap()
        .to_string();
    let site = LoginSite::start(&image);
    let c = ControllerProcess::start(&config(&image, &site, berth_tests::free_port())).await;
    let data = c.data_dir();
    site.certify(&data.join("egress-ca.pem"), &data.join("egress-ca-key.pem"));
    let cl = c.client();
    let mut answers = String::new();

    // Unknown sites are refused before anything starts.
    let bad = cl.acquire(&lease(&["plain", "nope"])).await.unwrap_err();
    println!("unknown site at acquire: {bad}");
    assert!(bad.to_string().contains("\"nope\""), "{bad}");

    let all = ["plain", "totp", "broken", "never", "unmasked", "offlist"];
    let t = Instant::now();
    let leased = cl.acquire(&lease(&all)).await.unwrap();
    println!("leased {} in {:?}", leased.sandbox.id, t.elapsed());
    answers.push_str(&serde_json::to_string(&leased).unwrap());
    let id = leased.sandbox.id.clone();
    let cdp = leased
        .sandbox
        .endpoints
        .cdp
        .clone()
        .expect("a CDP endpoint");
    let mcp_url = format!("{}/sandbox/sandboxes/v1/{id}/mcp", c.base);
    // A recording of the whole run, searched at the end.
    let agent_path = |p: &str| format!("/sandbox/sandboxes/v1/{id}/v1{p}");
    let rec = cl
        .request(reqwest::Method::POST, &agent_path("/recordings"))
        .json(&serde_json::json!({"id": "login-run", "fps": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(rec.status(), 201, "{:?}", rec.text().await);

    // The run's sites, names only.
    let sites = cl.login_sites(&id).await.unwrap();
    answers.push_str(&serde_json::to_string(&sites).unwrap());
    let names: Vec<&str> = sites.sites.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, all);
    let run = sites.run.clone();

    // Through the MCP SDK: `login` is listed with the run's sites, and signs Chrome in.
    let t = Instant::now();
    let v = mcp_login(&mcp_url, &["plain", "nope"]);
    println!("mcp login in {:?}: {v}", t.elapsed());
    answers.push_str(&v.to_string());
    let tools: Vec<&str> = v["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert!(
        tools.contains(&"login") && tools.contains(&"computer"),
        "{tools:?}"
    );
    assert_eq!(
        v["login"]["input_schema"]["properties"]["site"]["enum"],
        serde_json::json!(all)
    );
    let plain = &v["calls"][0];
    if plain["is_error"] != false {
        // Where it stopped: the site's counts, the agent's log, the screen.
        println!("attempts: {}", site.attempts());
        let logs = std::process::Command::new("docker")
            .args(["logs", "--tail", "100", &format!("berth-{id}")])
            .output()
            .unwrap();
        let logs = [logs.stdout, logs.stderr].concat();
        println!("agent log:\n{}", String::from_utf8_lossy(&logs));
        if let Ok(png) = cl.screenshot(&id).await {
            let at = std::env::temp_dir().join("login-not-signed-in.png");
            std::fs::write(&at, &png).unwrap();
            println!("screen: {}", at.display());
        }
        println!("controller log:\n{}", c.log_text());
    }
    assert_eq!(plain["is_error"], false, "{v}");
    assert_eq!(plain["content"][0]["text"], "Signed in.");
    assert_eq!(plain["structured"]["uses"], 1);
    assert_eq!(plain["structured"]["run"], run.as_str());
    let nope = &v["calls"][1];
    assert_eq!(nope["is_error"], true);
    assert_eq!(nope["structured"]["error"]["code"], "not_found", "{nope}");
    // The desktop's Chrome shows the user.
    let page = browser(&cdp, &["page", "https://login.test/me"]);
    println!("browser: {page}");
    assert!(page.contains("PAGE Signed in as alice"), "{page}");
    let png = cl.screenshot(&id).await.unwrap();
    let shot = crate::osworld::repo_root().join("tests/screenshots/login-signed-in.png");
    std::fs::write(&shot, &png).unwrap();

    // Through REST: the TOTP site, its code typed after the password.
    let t = Instant::now();
    let (status, body) = rest_login(&cl, &id, "totp").await;
    println!("totp: {status} {body} in {:?}", t.elapsed());
    answers.push_str(&body.to_string());
    assert_eq!((status, body["outcome"].as_str()), (200, Some("signed_in")));
    let page = browser(&cdp, &["page", "https://totp.test/me"]);
    assert!(page.contains("PAGE Signed in as bob"), "{page}");

    // Bad sites: nothing typed where no form is or where the field does not mask; a bounded
    // wait for a site that never says yes.
    for (name, outcome, max_secs) in [
        ("broken", "form_not_found", 30),
        ("unmasked", "field_not_masked", 30),
        ("never", "no_success", 30),
    ] {
        let t = Instant::now();
        let (status, body) = rest_login(&cl, &id, name).await;
        println!("{name}: {status} {body} in {:?}", t.elapsed());
        answers.push_str(&body.to_string());
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["outcome"], outcome, "{body}");
        assert_eq!(body["signed_in"], false);
        assert!(
            t.elapsed() < Duration::from_secs(max_secs),
            "{name} took {:?}",
            t.elapsed()
        );
    }
    let attempts: serde_json::Value = serde_json::from_str(&site.attempts()).unwrap();
    println!("attempts: {attempts}");
    assert_eq!(attempts["login.test/login"], 1);
    assert_eq!(attempts["totp.test/login"], 1);
    assert_eq!(attempts["totp.test/otp"], 1);
    assert_eq!(attempts["never.test/login"], 1);
    assert!(attempts.get("unmasked.test/login").is_none(), "{attempts}");
    assert!(attempts.get("broken.test/login").is_none(), "{attempts}");
    let typed = browser(&cdp, &["value", "https://unmasked.test/", "#p"]);
    assert_eq!(typed.trim(), "[0]", "the unmasked field is empty");

    // Refused: a host off the allow list, past the count, a site not configured.
    let (status, body) = rest_login(&cl, &id, "offlist").await;
    println!("offlist: {status} {body}");
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("login_host_refused"))
    );
    let (status, body) = rest_login(&cl, &id, "plain").await;
    assert_eq!((status, body["uses"].as_u64()), (200, Some(2)), "{body}");
    let (status, body) = rest_login(&cl, &id, "plain").await;
    println!("past the count: {status} {body}");
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("login_limit"))
    );
    let (status, _) = rest_login(&cl, &id, "nope").await;
    assert_eq!(status, 404);
    // The Python client says the same.
    let py = std::process::Command::new("timeout")
        .args(["120", "python3", "-c", PYTHON_CLIENT, &c.base, API_KEY, &id])
        .output()
        .unwrap();
    let py_out = String::from_utf8_lossy(&py.stdout).into_owned();
    println!("python client: {py_out}");
    assert!(
        py.status.success(),
        "{}",
        String::from_utf8_lossy(&py.stderr)
    );
    let pv: serde_json::Value = serde_json::from_str(&py_out).unwrap();
    assert_eq!(pv["uses"]["plain"], 2, "{pv}");
    assert_eq!(
        pv["refused"],
        serde_json::json!([403, "login_limit"]),
        "{pv}"
    );
    answers.push_str(&py_out);

    // The events: names only, one per use, refusals not counted.
    let events = cl.events(&id, 0).await.unwrap();
    answers.push_str(&events.to_string());
    let used: Vec<(String, String)> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "login.used")
        .map(|e| {
            assert_eq!(e["run"], run.as_str(), "{e}");
            (
                e["site"].as_str().unwrap().to_string(),
                e["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    println!("login.used: {used:?}");
    assert_eq!(used.len(), 6, "{used:?}");
    assert!(used.contains(&("totp".into(), "signed_in".into())));

    // The secrets, searched for everywhere the run left something.
    let secrets = [site.password.as_str(), site.seed.as_str()];
    let needles: Vec<&[u8]> = secrets.iter().map(|s| s.as_bytes()).collect();
    let container = format!("berth-{id}");
    let episode = cl
        .request(
            reqwest::Method::GET,
            &format!("/sandbox/sandboxes/v1/{id}/episode"),
        )
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let stopped = cl
        .request(
            reqwest::Method::POST,
            &agent_path("/recordings/login-run/stop"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(stopped.status(), 200);
    let mp4 = cl
        .request(
            reqwest::Method::GET,
            &agent_path("/recordings/login-run/file"),
        )
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mp4_path = dir.path().join("run.mp4");
    std::fs::write(&mp4_path, &mp4).unwrap();
    let probe = berth_tests::video::probe(&mp4_path);
    println!(
        "recording: {} bytes, {:.1} s, {} frames",
        mp4.len(),
        probe.duration,
        probe.frames.len()
    );
    assert!(probe.frames.len() > 10, "a recording of the run");
    let zip = dir.path().join("episode.zip");
    std::fs::write(&zip, &episode).unwrap();
    let listing = std::process::Command::new("unzip")
        .arg("-l")
        .arg(&zip)
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout).into_owned();
    assert!(listing.contains("timeline.jsonl"), "{listing}");
    let unzipped = std::process::Command::new("unzip")
        .arg("-p")
        .arg(&zip)
        .output()
        .unwrap()
        .stdout;
    let logs = std::process::Command::new("docker")
        .args(["logs", &container])
        .output()
        .unwrap();
    let places: [(&str, Vec<u8>); 7] = [
        ("the recording", mp4.to_vec()),
        ("answers", answers.into_bytes()),
        ("the controller's log", c.log_text().into_bytes()),
        ("the sandbox's log", [logs.stdout, logs.stderr].concat()),
        ("the episode bundle (its entries)", unzipped),
        ("the screenshot", png),
        ("the episode zip", episode.to_vec()),
    ];
    for (what, bytes) in &places {
        for (i, n) in needles.iter().enumerate() {
            assert!(
                memchr::memmem::find(bytes, n).is_none(),
                "secret {i} in {what}"
            );
        }
        println!("searched {what}: {} bytes", bytes.len());
    }
    let t = Instant::now();
    let held = files_holding(&container, &secrets);
    println!("sandbox files: {held:?} in {:?}", t.elapsed());
    assert!(held.is_empty(), "a secret in the sandbox's files: {held:?}");
    let (hits, procs) = scan_environments(&container, &needles);
    println!("process environments: {procs} processes, hits {hits:?}");
    assert!(procs > 5 && hits.is_empty(), "{hits:?}");
    // The controls: the same searches find the secrets where they must be.
    let there = files_holding(&site.name, &secrets);
    println!("control, the site's files: {there:?}");
    assert!(there.iter().any(|f| f == "/certs/password"), "{there:?}");
    assert!(there.iter().any(|f| f == "/certs/totp-seed"), "{there:?}");
    let marker = format!("BERTH_CONTROL={}", site.password);
    docker(&["exec", "-d", "-e", &marker, &container, "sleep", "120"]);
    let (hits, _) = berth_tests::wait_for(
        "the control's environment",
        Duration::from_secs(20),
        || async {
            let (hits, _) = scan_environments(&container, &needles);
            (!hits.is_empty()).then_some((hits, ()))
        },
    )
    .await;
    println!("control, a process given the password: {hits:?}");

    // The run ends: the thread's next acquire reuses the sandbox for a run that enables
    // nothing; the sites' cookies are gone and the tool is not listed.
    let mine = |cookies: &str| {
        let v: Vec<(String, String)> = serde_json::from_str(cookies.trim()).unwrap();
        v.into_iter()
            .filter(|(d, _)| d.ends_with("login.test") || d.ends_with("totp.test"))
            .collect::<Vec<_>>()
    };
    let before = mine(&browser(&cdp, &["cookies"]));
    println!("cookies before the run ended: {before:?}");
    assert!(
        before
            .iter()
            .any(|(d, n)| d == "login.test" && n == "session")
    );
    let next = cl.acquire(&lease(&[])).await.unwrap();
    assert_eq!(
        (next.sandbox.id.as_str(), next.how.as_deref()),
        (id.as_str(), Some("reused"))
    );
    let after = mine(&browser(&cdp, &["cookies"]));
    println!("cookies after: {after:?}");
    assert!(after.is_empty(), "{after:?}");
    let page = browser(&cdp, &["page", "https://login.test/me?again"]);
    assert!(page.contains("Sign in to login.test"), "{page}");
    let events = cl.events(&id, 0).await.unwrap();
    let forgot: Vec<&serde_json::Value> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "login.forgotten")
        .collect();
    println!("login.forgotten: {forgot:?}");
    assert_eq!(forgot.len(), 1);
    assert_eq!(forgot[0]["run"], run.as_str());
    assert!(forgot[0]["cookies"].as_u64() >= Some(2), "{forgot:?}");
    let v = mcp_login(&mcp_url, &["plain"]);
    println!("the next run's MCP: {v}");
    let tools = v["tools"].as_array().unwrap();
    assert!(!tools.iter().any(|t| t == "login"), "{v}");
    assert_eq!(
        v["calls"][0]["structured"]["error"]["code"], "login_not_enabled",
        "{v}"
    );
    let (status, body) = rest_login(&cl, &id, "plain").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("login_not_enabled"))
    );
    let sites = cl.login_sites(&id).await.unwrap();
    assert!(sites.sites.is_empty() && sites.run != run, "{sites:?}");
    cl.release(&next.lease_id).await.unwrap();
}
