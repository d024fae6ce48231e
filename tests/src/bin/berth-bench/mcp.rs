//! MCP beside the native route: a `computer` left_click answered with the settled screenshot,
//! through rmcp's client in one MCP session at `/mcp`, and the same action through
//! `POST /v1/computer` on a kept-alive connection; one agent on the benchmarks' busy 1920x1080
//! desktop, interleaved in one run. `cursor_position` (no screenshot) shows what the protocol
//! itself costs. Both clients read every answer whole and check it carries what it should.

use std::time::{Duration, Instant};

use berth_tests::{AgentOptions, AgentProcess, TOKEN};
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, ContentBlock};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

use crate::desktop::Desktop;
use crate::percentiles;

pub async fn bench(n: usize) {
    let desk = Desktop::start();
    let a = AgentProcess::start_with(AgentOptions {
        extra_args: vec!["--display".into(), desk.x.display.clone()],
        ..Default::default()
    })
    .await;
    // Let the desktop finish drawing before measuring (as the display benchmark does).
    tokio::time::sleep(Duration::from_secs(3)).await;

    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(a.url("/mcp")).auth_header(TOKEN),
    );
    let mcp = ().serve(transport).await.expect("an MCP session");
    let http = reqwest::Client::new();
    let computer_url = a.url("/v1/computer");

    // Clicks alternate between the two windows, so focus (and the screen) changes with each;
    // the two ways take turns going first and each gets both windows equally often.
    let points = [[400, 300], [1300, 400]];
    let over_mcp = |action: Value| {
        let mcp = &mcp;
        async move {
            let r = mcp
                .call_tool(
                    CallToolRequestParams::new("computer")
                        .with_arguments(action.as_object().unwrap().clone()),
                )
                .await
                .expect("tools/call");
            assert_eq!(r.is_error, Some(false), "{r:?}");
            r
        }
    };
    let over_http = |action: Value| {
        let http = &http;
        let url = &computer_url;
        async move {
            let r = http
                .post(url)
                .bearer_auth(TOKEN)
                .json(&action)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            r.json::<Value>().await.unwrap()
        }
    };
    let click = |p: usize| json!({"action": "left_click", "coordinate": points[p]});
    let time_mcp = |p: usize| async move {
        let t = Instant::now();
        let r = over_mcp(click(p)).await;
        let took = t.elapsed();
        assert!(matches!(r.content.first(), Some(ContentBlock::Image(_))));
        took
    };
    let time_http = |p: usize| async move {
        let t = Instant::now();
        let r = over_http(click(p)).await;
        let took = t.elapsed();
        assert!(r["base64_image"].is_string());
        took
    };
    let (mut m, mut h) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n + 4 {
        // Each round clicks the first window, then the second.
        let (dm, dh) = if i % 2 == 0 {
            let dm = time_mcp(0).await;
            (dm, time_http(1).await)
        } else {
            let dh = time_http(0).await;
            (time_mcp(1).await, dh)
        };
        // The first rounds warm up.
        if i >= 4 {
            m.push(dm);
            h.push(dh);
        }
    }
    let (mc, hc) = (percentiles(m), percentiles(h));

    let pos = json!({"action": "cursor_position"});
    let (mut m, mut h) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let t = Instant::now();
        over_mcp(pos.clone()).await;
        m.push(t.elapsed());
        let t = Instant::now();
        over_http(pos.clone()).await;
        h.push(t.elapsed());
    }
    let (mp, hp) = (percentiles(m), percentiles(h));

    println!("mcp: 1920x1080 XFCE desktop, one agent, rmcp client session vs POST /v1/computer");
    println!("{:<48} {:>14} {:>18}", "", "MCP /mcp", "POST /v1/computer");
    for (what, (m50, m99), (h50, h99)) in [
        (format!("left_click + settled PNG p50/p99 ms ({n})"), mc, hc),
        (format!("cursor_position p50/p99 ms ({n})"), mp, hp),
    ] {
        println!("{what:<48} {m50:>8.2}/{m99:<5.2} {h50:>12.2}/{h99:<5.2}");
    }
    mcp.cancel().await.ok();
}
