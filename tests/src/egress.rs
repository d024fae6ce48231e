//! Test hosts for egress: containers on a network of their own, each an HTTP server on 8000
//! and an HTTPS one on 8443 (a self-signed certificate for `allowed.test`), answering
//! `egress-ok <Host>`. The controller's proxy reaches them by address; names for them are
//! the config's `[egress.hosts]`.

use std::process::Command;

/// Each test host: HTTP on 8000 and HTTPS on 8443 (a self-signed certificate), answering
/// `egress-ok <Host>`.
const SERVER: &str = r#"
import http.server, ssl, threading
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = ("egress-ok " + self.headers.get("Host", "")).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
def serve(port, tls):
    s = http.server.ThreadingHTTPServer(("0.0.0.0", port), H)
    if tls:
        c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        c.load_cert_chain("/certs/cert.pem", "/certs/key.pem")
        s.socket = c.wrap_socket(s.socket, server_side=True)
    s.serve_forever()
threading.Thread(target=serve, args=(8443, True), daemon=True).start()
serve(8000, False)
"#;

/// `docker ARGS`' output; panics when it fails.
pub fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().unwrap();
    assert!(out.status.success(), "docker {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The test's network and its two hosts, removed when dropped.
pub struct TestHosts {
    /// The network the hosts are on (the test's own).
    pub network: String,
    /// The hosts' container names: `allowed`, then `refused`.
    pub names: Vec<String>,
    _certs: tempfile::TempDir,
}

impl Drop for TestHosts {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("docker").args(["rm", "-f", n]).output();
        }
        let _ = Command::new("docker")
            .args(["network", "rm", &self.network])
            .output();
    }
}

impl TestHosts {
    /// Two hosts from `image` (anything with python3) on a new network of their own.
    pub fn start(image: &str) -> TestHosts {
        let tag = format!("{:x}", std::process::id() ^ rand_suffix());
        let certs = tempfile::tempdir().unwrap();
        let dir = certs.path().to_string_lossy().into_owned();
        let ok = Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            ])
            .args(["-subj", "/CN=allowed.test"])
            .args(["-keyout", &format!("{dir}/key.pem")])
            .args(["-out", &format!("{dir}/cert.pem")])
            .output()
            .unwrap();
        assert!(ok.status.success(), "{ok:?}");
        std::fs::set_permissions(
            certs.path().join("key.pem"),
            std::os::unix::fs::PermissionsExt::from_mode(0o644),
        )
        .unwrap();
        let network = format!("berth-egress-test-{tag}");
        docker(&["network", "create", &network]);
        let mut hosts = TestHosts {
            network,
            names: Vec::new(),
            _certs: certs,
        };
        for which in ["allowed", "refused"] {
            let name = format!("berth-egress-test-{which}-{tag}");
            docker(&[
                "run",
                "-d",
                "--name",
                &name,
                "--network",
                &hosts.network,
                "-v",
                &format!("{dir}:/certs:ro"),
                "--entrypoint",
                "python3",
                image,
                "-c",
                SERVER,
            ]);
            hosts.names.push(name);
        }
        hosts
    }

    /// Host `i`'s address on the test's network.
    pub fn ip(&self, i: usize) -> String {
        ip_on(&self.names[i], &self.network)
    }
}

/// A container's address on `network`.
pub fn ip_on(container: &str, network: &str) -> String {
    docker(&[
        "inspect",
        "-f",
        &format!("{{{{(index .NetworkSettings.Networks \"{network}\").IPAddress}}}}"),
        container,
    ])
}

fn rand_suffix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
}
