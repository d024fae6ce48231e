//! Egress by host name, through the controller's proxy, from inside Docker sandboxes of the
//! desktop image. The test hosts are containers this test starts on a network of its own
//! (an HTTP and an HTTPS server each, under names only the proxy resolves: `[egress.hosts]`),
//! so no traffic leaves the machine.
//!
//! A sandbox with an allow-list reaches the allowed host by HTTP and HTTPS (a CONNECT tunnel)
//! without being told where the proxy is; a name not allowed, an address asked for directly,
//! a name that resolves to a private address and a TLS server name other than the host
//! tunnelled to are each refused at once with an `egress.denied` event naming the host; a
//! connection that goes around the proxy has no route. Its DNS answers the names it may reach
//! and no other (NXDOMAIN at once, an `egress.denied` event `"via": "dns"`). The record counts
//! the connections by host. A sandbox with `"none"` reaches nothing, one with `"open"` reaches the test host
//! directly.

use std::time::Duration;

use berth_protocol::controller::{ControllerClient, CreateSandbox, Sandbox};
use berth_protocol::egress::{Egress, EgressMode, EgressRules};
use berth_tests::controller::{ControllerProcess, shell};
use berth_tests::egress::TestHosts;
use berth_tests::wait_for;

/// A CONNECT to the allowed host, then a TLS ClientHello naming another.
const SNI_MISMATCH: &str = r#"
import os, socket, ssl
host, port = os.environ["http_proxy"].split("//")[1].rsplit(":", 1)
s = socket.create_connection((host, int(port)), 5)
s.sendall(b"CONNECT allowed.test:8443 HTTP/1.1\r\nHost: allowed.test:8443\r\n\r\n")
print(s.recv(200).split(b"\r\n")[0].decode())
c = ssl.create_default_context()
c.check_hostname = False
c.verify_mode = ssl.CERT_NONE
try:
    c.wrap_socket(s, server_hostname="refused.test")
    print("handshake completed")
except Exception as e:
    print("closed:", type(e).__name__)
"#;

fn image() -> String {
    let built = berth_tests::controller::build_desktop_image().unwrap();
    built["image_ref"].as_str().unwrap().to_string()
}

fn ide(egress: Egress) -> CreateSandbox {
    CreateSandbox {
        egress: Some(egress),
        ..berth_tests::controller::ide()
    }
}

/// Playwright for Python over the sandbox's CDP endpoint: each URL's page text in the
/// desktop's own browser, or the navigation's error.
fn browser_pages(cdp: &str, urls: &[&str]) -> String {
    let script = r#"
import sys
from playwright.sync_api import sync_playwright
with sync_playwright() as p:
    browser = p.chromium.connect_over_cdp(sys.argv[1], timeout=30000)
    page = browser.contexts[0].new_page()
    for url in sys.argv[2:]:
        try:
            page.goto(url, timeout=15000)
            print(url, "PAGE", page.inner_text("body").replace("\n", " "))
        except Exception as e:
            print(url, "ERROR", str(e).splitlines()[0])
    page.close()
"#;
    let args: Vec<&str> = std::iter::once(cdp).chain(urls.iter().copied()).collect();
    berth_tests::playwright(script, &args, 120)
}

/// A shell line's exit code and output (stdout, then stderr).
async fn sh(cl: &ControllerClient, id: &str, line: &str) -> (Option<i32>, String) {
    let run = cl.exec(id, &shell(line)).await.unwrap();
    (run.exit_code, format!("{}{}", run.stdout, run.stderr))
}

/// How the sandbox's resolver answers each name: `name addr [addresses]`, or `name error
/// <errno>` (-2, EAI_NONAME: the name does not exist; -3, EAI_AGAIN: no answer).
const LOOKUP: &str = r#"
import socket, sys
for n in sys.argv[1:]:
    try:
        a = sorted({i[4][0] for i in socket.getaddrinfo(n, 80, proto=socket.IPPROTO_TCP)})
        print(n, "addr", a)
    except socket.gaierror as e:
        print(n, "error", e.errno)
"#;

/// The resolver's answer for each of `names` inside sandbox `id` (a line each, as [`LOOKUP`]).
async fn lookups(cl: &ControllerClient, id: &str, names: &[&str]) -> String {
    let line = format!("python3 -c '{LOOKUP}' {}", names.join(" "));
    sh(cl, id, &line).await.1
}

/// The `egress.denied` events on a sandbox's timeline: `(host, reason)` (and `"via": "dns"`
/// for a name refused by its DNS, appended to the reason).
async fn denials(cl: &ControllerClient, id: &str) -> Vec<(String, String)> {
    let v = cl.events(id, 0).await.unwrap();
    v["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter(|e| e["kind"] == "egress.denied")
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            match s("via").as_str() {
                "dns" => (s("host"), format!("{} via dns", s("reason"))),
                _ => (s("host"), s("reason")),
            }
        })
        .collect()
}

#[tokio::test]
async fn docker_sandboxes_reach_only_what_their_egress_policy_allows_by_name() {
    let image = image();
    let hosts = TestHosts::start(&image);
    let (allowed, refused) = (hosts.ip(0), hosts.ip(1));
    let c = ControllerProcess::start(&format!(
        "docker_image = \"{image}\"\n[providers]\ndesktop = \"docker\"\nide = \"docker\"\n[egress]\nproxy_port = 0\n\
         [egress.hosts]\n\"allowed.test\" = [\"{allowed}\"]\n\"refused.test\" = [\"{refused}\"]\n\
         \"private.test\" = [\"127.0.0.1\"]\n"
    ))
    .await;
    let cl = c.client();
    let policy = Egress::Rules(EgressRules {
        allow: vec![
            "allowed.test".into(),
            "private.test".into(),
            format!("{allowed}/32"),
        ],
        deny_private: true,
    });
    // A desktop: its browser is held to the policy too.
    let desktop = CreateSandbox {
        egress: Some(policy.clone()),
        ..berth_tests::controller::desktop()
    };
    let sb: Sandbox = cl.create(&desktop).await.unwrap();
    assert_eq!(sb.egress.as_ref().map(|e| &e.policy), Some(&policy));
    let id = sb.id.as_str();

    // Allowed, by HTTP and through a CONNECT tunnel, with no proxy named by the test.
    let (code, out) = sh(&cl, id, "curl -sS -m 10 http://allowed.test:8000/a").await;
    println!("http allowed: {code:?} {out}");
    assert_eq!(
        (code, out.as_str()),
        (Some(0), "egress-ok allowed.test:8000")
    );
    let (code, out) = sh(&cl, id, "curl -sSk -m 10 https://allowed.test:8443/b").await;
    println!("https allowed: {code:?} {out}");
    assert_eq!(
        (code, out.as_str()),
        (Some(0), "egress-ok allowed.test:8443")
    );

    // Refused at once, each with its reason.
    for (url, reason) in [
        ("http://refused.test:8000/", "not_allowed"),
        ("https://refused.test:8443/", "not_allowed"),
        (&format!("http://{refused}:8000/") as &str, "ip_literal"),
        ("http://private.test:8000/", "private_address"),
    ] {
        let line = format!("curl -sS -m 10 -o /dev/null -D - {url}; echo rc=$?");
        let t = std::time::Instant::now();
        let (_, out) = sh(&cl, id, &line).await;
        println!("{url}: {:?} {out}", t.elapsed());
        assert!(!out.contains("egress-ok"), "{url}: {out}");
        assert!(out.contains(reason), "{url}: {out}");
    }
    let (_, out) = sh(&cl, id, &format!("python3 -c '{SNI_MISMATCH}'")).await;
    println!("sni mismatch: {out}");
    assert!(out.contains("200 Connection established"), "{out}");
    assert!(out.contains("closed:"), "{out}");
    // The desktop's browser, as a user's agent drives it over CDP.
    let cdp = sb.endpoints.cdp.clone().expect("a desktop's CDP endpoint");
    let pages = browser_pages(
        &cdp,
        &[
            "http://allowed.test:8000/page",
            "http://refused.test:8000/page",
        ],
    );
    println!("browser:\n{pages}");
    let line = |u: &str| {
        pages
            .lines()
            .find(|l| l.starts_with(u))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        line("http://allowed.test").contains("PAGE egress-ok allowed.test:8000"),
        "{pages}"
    );
    let refused_page = line("http://refused.test");
    assert!(
        !refused_page.contains("egress-ok") && refused_page.contains("not_allowed"),
        "{pages}"
    );
    // Its DNS answers the names it may reach and no other, at once: a name not allowed and
    // one allowed but private do not exist for it.
    let out = lookups(&cl, id, &["allowed.test", "refused.test", "private.test"]).await;
    println!("DNS: {out}");
    assert!(
        out.contains(&format!("allowed.test addr ['{allowed}']")),
        "{out}"
    );
    assert!(out.contains("refused.test error -2"), "{out}");
    assert!(out.contains("private.test error -2"), "{out}");
    // Around the proxy there is no route.
    let line = format!("curl -sS -m 3 --noproxy '*' http://{allowed}:8000/; echo rc=$?");
    let (_, out) = sh(&cl, id, &line).await;
    println!("around the proxy: {out}");
    assert!(!out.contains("egress-ok") && !out.contains("rc=0"), "{out}");

    let want = [
        ("refused.test", "not_allowed"),
        (refused.as_str(), "ip_literal"),
        ("private.test", "private_address"),
        ("allowed.test", "sni_mismatch"),
        ("refused.test", "not_allowed via dns"),
        ("private.test", "private_address via dns"),
    ];
    let got = wait_for(
        "the denials on the timeline",
        Duration::from_secs(10),
        || async {
            let d = denials(&cl, id).await;
            want.iter()
                .all(|(h, r)| d.iter().any(|(dh, dr)| dh == h && dr == r))
                .then_some(d)
        },
    )
    .await;
    println!("denials: {got:?}");
    let report = cl.get(id).await.unwrap().egress.unwrap();
    println!("record: {}", serde_json::to_string(&report).unwrap());
    // curl's two and the browser's page (and whatever else the page asked of the host).
    assert!(report.hosts.get("allowed.test") >= Some(&3), "{report:?}");
    // The browser's own calls home (its Google services) are refused and counted too.
    assert!(report.denied >= want.len() as u64, "{report:?}");

    // "none" reaches nothing; "open" reaches the test host directly.
    let none = cl
        .create(&ide(Egress::Mode(EgressMode::None)))
        .await
        .unwrap();
    let (_, out) = sh(
        &cl,
        &none.id,
        "curl -sS -m 10 http://allowed.test:8000/; echo rc=$?",
    )
    .await;
    println!("none: {out}");
    assert!(
        out.contains("egress_none") && !out.contains("egress-ok"),
        "{out}"
    );
    // …and resolves nothing.
    let out = lookups(&cl, &none.id, &["allowed.test", "refused.test"]).await;
    println!("none, DNS: {out}");
    assert!(out.contains("allowed.test error -2"), "{out}");
    assert!(out.contains("refused.test error -2"), "{out}");
    // Nor does a sandbox behind the proxy reach another one.
    let neighbour = berth_tests::egress::address_of(&format!("berth-{}", none.id));
    let line = format!("curl -sS -m 3 --noproxy '*' http://{neighbour}:5000/; echo rc=$?");
    let (_, out) = sh(&cl, id, &line).await;
    println!("neighbour {neighbour}: {out}");
    assert!(!out.contains("rc=0"), "{out}");
    let open = cl
        .create(&ide(Egress::Mode(EgressMode::Open)))
        .await
        .unwrap();
    let outside = hosts.outside(0, 8000);
    let (code, out) = sh(&cl, &open.id, &format!("curl -sS -m 10 http://{outside}/")).await;
    println!("open: {code:?} {out}");
    assert_eq!(code, Some(0), "{out}");
    assert!(out.starts_with("egress-ok"), "{out}");
    for s in [&sb.id, &none.id, &open.id] {
        cl.delete(s).await.unwrap();
    }
}

#[tokio::test]
async fn a_policy_the_provider_cannot_enforce_is_refused_with_the_reason() {
    let c = ControllerProcess::start("").await;
    let err = c
        .client()
        .create(&ide(Egress::Mode(EgressMode::None)))
        .await
        .unwrap_err()
        .to_string();
    println!("{err}");
    assert!(err.contains("cannot enforce an egress policy"), "{err}");
    let bad = Egress::Rules(EgressRules {
        allow: vec!["http://github.com".into()],
        deny_private: true,
    });
    let err = c.client().create(&ide(bad)).await.unwrap_err().to_string();
    println!("{err}");
    assert!(err.contains("egress allow entry"), "{err}");
}

/// Each controller on a host has its own egress network, gateway, proxy and DNS: two at once
/// each answer their own sandboxes' names (the same name mapped to a different host by each),
/// and the proxy of one does not serve the other's sandboxes.
#[tokio::test]
async fn two_controllers_on_one_host_each_serve_their_own_egress_sandboxes() {
    let image = image();
    let hosts = TestHosts::start(&image);
    let start = |ip: String| {
        let image = image.clone();
        async move {
            ControllerProcess::start(&format!(
                "docker_image = \"{image}\"\n[providers]\nide = \"docker\"\n[egress]\nproxy_port = 0\n\
                 [egress.hosts]\n\"allowed.test\" = [\"{ip}\"]\n"
            ))
            .await
        }
    };
    let (one, two) = (start(hosts.ip(0)).await, start(hosts.ip(1)).await);
    let policy = Egress::Rules(EgressRules {
        allow: vec!["allowed.test".into()],
        deny_private: false,
    });
    let mut sandboxes = Vec::new();
    for (c, ip) in [(&one, hosts.ip(0)), (&two, hosts.ip(1))] {
        let cl = c.client();
        let sb = cl.create(&ide(policy.clone())).await.unwrap();
        let out = lookups(&cl, &sb.id, &["allowed.test"]).await;
        println!("{}: {out}", c.id);
        assert_eq!(out.trim(), format!("allowed.test addr ['{ip}']"));
        let (code, out) = sh(&cl, &sb.id, "curl -sS -m 10 http://allowed.test:8000/").await;
        assert_eq!(
            (code, out.as_str()),
            (Some(0), "egress-ok allowed.test:8000")
        );
        sandboxes.push((cl, sb.id));
    }
    for (cl, id) in sandboxes {
        cl.delete(&id).await.unwrap();
    }
}
