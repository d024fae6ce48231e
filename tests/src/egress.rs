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

/// Removes a test's containers, then their network (best effort: a drop never fails).
fn remove(containers: &[&str], network: &str) {
    for n in containers {
        let _ = Command::new("docker").args(["rm", "-f", n]).output();
    }
    let _ = Command::new("docker")
        .args(["network", "rm", network])
        .output();
}

impl Drop for TestHosts {
    fn drop(&mut self) {
        let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
        remove(&names, &self.network);
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
            .args(["-addext", "subjectAltName=DNS:allowed.test,DNS:edge.test"])
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
        // Their ports published on the network's gateway: the host's address, which a
        // sandbox without a policy reaches as it would a server on the internet.
        let gateway = docker(&[
            "network",
            "inspect",
            "-f",
            "{{(index .IPAM.Config 0).Gateway}}",
            &network,
        ]);
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
                "-p",
                &format!("{gateway}::8000"),
                "-p",
                &format!("{gateway}::8443"),
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

    /// The hosts' HTTPS certificate (self-signed, for `allowed.test` and `edge.test`).
    pub fn cert(&self) -> std::path::PathBuf {
        self._certs.path().join("cert.pem")
    }

    /// Host `i`'s `port` (8000 or 8443) as the host publishes it (`gateway:port`): reached
    /// from any container with a route out, as a server outside would be.
    pub fn outside(&self, i: usize, port: u16) -> String {
        docker(&["port", &self.names[i], &port.to_string()])
            .lines()
            .next()
            .unwrap()
            .to_string()
    }

    /// Host `i`'s address on the test's network.
    pub fn ip(&self, i: usize) -> String {
        ip_on(&self.names[i], &self.network)
    }
}

/// A container's address on the one network it is on.
pub fn address_of(container: &str) -> String {
    docker(&[
        "inspect",
        "-f",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
        container,
    ])
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

/// The git host: Debian's `git-http-backend` behind a small HTTPS server on 443 that wants a
/// token (basic authentication as GitHub takes it for git, a bearer token on its REST routes
/// under `/api/v3`), and `/whoami` answering `authorized` when the `X-Api-Token` header holds
/// the second secret (and ` sandbox` when `X-Sandbox-Token` holds it too). No answer ever
/// repeats a request's header.
const GIT_SERVER: &str = r#"
import base64, http.server, json, os, ssl, subprocess, sys
TOKEN, API_TOKEN = open("/certs/token").read().strip(), open("/certs/api-token").read().strip()
BASIC = "Basic " + base64.b64encode(("x-access-token:" + TOKEN).encode()).decode()
REPOS = [{"full_name": "acme/private-repo", "private": True, "default_branch": "main",
          "description": "the test's private repository"},
         {"full_name": "acme/other", "private": True, "default_branch": "main"}]
PULL = {"number": 1, "title": "A pull request", "state": "open", "user": {"login": "octo"},
        "head": {"ref": "feature", "sha": "abc123"}, "base": {"ref": "main"}, "draft": False,
        "body": "Fixes #2.\n\nThe description of the pull request.",
        "created_at": "2026-12-01T00:00:00Z", "updated_at": "2026-12-02T00:00:00Z",
        "html_url": "https://git.test/acme/private-repo/pull/1"}
ISSUE = {"number": 2, "title": "A bug", "state": "open", "user": {"login": "octo"},
         "labels": [{"name": "bug"}], "comments": 1, "body": "It breaks when run twice.",
         "created_at": "2026-11-30T00:00:00Z", "updated_at": "2026-12-01T00:00:00Z"}
# A diff larger than a read answers inline: 30000 added lines.
DIFF = ("diff --git a/big.txt b/big.txt\nnew file mode 100644\n--- /dev/null\n+++ b/big.txt\n"
        "@@ -0,0 +1,30000 @@\n" + "".join("+line %d\n" % i for i in range(1, 30001)))
API = {
    "pulls": [PULL, dict(PULL, number=3, title="Another pull request", state="open")],
    "pulls/1": PULL,
    "pulls/1/files": [{"filename": "big.txt", "status": "added", "additions": 30000, "deletions": 0}],
    "pulls/1/reviews": [{"id": 11, "user": {"login": "reviewer"}, "state": "APPROVED",
                         "body": "Looks good.", "submitted_at": "2026-12-02T10:00:00Z"}],
    "pulls/1/comments": [{"id": 12, "user": {"login": "reviewer"}, "body": "Nit: a newline.",
                          "path": "big.txt", "line": 3, "created_at": "2026-12-02T10:01:00Z"}],
    "issues": [ISSUE, {"number": 1, "title": "A pull request", "state": "open",
                       "pull_request": {"url": "x"}}],
    "issues/2": ISSUE,
    "issues/2/comments": [{"id": 21, "user": {"login": "octo"}, "body": "I can reproduce it.",
                           "created_at": "2026-12-01T01:00:00Z"}],
}
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def reply(self, code, body, ctype="text/plain", extra=()):
        b = body.encode() if isinstance(body, str) else body
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(b)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(b)
    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                n = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if n == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(n)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))
    def route(self):
        path, _, query = self.path.partition("?")
        auth = self.headers.get("Authorization", "")
        with open("/srv/requests.log", "a") as f:
            f.write("%s %s %s\n" % (self.command, path, "auth" if auth else "anon"))
        if path == "/whoami":
            ok = self.headers.get("X-Api-Token") == "Token " + API_TOKEN
            mine = self.headers.get("X-Sandbox-Token") == "Sandbox " + API_TOKEN
            return self.reply(200, ("authorized" if ok else "anonymous") + (" sandbox" if mine else ""))
        if path.startswith("/api/v3/"):
            if auth != "Bearer " + TOKEN:
                return self.reply(401, json.dumps({"message": "Bad credentials"}), "application/json")
            if path == "/api/v3/user/repos":
                page = "page=1" in query.split("&") or "page" not in query
                return self.reply(200, json.dumps(REPOS if page else []), "application/json")
            rest = path[len("/api/v3/repos/acme/"):] if path.startswith("/api/v3/repos/acme/") else ""
            repo, _, sub = rest.partition("/")
            if repo in ("private-repo", "other") and sub in API:
                body = API[sub]
                if sub == "pulls/1" and "diff" in self.headers.get("Accept", ""):
                    return self.reply(200, DIFF, "text/x-diff")
                extra = []
                if sub == "pulls" and "per_page=1" in query.split("&") and "page=2" not in query.split("&"):
                    body = body[:1]
                    extra = [("Link", '<https://git.test%s?page=2>; rel="next"' % path)]
                return self.reply(200, json.dumps(body), "application/json", extra)
            return self.reply(404, json.dumps({"message": "Not Found"}), "application/json")
        if auth != BASIC:
            return self.reply(401, "token wanted\n", extra=[("WWW-Authenticate", 'Basic realm="git"')])
        data = self.body()
        env = dict(os.environ, GIT_PROJECT_ROOT="/srv/git", GIT_HTTP_EXPORT_ALL="1",
                   PATH_INFO=path, QUERY_STRING=query, REQUEST_METHOD=self.command,
                   CONTENT_TYPE=self.headers.get("Content-Type", ""),
                   CONTENT_LENGTH=str(len(data)), REMOTE_USER="x-access-token",
                   REMOTE_ADDR=self.client_address[0])
        out = subprocess.run(["/usr/lib/git-core/git-http-backend"], input=data, env=env,
                             capture_output=True).stdout
        head, _, rest = out.partition(b"\r\n\r\n")
        if not _:
            head, _, rest = out.partition(b"\n\n")
        code, extra, ctype = 200, [], "application/octet-stream"
        for line in head.decode().splitlines():
            k, _, v = line.partition(":")
            if k.lower() == "status":
                code = int(v.strip().split()[0])
            elif k.lower() == "content-type":
                ctype = v.strip()
            elif k and k.lower() != "content-length":
                extra.append((k, v.strip()))
        self.reply(code, rest, ctype, extra)
    do_GET = do_POST = route
s = http.server.ThreadingHTTPServer(("0.0.0.0", 443), H)
c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
c.load_cert_chain("/certs/git.pem", "/certs/git-key.pem")
s.socket = c.wrap_socket(s.socket, server_side=True)
s.serve_forever()
"#;

/// The repositories: `acme/private-repo` (a README and a commit on `main`) and `acme/other`.
const GIT_REPOS: &str = "set -e
for r in private-repo other; do
  git init -q --bare -b main /srv/git/acme/$r.git
  git -C /srv/git/acme/$r.git config http.receivepack true
  rm -rf /tmp/w && git init -q -b main /tmp/w
  echo \"# $r: berth egress test\" > /tmp/w/README.md
  git -C /tmp/w add README.md
  git -C /tmp/w -c user.name=t -c user.email=t@t commit -q -m first
  git -C /tmp/w push -q /srv/git/acme/$r.git main
done";

/// A git host container on the test's network: `git.test` and `creds.test` by a certificate
/// of the test's own CA (`ca.pem`, what the controller's `[egress] upstream_ca` names).
pub struct GitHost {
    pub name: String,
    pub network: String,
    /// The test CA (PEM file), the GitHub token and the other credential's secret.
    pub ca: std::path::PathBuf,
    pub token: String,
    pub api_token: String,
    pub token_file: std::path::PathBuf,
    pub api_token_file: std::path::PathBuf,
    dir: tempfile::TempDir,
}

impl Drop for GitHost {
    fn drop(&mut self) {
        remove(&[&self.name], &self.network);
    }
}

fn openssl(args: &[&str]) {
    let out = Command::new("openssl").args(args).output().unwrap();
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

/// The test CA, the git host's certificate for `git.test` and `creds.test`, and the two
/// secrets (files `token`, `api-token`), in `dir`.
fn secrets_and_certs(dir: &std::path::Path) -> (String, String) {
    let d = |f: &str| dir.join(f).to_string_lossy().into_owned();
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=berth test CA",
        "-keyout",
        &d("ca-key.pem"),
        "-out",
        &d("ca.pem"),
    ]);
    certificate(
        dir,
        "git",
        &["git.test", "creds.test"],
        &dir.join("ca.pem"),
        &dir.join("ca-key.pem"),
    );
    let token = format!(
        "ghp_berthtest{:032x}",
        u128::from(rand_suffix()) << 64 | u128::from(std::process::id()) << 32 | 0xfeed
    );
    let api_token = format!("berth-api-secret-{:x}", rand_suffix() ^ 0x5eed);
    std::fs::write(d("token"), &token).unwrap();
    std::fs::write(d("api-token"), &api_token).unwrap();
    for f in ["git-key.pem", "token", "api-token"] {
        std::fs::set_permissions(
            dir.join(f),
            std::os::unix::fs::PermissionsExt::from_mode(0o644),
        )
        .unwrap();
    }
    (token, api_token)
}

impl GitHost {
    /// Starts it from `image` (python3 and git) and waits until it answers.
    pub fn start(image: &str) -> GitHost {
        let tag = format!("{:x}", std::process::id() ^ rand_suffix());
        let dir = tempfile::tempdir().unwrap();
        let d = |f: &str| dir.path().join(f).to_string_lossy().into_owned();
        let (token, api_token) = secrets_and_certs(dir.path());
        let network = format!("berth-git-test-{tag}");
        docker(&["network", "create", &network]);
        let name = format!("berth-git-test-{tag}");
        let script = format!(
            "{GIT_REPOS}\nexec python3 -c '{}'",
            GIT_SERVER.replace('\'', "'\\''")
        );
        docker(&[
            "run",
            "-d",
            "--name",
            &name,
            "--network",
            &network,
            "-v",
            &format!("{}:/certs:ro", d("")),
            "--entrypoint",
            "sh",
            image,
            "-c",
            &script,
        ]);
        let host = GitHost {
            name,
            network,
            ca: dir.path().join("ca.pem"),
            token,
            api_token,
            token_file: dir.path().join("token"),
            api_token_file: dir.path().join("api-token"),
            dir,
        };
        host.wait_ready();
        host
    }

    fn wait_ready(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let out = Command::new("docker")
                .args([
                    "exec",
                    &self.name,
                    "curl",
                    "-sk",
                    "https://127.0.0.1/whoami",
                ])
                .output()
                .unwrap();
            if String::from_utf8_lossy(&out.stdout).contains("anonymous") {
                return;
            }
            let logs = Command::new("docker")
                .args(["logs", &self.name])
                .output()
                .unwrap();
            assert!(
                std::time::Instant::now() < deadline,
                "the git host did not start: {logs:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// Its address on its network.
    pub fn ip(&self) -> String {
        ip_on(&self.name, &self.network)
    }

    /// A shell line's output in the git host (its repositories are under /srv/git).
    pub fn sh(&self, line: &str) -> String {
        docker(&["exec", &self.name, "sh", "-c", line])
    }

    /// The test's scratch directory (kept while the host lives).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

/// Where `needles` occur in the memory and environment of every process of a container
/// (read from the host, as root): `(pid, what, needle index)` for each hit, and how many
/// processes and bytes were read.
pub fn scan_processes(
    container: &str,
    needles: &[&[u8]],
) -> (Vec<(u32, String, usize)>, usize, u64) {
    use std::io::{Read, Seek, SeekFrom};
    let pids: Vec<u32> = docker(&["top", container, "-eo", "pid"])
        .lines()
        .skip(1)
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    let mut hits = Vec::new();
    let mut bytes = 0u64;
    let find = |hay: &[u8], hits: &mut Vec<(u32, String, usize)>, pid: u32, what: &str| {
        for (i, n) in needles.iter().enumerate() {
            if memchr::memmem::find(hay, n).is_some() {
                hits.push((pid, what.to_string(), i));
            }
        }
    };
    for &pid in &pids {
        if let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) {
            find(&env, &mut hits, pid, "environ");
        }
        if let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            find(&cmd, &mut hits, pid, "cmdline");
        }
        let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
            continue;
        };
        let Ok(mut mem) = std::fs::File::open(format!("/proc/{pid}/mem")) else {
            continue;
        };
        for line in maps.lines() {
            let mut f = line.split_whitespace();
            let (Some(range), Some(perms)) = (f.next(), f.next()) else {
                continue;
            };
            let Some((a, b)) = range.split_once('-') else {
                continue;
            };
            let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
                continue;
            };
            // Readable regions up to 1 GiB each (stack, heap, anonymous, mapped files).
            if !perms.starts_with('r') || b - a > (1 << 30) || line.contains("[vvar") {
                continue;
            }
            let mut buf = vec![0u8; (b - a) as usize];
            if mem.seek(SeekFrom::Start(a)).is_err() || mem.read_exact(&mut buf).is_err() {
                continue;
            }
            bytes += buf.len() as u64;
            find(&buf, &mut hits, pid, line);
        }
    }
    (hits, pids.len(), bytes)
}

/// The login test's sites, one HTTPS server on 443 telling them apart by `Host`:
/// `login.test` (a form, then a session cookie and `/me` saying who is signed in),
/// `totp.test` (the same with a one-time-code step: RFC 6238 over the seed it was given),
/// `broken.test` (no form), `never.test` (a form that never signs anyone in),
/// `unmasked.test` (a password field of `type="text"`) and `offlist.test`. Each login POST
/// is counted per host at `GET /attempts`; no answer repeats a value it was sent.
const LOGIN_SERVER: &str = r#"
import base64, hashlib, hmac, http.server, json, secrets, ssl, struct, time, urllib.parse
PW = open("/certs/password").read().strip()
SEED = base64.b32decode(open("/certs/totp-seed").read().strip())
USERS = {"login.test": "alice", "totp.test": "bob", "never.test": "carol",
         "unmasked.test": "dan", "broken.test": "eve", "offlist.test": "frank"}
sessions, pending, attempts = {}, {}, {}
def totp(t):
    h = hmac.new(SEED, struct.pack(">Q", int(t) // 30), hashlib.sha1).digest()
    o = h[-1] & 15
    return "%06d" % ((struct.unpack(">I", h[o:o + 4])[0] & 0x7fffffff) % 1000000)
FORM = ('<!doctype html><html><head><title>Sign in</title></head><body><h1>Sign in to %s</h1>'
        '<form method="post" action="/login"><p><label for="u">Email or user name</label> '
        '<input id="u" name="user" autocomplete="username"></p><p><label for="p">Password</label> '
        '<input id="p" name="pass" type="%s" autocomplete="current-password"></p>'
        '<button type="submit">Sign in</button></form></body></html>')
OTP = ('<!doctype html><html><head><title>Verify</title></head><body><h1>Two-step verification</h1>'
       '<form method="post" action="/otp"><label for="c">Verification code</label> '
       '<input id="c" name="otp" autocomplete="one-time-code" inputmode="numeric"> '
       '<button type="submit">Verify</button></form></body></html>')
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def host(self):
        return self.headers.get("Host", "").split(":")[0]
    def cookie(self, name):
        for part in self.headers.get("Cookie", "").split(";"):
            k, _, v = part.strip().partition("=")
            if k == name:
                return v
        return None
    def send(self, code, body, headers=()):
        b = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(b)))
        self.send_header("Cache-Control", "no-store")
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(b)
    def go(self, to, cookie=None):
        h = [("Location", to)]
        if cookie:
            h.append(("Set-Cookie", "%s=%s; Path=/; Secure; HttpOnly; SameSite=Lax" % cookie))
        self.send(303, "", h)
    def do_GET(self):
        host, path = self.host(), self.path.split("?")[0]
        if path == "/attempts":
            return self.send(200, json.dumps(attempts))
        if path == "/login":
            if host == "broken.test":
                return self.send(200, "<h1>Down for maintenance</h1><p>Come back later.</p>")
            return self.send(200, FORM % (host, "text" if host == "unmasked.test" else "password"))
        if path == "/otp" and host == "totp.test" and self.cookie("pending") in pending:
            return self.send(200, OTP)
        if path == "/me":
            s = sessions.get(self.cookie("session"))
            if s and s[0] == host:
                return self.send(200, '<h1 id="who">Signed in as %s</h1>' % s[1])
            return self.go("/login")
        self.send(404, "not found")
    def do_POST(self):
        host, path = self.host(), self.path.split("?")[0]
        n = int(self.headers.get("Content-Length") or 0)
        form = {k: v[0] for k, v in urllib.parse.parse_qs(self.rfile.read(n).decode()).items()}
        attempts[host + path] = attempts.get(host + path, 0) + 1
        if path == "/login":
            if form.get("user") == USERS.get(host) and form.get("pass") == PW and host != "never.test":
                tok = secrets.token_hex(16)
                if host == "totp.test":
                    pending[tok] = (host, USERS[host])
                    return self.go("/otp", ("pending", tok))
                sessions[tok] = (host, USERS[host])
                return self.go("/me", ("session", tok))
            return self.send(200, '<p id="error">Not signed in.</p>' + FORM % (host, "password"))
        if path == "/otp":
            p = pending.pop(self.cookie("pending"), None)
            now = time.time()
            if p and form.get("otp") in (totp(now), totp(now - 30), totp(now + 30)):
                tok = secrets.token_hex(16)
                sessions[tok] = p
                return self.go("/me", ("session", tok))
            return self.send(200, '<p id="error">Wrong code.</p>')
        self.send(404, "not found")
# The certificate comes once the controller's CA exists (the test signs it with that CA).
import os
while not os.path.exists("/certs/ready"):
    time.sleep(0.1)
s = http.server.ThreadingHTTPServer(("0.0.0.0", 443), H)
c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
c.load_cert_chain("/certs/site.pem", "/certs/site-key.pem")
s.socket = c.wrap_socket(s.socket, server_side=True)
s.serve_forever()
"#;

/// The login sites' names (their certificate's names, the config's `[egress.hosts]`).
pub const LOGIN_HOSTS: [&str; 6] = [
    "login.test",
    "totp.test",
    "broken.test",
    "never.test",
    "unmasked.test",
    "offlist.test",
];

/// The login test's site container on a network of its own, with the
/// password (`password_file`) and the TOTP seed (`seed_file`, base32) it checks logins with.
pub struct LoginSite {
    pub name: String,
    pub network: String,
    pub password: String,
    pub seed: String,
    pub password_file: std::path::PathBuf,
    pub seed_file: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for LoginSite {
    fn drop(&mut self) {
        remove(&[&self.name], &self.network);
    }
}

/// A certificate for `names` (`<stem>.pem`, `<stem>-key.pem` in `dir`, the key readable by
/// a container's server) signed by the CA whose certificate and key are `ca`, `ca_key`.
fn certificate(
    dir: &std::path::Path,
    stem: &str,
    names: &[&str],
    ca: &std::path::Path,
    ca_key: &std::path::Path,
) {
    let d = |f: &str| dir.join(f).to_string_lossy().into_owned();
    let (ca, ca_key) = (ca.to_string_lossy(), ca_key.to_string_lossy());
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        &format!("/CN={}", names[0]),
        "-keyout",
        &d(&format!("{stem}-key.pem")),
        "-out",
        &d(&format!("{stem}.csr")),
    ]);
    let sans: Vec<String> = names.iter().map(|n| format!("DNS:{n}")).collect();
    std::fs::write(
        d("ext"),
        format!(
            "subjectAltName={}\nextendedKeyUsage=serverAuth\n",
            sans.join(",")
        ),
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        &d(&format!("{stem}.csr")),
        "-CA",
        &ca,
        "-CAkey",
        &ca_key,
        "-set_serial",
        &format!("{}", rand_suffix()),
        "-days",
        "2",
        "-extfile",
        &d("ext"),
        "-out",
        &d(&format!("{stem}.pem")),
    ]);
    std::fs::set_permissions(
        dir.join(format!("{stem}-key.pem")),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
}

impl LoginSite {
    /// Starts it from `image` (python3) and waits until it answers.
    pub fn start(image: &str) -> LoginSite {
        let tag = format!("{:x}", std::process::id() ^ rand_suffix());
        let dir = tempfile::tempdir().unwrap();
        let n = u128::from(rand_suffix()) << 32 | u128::from(std::process::id());
        let password = format!("pw-berth-login-{n:024x}");
        // 32 base32 characters: a 20-byte seed, as authenticator apps are given.
        let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
        let mut x = n ^ 0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834;
        let seed: String = (0..32)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                alphabet[(x >> 100) as usize % 32] as char
            })
            .collect();
        let password_file = dir.path().join("password");
        let seed_file = dir.path().join("totp-seed");
        std::fs::write(&password_file, &password).unwrap();
        std::fs::write(&seed_file, &seed).unwrap();
        for f in std::fs::read_dir(dir.path()).unwrap() {
            std::fs::set_permissions(
                f.unwrap().path(),
                std::os::unix::fs::PermissionsExt::from_mode(0o644),
            )
            .unwrap();
        }
        let network = format!("berth-login-test-{tag}");
        docker(&["network", "create", &network]);
        let name = format!("berth-login-test-{tag}");
        let site = LoginSite {
            name,
            network,
            password,
            seed,
            password_file,
            seed_file,
            _dir: dir,
        };
        docker(&[
            "run",
            "-d",
            "--name",
            &site.name,
            "--network",
            &site.network,
            "-v",
            &format!("{}:/certs:ro", site._dir.path().display()),
            "--entrypoint",
            "python3",
            image,
            "-c",
            LOGIN_SERVER,
        ]);
        site
    }

    /// Serves `LOGIN_HOSTS` with a certificate of the CA `ca` (with its key `ca_key`): the
    /// controller's egress CA, which the sandbox's browser trusts as it trusts the public CAs
    /// real sites' certificates come from. Waits until it answers.
    pub fn certify(&self, ca: &std::path::Path, ca_key: &std::path::Path) {
        certificate(self._dir.path(), "site", &LOGIN_HOSTS, ca, ca_key);
        std::fs::write(self._dir.path().join("ready"), "").unwrap();
        let site = self;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !site.attempts().starts_with('{') {
            assert!(
                std::time::Instant::now() < deadline,
                "the login site did not start: {:?}",
                Command::new("docker").args(["logs", &site.name]).output()
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// The login POSTs it received, by `host/path` (JSON).
    pub fn attempts(&self) -> String {
        let out = Command::new("docker")
            .args([
                "exec",
                &self.name,
                "curl",
                "-sk",
                "https://127.0.0.1/attempts",
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn ip(&self) -> String {
        ip_on(&self.name, &self.network)
    }
}

/// Where `needles` occur in the environment and command line of every process of a container
/// (read from the host): `(pid, what, needle index)` per hit, and how many processes were read.
pub fn scan_environments(container: &str, needles: &[&[u8]]) -> (Vec<(u32, String, usize)>, usize) {
    let pids: Vec<u32> = docker(&["top", container, "-eo", "pid"])
        .lines()
        .skip(1)
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    let mut hits = Vec::new();
    for &pid in &pids {
        for what in ["environ", "cmdline"] {
            if let Ok(b) = std::fs::read(format!("/proc/{pid}/{what}")) {
                for (i, n) in needles.iter().enumerate() {
                    if memchr::memmem::find(&b, n).is_some() {
                        hits.push((pid, what.to_string(), i));
                    }
                }
            }
        }
    }
    (hits, pids.len())
}
