//! Credentials added at the edge, from inside a Docker sandbox of the desktop image behind the
//! controller's egress proxy. The test's git host is a container on a network of its own:
//! Debian's `git-http-backend` behind a small HTTPS server (a certificate of the test's own CA,
//! which the controller trusts upstream) that wants a token, with GitHub's REST routes under
//! `/api/v3`; no traffic leaves the machine.
//!
//! The sandbox trusts the proxy's CA without being told (curl, Python, git, the desktop's
//! browser); a configured credential reaches its host; `github_repositories` lists what the
//! token reads; `github_clone_repository` clones the private repository, whose fetches, pushes
//! and pull-request reads then carry the token, and no other repository's requests do, even
//! after a controller restart. Then the token is searched for in the sandbox's files, every
//! process's environment and memory, the agent's logs and every API answer of the test: none.

use std::time::Duration;

use berth_protocol::controller::{
    ControllerClient, CreateSandbox, GithubClone, GithubListQuery, SandboxCredential,
};
use berth_protocol::egress::{Egress, EgressRules};
use berth_tests::controller::{ControllerProcess, shell};
use berth_tests::egress::{GitHost, docker, scan_processes};

/// A shell line's exit code and output (stdout, then stderr), and the answer's JSON.
async fn sh(
    cl: &ControllerClient,
    id: &str,
    line: &str,
    answers: &mut String,
) -> (Option<i32>, String) {
    let run = cl.exec(id, &shell(line)).await.unwrap();
    answers.push_str(&serde_json::to_string(&run).unwrap());
    (run.exit_code, format!("{}{}", run.stdout, run.stderr))
}

/// Playwright for Python over the sandbox's CDP endpoint: the page's text, or the error.
fn browser_page(cdp: &str, url: &str) -> String {
    let script = r#"
import sys
from playwright.sync_api import sync_playwright
with sync_playwright() as p:
    browser = p.chromium.connect_over_cdp(sys.argv[1], timeout=30000)
    page = browser.contexts[0].new_page()
    try:
        page.goto(sys.argv[2], timeout=15000)
        print("PAGE", page.inner_text("body"))
    except Exception as e:
        print("ERROR", str(e).splitlines()[0])
"#;
    berth_tests::playwright(script, &[cdp, url], 120)
}

fn config(image: &str, git: &GitHost, proxy_port: u16) -> String {
    let ip = git.ip();
    format!(
        "docker_image = \"{image}\"\n[providers]\ndesktop = \"docker\"\nide = \"docker\"\n\
         [egress]\nproxy_port = {proxy_port}\nupstream_ca = [\"{ca}\"]\n\
         [egress.hosts]\n\"git.test\" = [\"{ip}\"]\n\"creds.test\" = [\"{ip}\"]\n\
         [egress.github]\nhost = \"git.test\"\nsecret_file = \"{token}\"\n\
         [[egress.credentials]]\nhost = \"creds.test\"\nheader = \"X-Api-Token\"\n\
         value = \"Token {{secret}}\"\nsecret_file = \"{api}\"\n",
        ca = git.ca.display(),
        token = git.token_file.display(),
        api = git.api_token_file.display(),
    )
}

#[tokio::test]
async fn credentials_are_added_at_the_edge_and_never_enter_the_sandbox() {
    let image = berth_tests::controller::build_desktop_image().unwrap()["image_ref"]
        .as_str()
        .unwrap()
        .to_string();
    let git = GitHost::start(&image);
    let mut c = ControllerProcess::start(&config(&image, &git, berth_tests::free_port())).await;
    let cl = c.client();
    let mut answers = String::new();
    let policy = Egress::Rules(EgressRules {
        allow: vec!["git.test".into(), "creds.test".into()],
        deny_private: false,
    });
    let desktop = CreateSandbox {
        egress: Some(policy),
        ..berth_tests::controller::desktop()
    };
    let sb = cl.create(&desktop).await.unwrap();
    answers.push_str(&serde_json::to_string(&sb).unwrap());
    let id = sb.id.clone();

    // A configured credential reaches its host; curl and Python trust the proxy's CA.
    for line in [
        "curl -sS -m 10 https://creds.test/whoami",
        "python3 -c 'import urllib.request as u; \
         print(u.urlopen(\"https://creds.test/whoami\", timeout=10).read().decode())'",
    ] {
        let (code, out) = sh(&cl, &id, line, &mut answers).await;
        println!("{line}: {code:?} {out}");
        assert_eq!((code, out.trim()), (Some(0), "authorized"), "{line}");
    }
    // The desktop's browser trusts it too (Chrome's policy).
    let cdp = sb.endpoints.cdp.clone().expect("a desktop's CDP endpoint");
    let page = browser_page(&cdp, "https://creds.test/whoami");
    println!("browser: {page}");
    assert!(page.contains("PAGE authorized"), "{page}");
    // What the agent sees: the page in front, no certificate warning, no proxy prompt.
    let png = cl.screenshot(&id).await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    let shot = crate::osworld::repo_root().join("tests/screenshots/egress-credential-chrome.png");
    std::fs::write(&shot, &png).unwrap();

    // The GitHub tools: what the token reads, then a clone.
    let repos = cl.github_repositories().await.unwrap();
    answers.push_str(&serde_json::to_string(&repos).unwrap());
    let names: Vec<&str> = repos
        .repositories
        .iter()
        .map(|r| r.full_name.as_str())
        .collect();
    println!("repositories: {names:?}");
    assert!(names.contains(&"acme/private-repo"), "{names:?}");
    let t = std::time::Instant::now();
    let cloned = cl
        .github_clone(
            &id,
            &GithubClone {
                repository: "acme/private-repo".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    println!(
        "clone in {:?}: {}",
        t.elapsed(),
        serde_json::to_string(&cloned).unwrap()
    );
    answers.push_str(&serde_json::to_string(&cloned).unwrap());
    assert_eq!(cloned.path, "private-repo");
    let (code, out) = sh(&cl, &id, "cat private-repo/README.md", &mut answers).await;
    assert_eq!(
        (code, out.trim()),
        (Some(0), "# private-repo: berth egress test")
    );

    // The same tools over MCP, with the official Python SDK.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/mcp_controller/client.py");
    let url = format!("{}{}", c.base, berth_protocol::routes::controller::MCP);
    let out = std::process::Command::new("timeout")
        .args([
            "300",
            "python3",
            script,
            "github",
            &url,
            berth_tests::controller::API_KEY,
        ])
        .args([id.as_str(), "acme/private-repo", "via-mcp", "acme/other"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    answers.push_str(&text);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    println!("mcp: {v}");
    let tools = v["tools"].as_array().unwrap();
    assert!(tools.iter().any(|t| t == "github_clone_repository"), "{v}");
    assert_eq!(v["repositories"]["is_error"], false, "{v}");
    assert_eq!(v["clone"]["is_error"], false, "{v}");
    assert_eq!(v["clone"]["structured"]["path"], "via-mcp", "{v}");
    let (code, _) = sh(&cl, &id, "test -f via-mcp/README.md", &mut answers).await;
    assert_eq!(code, Some(0));
    // The reads bound to the sandbox, over MCP: the cloned repository's, another refused.
    assert!(
        [
            "github_pull_requests",
            "github_pull_request",
            "github_issues",
            "github_issue"
        ]
        .iter()
        .all(|t| tools.iter().any(|x| x == t)),
        "{v}"
    );
    assert_eq!(
        v["pulls"]["structured"]["pulls"][0]["title"],
        "A pull request"
    );
    assert_eq!(
        v["issues"]["structured"]["issues"][1]["is_pull_request"],
        true
    );
    assert_eq!(
        v["issue"]["structured"]["comment_list"][0]["body"]["text"],
        "I can reproduce it."
    );
    assert_eq!(v["other"]["is_error"], true, "{v}");
    assert_eq!(
        v["other"]["structured"]["error"]["code"], "github_repository_not_cloned",
        "{v}"
    );
    github_reads(&cl, &id, &mut answers).await;

    // A push and a pull-request read of that repository carry the token; another
    // repository's requests do not.
    let push = "cd private-repo && echo change >> README.md && \
                git -c user.name=agent -c user.email=a@b commit -qam 'from the sandbox' && \
                git push -q origin main 2>&1; echo rc=$?";
    let (_, out) = sh(&cl, &id, push, &mut answers).await;
    println!("push: {out}");
    assert!(out.contains("rc=0"), "{out}");
    let log = git.sh("git --git-dir=/srv/git/acme/private-repo.git log --format=%s -1 main");
    assert_eq!(log, "from the sandbox");
    let (code, out) = sh(
        &cl,
        &id,
        "curl -sS -m 10 https://git.test/api/v3/repos/acme/private-repo/pulls",
        &mut answers,
    )
    .await;
    println!("pulls: {code:?} {out}");
    assert!(out.contains("A pull request"), "{out}");
    let other = "curl -sS -m 10 -o /dev/null -w '%{http_code}\\n' \
                 https://git.test/api/v3/repos/acme/other/pulls; \
                 GIT_TERMINAL_PROMPT=0 git ls-remote https://git.test/acme/other.git; echo rc=$?";
    let (_, out) = sh(&cl, &id, other, &mut answers).await;
    println!("another repository: {out}");
    assert!(out.starts_with("401"), "{out}");
    assert!(!out.contains("rc=0"), "{out}");

    // A credential given at create reaches its host from that sandbox alone.
    let mine = CreateSandbox {
        egress: Some(Egress::Rules(EgressRules {
            allow: vec!["creds.test".into()],
            deny_private: false,
        })),
        credentials: vec![SandboxCredential {
            host: "creds.test".into(),
            header: Some("X-Sandbox-Token".into()),
            value: Some("Sandbox {secret}".into()),
            basic_user: None,
            secret: git.api_token.clone(),
        }],
        ..berth_tests::controller::ide()
    };
    let mine = cl.create(&mine).await.unwrap();
    answers.push_str(&serde_json::to_string(&mine).unwrap());
    let whoami = "curl -sS -m 10 https://creds.test/whoami";
    let (_, out) = sh(&cl, &mine.id, whoami, &mut answers).await;
    assert_eq!(out.trim(), "authorized sandbox");
    let (_, out) = sh(&cl, &id, whoami, &mut answers).await;
    assert_eq!(out.trim(), "authorized", "another sandbox's credential");
    let views = &mine.egress.as_ref().unwrap().credentials;
    assert_eq!(views.len(), 1, "{mine:?}");
    assert_eq!(
        (views[0].host.as_str(), views[0].header.as_str()),
        ("creds.test", "X-Sandbox-Token")
    );

    // The grants outlive a controller restart (the records keep them).
    c.kill9();
    c.launch();
    let cl = c.client();
    let fetch = "cd private-repo && GIT_TERMINAL_PROMPT=0 git fetch -q origin 2>&1; echo rc=$?";
    let (_, out) = berth_tests::wait_for(
        "a fetch after the restart",
        Duration::from_secs(60),
        || async {
            let run = cl.exec(&id, &shell(fetch)).await.ok()?;
            let out = format!("{}{}", run.stdout, run.stderr);
            out.contains("rc=0").then_some((run.exit_code, out))
        },
    )
    .await;
    println!("fetch after restart: {out}");
    let (_, out) = sh(&cl, &mine.id, whoami, &mut answers).await;
    assert_eq!(out.trim(), "authorized sandbox", "after the restart");
    let record = cl.get(&id).await.unwrap();
    answers.push_str(&serde_json::to_string(&record).unwrap());
    let report = record.egress.unwrap();
    println!("record: {}", serde_json::to_string(&report).unwrap());
    assert_eq!(report.repositories, vec!["acme/private-repo".to_string()]);
    assert!(report.hosts.get("git.test") >= Some(&4), "{report:?}");
    for sb in [&id, &mine.id] {
        answers.push_str(&serde_json::to_string(&cl.events(sb, 0).await.unwrap()).unwrap());
    }
    answers.push_str(&serde_json::to_string(&cl.get(&mine.id).await.unwrap()).unwrap());

    // The secrets, searched for everywhere the sandbox and the test's answers hold.
    let basic = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{}", git.token))
    };
    // A control the scan must find: a string a process builds in its memory (its command
    // line holds only the halves).
    let marker = "berth-memory-scan-marker";
    let control = "nohup python3 -c 'import time; m = \"berth-memory-\" + \"scan-marker\"; \
                   time.sleep(300)' >/dev/null 2>&1 & echo started";
    let (code, _) = sh(&cl, &id, control, &mut answers).await;
    assert_eq!(code, Some(0));
    let needles: [&[u8]; 4] = [
        git.token.as_bytes(),
        basic.as_bytes(),
        git.api_token.as_bytes(),
        marker.as_bytes(),
    ];
    let container = format!("berth-{id}");
    let t = std::time::Instant::now();
    let files = docker(&[
        "exec",
        &container,
        "sh",
        "-c",
        &format!(
            "grep -rlaF -e '{}' -e '{}' -e '{}' / --exclude-dir=proc --exclude-dir=sys \
             --exclude-dir=dev 2>/dev/null; echo searched",
            git.token, basic, git.api_token
        ),
    ]);
    println!("files: {files:?} in {:?}", t.elapsed());
    assert_eq!(files, "searched", "the secret is in the sandbox's files");
    let (hits, procs, bytes) =
        berth_tests::wait_for("the control in memory", Duration::from_secs(20), || async {
            let (hits, procs, bytes) = scan_processes(&container, &needles);
            hits.iter()
                .any(|h| h.2 == 3)
                .then_some((hits, procs, bytes))
        })
        .await;
    println!(
        "memory: {procs} processes, {} MB read, hits {hits:?}",
        bytes >> 20
    );
    // The search's own `docker exec` above has ended; nothing but the control may be found.
    let secret_hits: Vec<_> = hits.iter().filter(|h| h.2 != 3).collect();
    assert!(
        secret_hits.is_empty(),
        "the secret is in the sandbox's processes: {secret_hits:?}"
    );
    let logs = std::process::Command::new("docker")
        .args(["logs", &container])
        .output()
        .unwrap();
    let logs = [logs.stdout, logs.stderr].concat();
    for (i, n) in needles[..3].iter().enumerate() {
        assert!(
            memchr::memmem::find(&logs, n).is_none(),
            "needle {i} in the agent's log"
        );
        assert!(
            memchr::memmem::find(answers.as_bytes(), n).is_none(),
            "needle {i} in an API answer"
        );
    }
    println!("answers searched: {} bytes", answers.len());
    // The controller's log holds no secret either.
    let log = c.log_text();
    for (i, n) in needles[..3].iter().enumerate() {
        assert!(
            memchr::memmem::find(log.as_bytes(), n).is_none(),
            "needle {i} in the controller's log"
        );
    }
    cl.delete(&id).await.unwrap();
    cl.delete(&mine.id).await.unwrap();
}

/// Pull requests and issues of the repository cloned into sandbox `id`, through the REST
/// routes: a page, a pull request whose diff is too large to answer inline (an artifact and a
/// preview), an issue with its comments; another repository and bad input refused.
async fn github_reads(cl: &ControllerClient, id: &str, answers: &mut String) {
    let repo = "acme/private-repo";
    let q = GithubListQuery {
        repository: repo.into(),
        ..Default::default()
    };
    let pulls = cl.github_pulls(id, &q).await.unwrap();
    answers.push_str(&serde_json::to_string(&pulls).unwrap());
    let numbers: Vec<u64> = pulls.pulls.iter().map(|p| p.number).collect();
    assert_eq!(numbers, [1, 3]);
    let one = GithubListQuery {
        per_page: Some(1),
        ..q.clone()
    };
    let page = cl.github_pulls(id, &one).await.unwrap();
    assert_eq!((page.pulls.len(), page.next_page), (1, Some(2)));
    let pr = cl.github_pull(id, repo, 1).await.unwrap();
    answers.push_str(&serde_json::to_string(&pr).unwrap());
    assert_eq!(
        (pr.summary.head.as_deref(), pr.summary.base.as_deref()),
        (Some("feature"), Some("main"))
    );
    assert!(pr.body.text.as_deref().unwrap().starts_with("Fixes #2."));
    assert_eq!(pr.files[0].additions, 30000);
    assert_eq!(pr.reviews[0].state.as_deref(), Some("APPROVED"));
    assert_eq!(
        (
            pr.review_comments[0].path.as_deref(),
            pr.review_comments[0].line
        ),
        (Some("big.txt"), Some(3))
    );
    // The diff: a preview and the artifact holding it whole.
    assert!(pr.diff.text.is_none(), "a large diff inline");
    let preview = pr.diff.preview.as_ref().unwrap();
    assert!(preview.head.starts_with("diff --git a/big.txt b/big.txt"));
    assert!(preview.tail.ends_with("+line 30000\n"), "{}", preview.tail);
    let href = pr.diff.href.clone().unwrap();
    let whole = cl
        .request(reqwest::Method::GET, &href)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    println!(
        "diff: {} bytes as artifact {}, preview {}+{} bytes",
        whole.len(),
        pr.diff.artifact_id.as_deref().unwrap(),
        preview.head.len(),
        preview.tail.len()
    );
    assert_eq!(whole.len() as u64, preview.bytes);
    assert_eq!(whole.lines().count(), 30005);
    assert!(whole.ends_with("+line 30000\n"));
    // Read again at the same head: the same artifact.
    let again = cl.github_pull(id, repo, 1).await.unwrap();
    assert_eq!(again.diff.artifact_id, pr.diff.artifact_id);
    let issues = cl
        .github_issues(
            id,
            &GithubListQuery {
                state: Some("all".into()),
                ..q.clone()
            },
        )
        .await
        .unwrap();
    let kinds: Vec<(u64, bool)> = issues
        .issues
        .iter()
        .map(|i| (i.number, i.is_pull_request))
        .collect();
    assert_eq!(kinds, [(2, false), (1, true)]);
    let issue = cl.github_issue(id, repo, 2).await.unwrap();
    answers.push_str(&serde_json::to_string(&issue).unwrap());
    assert_eq!(issue.summary.labels, ["bug"]);
    assert_eq!(
        issue.comment_list[0].body.text.as_deref(),
        Some("I can reproduce it.")
    );
    // Refused: a repository this sandbox did not clone (the token reads it), bad input, and a
    // pull request GitHub does not have.
    let other = GithubListQuery {
        repository: "acme/other".into(),
        ..Default::default()
    };
    let refused = |r: &str| {
        let q = other.clone();
        let r = r.to_string();
        async move {
            cl.request(reqwest::Method::GET, &r)
                .query(&q)
                .send()
                .await
                .unwrap()
        }
    };
    let base = format!("/sandbox/sandboxes/v1/{id}/github");
    for path in ["pulls", "issues", "pulls/1", "issues/2"] {
        let resp = refused(&format!("{base}/{path}")).await;
        let status = resp.status().as_u16();
        let body: serde_json::Value = resp.json().await.unwrap();
        println!("acme/other {path}: {status} {body}");
        assert_eq!(status, 403, "{path}: {body}");
        assert_eq!(body["error"]["code"], "github_repository_not_cloned");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("acme/private-repo"), "{message}");
    }
    for (path, query, want) in [
        ("pulls", "repository=acme/private-repo&state=merged", 400),
        ("pulls", "repository=acme/private-repo&per_page=500", 400),
        ("pulls", "repository=../x", 400),
        ("pulls/abc", "repository=acme/private-repo", 400),
        ("pulls/99", "repository=acme/private-repo", 404),
    ] {
        let resp = cl
            .request(reqwest::Method::GET, &format!("{base}/{path}?{query}"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), want, "{path}?{query}");
    }
}

#[tokio::test]
async fn a_clone_into_a_sandbox_whose_traffic_skips_the_proxy_is_refused_with_the_fix() {
    let image = berth_tests::controller::build_desktop_image().unwrap()["image_ref"]
        .as_str()
        .unwrap()
        .to_string();
    let git = GitHost::start(&image);
    let c = ControllerProcess::start(&config(&image, &git, 0)).await;
    let cl = c.client();
    let open = cl.create(&berth_tests::controller::ide()).await.unwrap();
    let err = cl
        .github_clone(
            &open.id,
            &GithubClone {
                repository: "acme/private-repo".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err()
        .to_string();
    println!("{err}");
    assert!(
        err.contains("409") && err.contains("egress is open"),
        "{err}"
    );
    for bad in ["acme", "acme/../x", "-x/y"] {
        let err = cl
            .github_clone(
                &open.id,
                &GithubClone {
                    repository: bad.into(),
                    ..Default::default()
                },
            )
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("400"), "{bad}: {err}");
    }
    cl.delete(&open.id).await.unwrap();
}
