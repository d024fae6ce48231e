//! `egress`: what the egress proxy costs a connection. Two Docker sandboxes of the desktop
//! image through a real `berth serve`: one with an allow-list (its only way out the proxy), one
//! `"open"` (a direct route). Each fetches the same test host (a container on a network of
//! its own, `berth_tests::egress`) from inside, with Python's `urllib` as programs there do:
//! a new connection per request, the proxy found in the environment, HTTP and HTTPS (a
//! CONNECT tunnel, TLS end to end), and HTTPS to a host with a credential (the tunnel opened
//! at the proxy: TLS from the sandbox to the proxy, the header added, TLS from the proxy to the
//! host). The p50 and p99 of a whole request are printed side by side.

use berth_protocol::controller::{ControllerClient, CreateSandbox};
use berth_protocol::egress::{Egress, EgressMode, EgressRules};
use berth_tests::controller::{ControllerProcess, build_desktop_image, shell};
use berth_tests::egress::TestHosts;

/// Requests `argv[1]` `argv[2]` times, each on a new connection; prints p50 and p99 in ms.
const FETCH: &str = r#"
import ssl, sys, time, urllib.request
url, n = sys.argv[1], int(sys.argv[2])
ctx = ssl._create_unverified_context()
ts = []
for i in range(n):
    t = time.perf_counter()
    urllib.request.urlopen(url, context=ctx, timeout=10).read()
    ts.append((time.perf_counter() - t) * 1000)
ts.sort()
print(f"{ts[len(ts) // 2]:.2f} {ts[max(0, int(len(ts) * 0.99) - 1)]:.2f}")
"#;

/// `(p50, p99)` of `n` fetches of `url` from inside sandbox `id`.
async fn fetch(cl: &ControllerClient, id: &str, url: &str, n: usize) -> (f64, f64) {
    let line = format!("python3 -c '{FETCH}' {url} {n}");
    let run = cl.exec(id, &shell(&line)).await.expect("the fetch run");
    assert_eq!(run.exit_code, Some(0), "{url}: {run:?}");
    let mut it = run
        .stdout
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(f64::NAN));
    (it.next().unwrap_or(f64::NAN), it.next().unwrap_or(f64::NAN))
}

pub async fn bench(n: usize) {
    println!("\n== egress: a request through the egress proxy beside a direct one ({n} each) ==");
    let Some(image) = build_desktop_image()
        .ok()
        .and_then(|v| v["image_ref"].as_str().map(String::from))
    else {
        println!("(no desktop image: `berth image build --profile desktop`)");
        return;
    };
    let hosts = TestHosts::start(&image);
    let ip = hosts.ip(0);
    let secret = tempfile::NamedTempFile::new().expect("a secret file");
    std::fs::write(secret.path(), "bench-secret").expect("the secret");
    let c = ControllerProcess::start(&format!(
        "docker_image = \"{image}\"\n[providers]\nide = \"docker\"\n[egress]\nproxy_port = 0\n\
         upstream_ca = [\"{cert}\"]\n[egress.hosts]\n\"allowed.test\" = [\"{ip}\"]\n\
         \"edge.test\" = [\"{ip}\"]\n[[egress.credentials]]\nhost = \"edge.test\"\n\
         secret_file = \"{secret}\"\n",
        cert = hosts.cert().display(),
        secret = secret.path().display(),
    ))
    .await;
    let cl = c.client();
    let create = |egress| CreateSandbox {
        egress: Some(egress),
        ..berth_tests::controller::ide()
    };
    let policy = Egress::Rules(EgressRules {
        allow: vec![
            "allowed.test".into(),
            "edge.test".into(),
            format!("{ip}/32"),
        ],
        deny_private: true,
    });
    let proxied = cl.create(&create(policy)).await.expect("a proxied sandbox");
    let open = cl
        .create(&create(Egress::Mode(EgressMode::Open)))
        .await
        .expect("an open sandbox");
    // The open sandbox reaches the test host as a server outside: its ports published on the
    // host (sandboxes do not reach each other's containers).
    println!(
        "{:<34} {:>18} {:>18}",
        "request (new connection each)", "through the proxy", "direct"
    );
    for (what, scheme, name, port) in [
        ("HTTP GET", "http", "allowed.test", 8000),
        ("HTTPS GET (CONNECT, TLS)", "https", "allowed.test", 8443),
        ("HTTPS GET, credential added", "https", "edge.test", 8443),
    ] {
        let p = fetch(&cl, &proxied.id, &format!("{scheme}://{name}:{port}/"), n).await;
        let direct = hosts.outside(0, port);
        let d = fetch(&cl, &open.id, &format!("{scheme}://{direct}/"), n).await;
        println!(
            "{what:<34} {:>18} {:>18}",
            format!("{:.2} / {:.2} ms", p.0, p.1),
            format!("{:.2} / {:.2} ms", d.0, d.1)
        );
    }
    println!("(p50 / p99 of a whole request from inside the sandbox, Python's urllib)");
    for id in [&proxied.id, &open.id] {
        let _ = cl.delete(id).await;
    }
}
