//! Workpieces on the real desktop image behind the controller (Docker), one sandbox for the
//! whole suite:
//!
//! - release parity: a deck, a sheet, a document and a PDF made, read, edited by proposals, one
//!   accepted and one rejected of each, read back by readers that did not write them, through
//!   the official MCP Python SDK (tests/workpieces/client.py); a stale proposal is a 409; a
//!   change by other means becomes a version;
//! - bad input: a path the sandbox user cannot reach, a file not of its kind, a foreign or
//!   unknown operation, too many operations, a page past the end;
//! - the editor pane in Chromium: a pending proposal's before / after, Accept changes the file;
//!   each kind open in the desktop's real editor (screenshots);
//! - `kill -9` of the controller during accepts: after each restart the workpiece has exactly
//!   the version its proposal's status says, and the file in the sandbox follows;
//! - after the sandbox's delete and another restart, versions, proposals and rendered pages are
//!   the record.

use std::time::Duration;

use berth_tests::controller::{API_KEY, ControllerProcess, Provider};
use berth_tests::{screenshot_path, wait_for};
use serde_json::{Value, json};
use sha2::Digest;

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap()
}

async fn call(method: reqwest::Method, url: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = http().request(method, url).header("x-api-key", API_KEY);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let bytes = r.bytes().await.unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn sb_url(c: &ControllerProcess, id: &str) -> String {
    format!("{}/sandbox/sandboxes/v1/{id}", c.base)
}

async fn sandbox_sha(c: &ControllerProcess, id: &str, path: &str) -> String {
    let r = http()
        .get(format!("{}/files", sb_url(c, id)))
        .query(&[("path", path)])
        .header("x-api-key", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{path}");
    hex(&sha2::Sha256::digest(r.bytes().await.unwrap()))
}

/// How many distinct colours a screenshot holds below the panel (every third pixel): a window
/// still blank holds a handful, a drawn editor hundreds.
fn colours_below_panel(png: &[u8]) -> usize {
    let img = berth_tests::x::decode_png(png);
    let mut seen = std::collections::HashSet::new();
    for y in (60..img.1.saturating_sub(60)).step_by(3) {
        for x in (0..img.0).step_by(3) {
            seen.insert(berth_tests::x::pixel(&img, x, y));
        }
    }
    seen.len()
}

/// How many pixels two screenshots of one size differ in.
fn differing_pixels(a: &[u8], b: &[u8]) -> usize {
    let (a, b) = (berth_tests::x::decode_png(a), berth_tests::x::decode_png(b));
    if (a.0, a.1) != (b.0, b.1) {
        return usize::MAX;
    }
    a.2.chunks(3)
        .zip(b.2.chunks(3))
        .filter(|(p, q)| p != q)
        .count()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Chromium opens the session view, waits for the editor pane to show the pending proposal with
/// its before / after pages drawn, saves a screenshot, clicks Accept and waits for `accepted`.
const PANE_PY: &str = r##"
import json, sys
from playwright.sync_api import sync_playwright
url, wid, pid, shot = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
out = {}
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_function("() => window.berthSession.workpieces && window.berthSession.workpieces.list.length > 0", timeout=60000)
    page.select_option("#wp-select", wid)
    item = f".proposal[data-id='{pid}']"
    page.wait_for_selector(item + "[data-status=pending]", timeout=60000)
    # Before and after drawn: every page image of the proposal loaded with a size.
    page.wait_for_function("""(sel) => {
        const imgs = [...document.querySelectorAll(sel + ' .compare img')];
        return imgs.length >= 2 && imgs.every(i => i.complete && i.naturalWidth > 0);
    }""", arg=item, timeout=60000)
    out["ops"] = page.eval_on_selector_all(item + " .ops li", "els => els.map(e => e.textContent)")
    out["images"] = page.eval_on_selector_all(item + " .compare img", "els => els.map(e => [e.naturalWidth, e.naturalHeight])")
    # The version's own cells are drawn once their content has loaded: wait for them.
    page.wait_for_selector("#wp-view .sheet-table td", timeout=60000)
    out["table"] = page.eval_on_selector_all("#wp-view .sheet-table td", "els => els.map(e => e.textContent)")
    # A sheet's before / after as cells, the changed one marked.
    page.wait_for_selector(item + " .sheet-table td.changed", timeout=60000)
    out["changed"] = page.eval_on_selector_all(item + " .sheet-table td.changed", "els => els.map(e => e.textContent)")
    page.screenshot(path=shot, full_page=True)
    page.click(item + " button.accept")
    page.wait_for_selector(item + "[data-status=accepted]", timeout=60000)
    out["note"] = page.inner_text("#editor-note")
    out["errors"] = errors
    browser.close()
print(json.dumps(out))
"##;

#[tokio::test]
async fn four_kinds_are_made_proposed_reviewed_and_kept_through_mcp_rest_and_the_editor_pane() {
    let mut c = ControllerProcess::start_on(Provider::Docker, "").await;
    let cl = c.client();
    let sb = cl
        .create(&berth_tests::controller::desktop())
        .await
        .unwrap();
    let id = sb.id.clone();
    let tmp = tempfile::tempdir().unwrap();

    // Release parity, through the MCP Python SDK.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/workpieces/client.py");
    let (base, sid) = (c.base.clone(), id.clone());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("timeout")
            .args(["400", "python3", script, &base, API_KEY, &sid])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "client.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    println!("{}", serde_json::to_string_pretty(&seen).unwrap());
    assert_eq!(
        seen["tools"],
        json!([
            "workpiece_create",
            "workpiece_list",
            "workpiece_proposal",
            "workpiece_proposals",
            "workpiece_propose",
            "workpiece_read"
        ]),
        "the model proposes; accepting is a person's act, not a tool"
    );
    for kind in ["sheet", "document", "deck", "pdf"] {
        let k = &seen[kind];
        assert_eq!(k["accept_stale"][0], 409, "{kind}: {k}");
        let m = k["accept_stale"][1].as_str().unwrap();
        assert!(m.contains("version 1") && m.contains("version 2"), "{m}");
        assert_eq!(k["stale"]["code"], "conflict", "{kind}");
        assert_eq!(k["proposal"], "accepted");
        assert_eq!(k["proposals"], json!(["rejected", "rejected", "accepted"]));
        let versions = k["versions"].as_array().unwrap();
        assert_eq!(versions.len(), 2, "{kind}: {versions:?}");
        assert_eq!(versions[1][1], "proposal");
        assert!(versions[1][2].as_u64().unwrap() >= 1, "{kind}: rendered");
    }
    let bad = &seen["bad"];
    assert!(
        bad["missing_sheet"]["message"]
            .as_str()
            .unwrap()
            .contains("Nope"),
        "{bad}"
    );
    assert!(
        bad["bad_formula"]["message"]
            .as_str()
            .unwrap()
            .contains("NOSUCHFN"),
        "{bad}"
    );
    assert!(
        bad["foreign_op"]["message"]
            .as_str()
            .unwrap()
            .contains("delete_slide"),
        "{bad}"
    );
    let hand = seen["hand_change"].as_array().unwrap();
    assert_eq!(hand.len(), 3, "{hand:?}");
    assert_eq!(
        hand[2],
        json!([3, "sandbox", true]),
        "a change by other means is a version"
    );
    assert_eq!(
        seen["events"],
        json!([
            "workpiece.accepted",
            "workpiece.created",
            "workpiece.proposed",
            "workpiece.rejected",
            "workpiece.version"
        ])
    );

    // The book's example (the Workpieces chapter), as written.
    let example = berth_tests::readme::block(
        berth_tests::readme::chapter("controller/workpieces.md"),
        "python",
        Some("workpieces-mcp"),
    );
    let (base, sid) = (c.base.clone(), id.clone());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("timeout")
            .args(["300", "python3", "-c", &example])
            .env("SANDBOX_GATEWAY_URL", base)
            .env("SANDBOX_API_KEY", API_KEY)
            .env("ID", sid)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the chapter's block: {printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let words: Vec<&str> = printed.split_whitespace().collect();
    assert_eq!(words.len(), 4, "{printed}");
    assert_eq!(words[0], "pending", "{printed}");
    assert!(words[1].parse::<u32>().unwrap() >= 1, "{printed}");
    let accept = format!(
        "{}/workpieces/{}/proposals/{}/accept",
        sb_url(&c, &id),
        words[3],
        words[2]
    );
    let (s, v) = call(reqwest::Method::POST, &accept, None).await;
    assert_eq!((s, v["status"].as_str()), (200, Some("accepted")), "{v}");

    // Bad input: clear 4xx, nothing made.
    let wps = |c: &ControllerProcess| format!("{}/workpieces", sb_url(c, &id));
    let post = reqwest::Method::POST;
    for (body, status, says) in [
        (
            json!({"kind": "sheet", "path": "/root/secret.xlsx"}),
            422,
            "cannot reach",
        ),
        (
            json!({"kind": "document", "path": "~/work/x.pdf"}),
            400,
            ".docx, .odt",
        ),
        (json!({"path": "~/work/y.xlsx"}), 400, "kind"),
        (
            json!({"kind": "sheet", "path": "~/work/budget.xlsx"}),
            409,
            "budget.xlsx",
        ),
        (
            json!({"kind": "deck", "path": "~/nowhere/z.pptx"}),
            404,
            "nowhere",
        ),
    ] {
        let (s, v) = call(post.clone(), &wps(&c), Some(body.clone())).await;
        assert_eq!(s, status, "{body}: {v}");
        assert!(v.to_string().contains(says), "{body}: {v}");
    }
    // A text file named .docx is no document.
    let r = http()
        .put(format!("{}/files", sb_url(&c, &id)))
        .query(&[("path", "/home/user/work/notes.docx")])
        .header("x-api-key", API_KEY)
        .body("just text")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let (s, v) = call(
        post.clone(),
        &wps(&c),
        Some(json!({"kind": "document", "path": "~/work/notes.docx", "existing": true})),
    )
    .await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["error"]["code"], "invalid_request", "{v}");
    let (_, list) = call(reqwest::Method::GET, &wps(&c), None).await;
    let list = list["workpieces"].as_array().unwrap().clone();
    assert_eq!(list.len(), 5, "nothing made by the refusals");
    let find = |kind: &str| {
        list.iter()
            .find(|w| w["kind"] == kind && w["path"] != "/home/user/q4.xlsx")
            .cloned()
            .unwrap_or_else(|| panic!("no {kind}"))
    };
    let sheet = find("sheet");
    let swid = sheet["id"].as_str().unwrap().to_string();
    let latest = sheet["latest_version"].as_u64().unwrap();
    let props = |c: &ControllerProcess| format!("{}/{swid}/proposals", wps(c));
    for (ops, says) in [
        (
            json!([{"op": "explode"}]),
            "\"explode\" is no operation of a sheet",
        ),
        (
            Value::Array(vec![json!({"op": "add_sheet", "name": "x"}); 501]),
            "at most 500",
        ),
        (
            json!([{"op": "set_cells", "sheet": "Sheet1", "range": "A1", "values": [[1]], "extra": 1}]),
            "unknown field",
        ),
    ] {
        let body = json!({"base_version": latest, "summary": "bad", "operations": ops});
        let (s, v) = call(post.clone(), &props(&c), Some(body)).await;
        assert_eq!(s, 400, "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(says),
            "{v}"
        );
    }
    let (s, v) = call(
        reqwest::Method::GET,
        &format!("{}/{swid}/content?page=9", wps(&c)),
        None,
    )
    .await;
    assert_eq!(s, 400, "{v}");

    // Each kind open in the desktop's real editor.
    for (kind, name) in [
        ("deck", "workpiece-deck-impress.png"),
        ("sheet", "workpiece-sheet-calc.png"),
        ("document", "workpiece-document-writer.png"),
        ("pdf", "workpiece-pdf-evince.png"),
    ] {
        let w = find(kind);
        let wid = w["id"].as_str().unwrap();
        let file = w["path"]
            .as_str()
            .unwrap()
            .rsplit('/')
            .next()
            .unwrap()
            .to_string();
        let (s, v) = call(post.clone(), &format!("{}/{wid}/open", wps(&c)), None).await;
        assert_eq!(s, 200, "{kind}: {v}");
        let windows = format!("{}/v1/windows", sb_url(&c, &id));
        let stem = file.split('.').next().unwrap().to_string();
        wait_for(
            &format!("{file} in a window"),
            Duration::from_secs(90),
            || async {
                let (_, v) = call(reqwest::Method::GET, &windows, None).await;
                v.to_string().contains(&stem).then_some(())
            },
        )
        .await;
        // The editor has drawn its document (LibreOffice maps its window before it paints, and
        // its toolbars after the page): the screen below the panel holds a real UI's colours
        // and has not changed for 2 s but for a blinking caret.
        let shot = screenshot_path(name, tmp.path());
        let shots = format!("{}/screenshot", sb_url(&c, &id));
        let grab = || async {
            http()
                .get(&shots)
                .header("x-api-key", API_KEY)
                .send()
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap()
                .to_vec()
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        let mut png = grab().await;
        let mut since = std::time::Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let next = grab().await;
            let colours = colours_below_panel(&next);
            if differing_pixels(&next, &png) > 400 || colours < 40 {
                png = next;
                since = std::time::Instant::now();
            } else if since.elapsed() >= Duration::from_secs(2) {
                println!("{kind}: {colours} colours drawn, still for 2 s");
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{kind}'s editor never drew its document and settled ({colours} colours)"
            );
        }
        std::fs::write(&shot, &png).unwrap();
        println!("{kind} open in its editor: {}", shot.display());
    }

    // The editor pane in Chromium: a pending proposal, its pages, Accept.
    let body = json!({"base_version": latest, "summary": "Groceries up", "operations": [
        {"op": "set_cells", "sheet": "Sheet1", "range": "B3", "values": [[450]]}]});
    let (s, p) = call(post.clone(), &props(&c), Some(body)).await;
    assert_eq!(s, 201, "{p}");
    let pid = p["id"].as_str().unwrap().to_string();
    let url = c.client().session(&id).await.unwrap().url;
    let shot = screenshot_path("workpiece-editor-pane.png", tmp.path());
    let args = [url, swid.clone(), pid.clone(), shot.display().to_string()];
    let pane = tokio::task::spawn_blocking(move || {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        berth_tests::playwright(PANE_PY, &a, 240)
    })
    .await
    .unwrap();
    let pane: Value = serde_json::from_str(&pane).unwrap();
    println!("{pane}");
    assert_eq!(pane["errors"], json!([]), "{pane}");
    assert!(
        pane["ops"][0].as_str().unwrap().contains("set_cells"),
        "{pane}"
    );
    // The latest version is the sandbox's (version 1's bytes put back by hand): its one cell.
    assert_eq!(
        pane["table"],
        json!(["Budget"]),
        "the sheet as a table: {pane}"
    );
    let (_, w) = call(reqwest::Method::GET, &format!("{}/{swid}", wps(&c)), None).await;
    let v = w["versions"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(v["author"], "proposal", "{w}");
    assert_eq!(v["proposal"], pid.as_str());
    assert_eq!(
        sandbox_sha(&c, &id, "/home/user/work/budget.xlsx").await,
        v["sha256"]
    );

    // kill -9 of the controller during accepts.
    let mut outcomes = (0, 0);
    for round in 0..3u64 {
        let (_, w) = call(reqwest::Method::GET, &format!("{}/{swid}", wps(&c)), None).await;
        let before = w["latest_version"].as_u64().unwrap();
        let body = json!({"base_version": before, "summary": format!("round {round}"), "operations": [
            {"op": "set_cells", "sheet": "Sheet1", "range": "D1", "values": [[round as i64]]}]});
        let (s, p) = call(post.clone(), &props(&c), Some(body)).await;
        assert_eq!(s, 201, "{p}");
        let pid = p["id"].as_str().unwrap().to_string();
        let accept = format!("{}/{pid}/accept", props(&c));
        // The client loses its answer when the controller dies: not an error here.
        let req = tokio::spawn(async move {
            http()
                .post(&accept)
                .header("x-api-key", API_KEY)
                .send()
                .await
                .map(|r| r.status().as_u16())
        });
        // Fault injection, not synchronisation: 0, 150 and 300 ms into the accept.
        tokio::time::sleep(Duration::from_millis(round * 150)).await;
        c.kill9();
        let _ = req.await;
        c.launch();
        wait_for(
            "the restarted controller",
            Duration::from_secs(60),
            || async {
                let (s, _) = call(reqwest::Method::GET, &sb_url(&c, &id), None).await;
                (s == 200).then_some(())
            },
        )
        .await;
        let (_, p) = call(reqwest::Method::GET, &format!("{}/{pid}", props(&c)), None).await;
        let (_, w) = call(reqwest::Method::GET, &format!("{}/{swid}", wps(&c)), None).await;
        let versions = w["versions"].as_array().unwrap();
        match p["status"].as_str().unwrap() {
            "accepted" => {
                outcomes.1 += 1;
                assert_eq!(versions.len() as u64, before + 1, "{w}");
                assert_eq!(versions.last().unwrap()["proposal"], pid.as_str());
                assert_eq!(p["result_version"], before + 1);
            }
            "pending" => {
                outcomes.0 += 1;
                assert_eq!(versions.len() as u64, before, "{w}");
                let (s, p) = call(
                    reqwest::Method::POST,
                    &format!("{}/{pid}/accept", props(&c)),
                    None,
                )
                .await;
                assert_eq!(s, 200, "{p}");
            }
            other => panic!("round {round}: {other}: {p}"),
        }
        // The file in the sandbox follows the latest version (put in place by the accept or
        // by the restarted controller's sweep).
        let (_, w) = call(reqwest::Method::GET, &format!("{}/{swid}", wps(&c)), None).await;
        let want = w["versions"].as_array().unwrap().last().unwrap()["sha256"].clone();
        wait_for(
            "the accepted file in place",
            Duration::from_secs(60),
            || async {
                (sandbox_sha(&c, &id, "/home/user/work/budget.xlsx").await == want).then_some(())
            },
        )
        .await;
    }
    println!(
        "kill -9 during accept: {} found pending, {} found accepted",
        outcomes.0, outcomes.1
    );

    // After the sandbox: the record, across another restart. A change made just before the
    // delete (the deck put back to its first version by hand) is kept as its last version.
    let (_, before_delete) = call(reqwest::Method::GET, &wps(&c), None).await;
    let deck = find("deck");
    let v1 = &deck["versions"][0];
    let r = http()
        .get(format!(
            "{}/sandbox/v1/artifacts/{}",
            c.base,
            v1["artifact_id"].as_str().unwrap()
        ))
        .header("x-api-key", API_KEY)
        .send()
        .await
        .unwrap();
    let first = r.bytes().await.unwrap();
    let r = http()
        .put(format!("{}/files", sb_url(&c, &id)))
        .query(&[("path", deck["path"].as_str().unwrap())])
        .header("x-api-key", API_KEY)
        .body(first)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    cl_delete(&c, &id).await;
    c.kill9();
    c.launch();
    let (s, after) = call(reqwest::Method::GET, &wps(&c), None).await;
    assert_eq!(s, 200, "{after}");
    let versions = |v: &Value| -> Vec<Value> {
        v["workpieces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["versions"].clone())
            .collect()
    };
    let kept = versions(&after);
    let was = versions(&before_delete);
    for (i, w) in after["workpieces"].as_array().unwrap().iter().enumerate() {
        if w["id"] != deck["id"] {
            assert_eq!(kept[i], was[i], "{w}");
            continue;
        }
        let v = kept[i].as_array().unwrap();
        assert_eq!(v.len(), was[i].as_array().unwrap().len() + 1, "{w}");
        let last = v.last().unwrap();
        assert_eq!(
            (&last["author"], &last["sha256"]),
            (&json!("sandbox"), &v1["sha256"])
        );
    }
    assert!(
        after["workpieces"]
            .as_array()
            .unwrap()
            .iter()
            .all(|w| w["record"] == true)
    );
    let r = http()
        .get(format!("{}/{swid}/versions/1/pages/1", wps(&c)))
        .header("x-api-key", API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.bytes().await.unwrap().starts_with(b"\x89PNG"));
    let (s, content) = call(
        reqwest::Method::GET,
        &format!("{}/{swid}/content?version=1", wps(&c)),
        None,
    )
    .await;
    assert_eq!(s, 200, "{content}");
    assert_eq!(content["record"], true);
    let (_, props_after) = call(reqwest::Method::GET, &props(&c), None).await;
    assert!(
        props_after["proposals"].as_array().unwrap().len() >= 6,
        "{props_after}"
    );
}

async fn cl_delete(c: &ControllerProcess, id: &str) {
    let (s, v) = call(reqwest::Method::DELETE, &sb_url(c, id), None).await;
    assert_eq!(s, 200, "{v}");
}
