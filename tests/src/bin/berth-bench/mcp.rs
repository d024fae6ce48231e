//! MCP beside the native route: a `computer` left_click answered with the settled screenshot,
//! through rmcp's client in one MCP session at `/mcp`, and the same action through
//! `POST /v1/computer` on a kept-alive connection; one agent on the benchmarks' busy 1920x1080
//! desktop, interleaved in one run. `cursor_position` (no screenshot) shows what the protocol
//! itself costs. Both clients read every answer whole and check it carries what it should.

use std::time::{Duration, Instant};

use berth_tests::{AgentOptions, AgentProcess, TOKEN};
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

use crate::desktop::Desktop;
use crate::percentiles;

/// The two ways to the agent's `computer` tool: one MCP session at `/mcp`, and
/// `POST /v1/computer` on a kept-alive connection.
struct Routes {
    mcp: RunningService<RoleClient, ()>,
    http: reqwest::Client,
    computer_url: String,
}

impl Routes {
    /// `action` as a `tools/call` of `computer`; it must not be an error.
    async fn over_mcp(&self, action: Value) -> CallToolResult {
        let r = self
            .mcp
            .call_tool(
                CallToolRequestParams::new("computer")
                    .with_arguments(action.as_object().unwrap().clone()),
            )
            .await
            .expect("tools/call");
        assert_eq!(r.is_error, Some(false), "{r:?}");
        r
    }

    /// `action` posted to `/v1/computer`; it must answer 200.
    async fn over_http(&self, action: Value) -> Value {
        let r = self
            .http
            .post(&self.computer_url)
            .bearer_auth(TOKEN)
            .json(&action)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.json::<Value>().await.unwrap()
    }

    /// A click at `point` over MCP, timed to its answer, which must be an image.
    async fn time_mcp(&self, point: [i32; 2]) -> Duration {
        let t = Instant::now();
        let r = self.over_mcp(click(point)).await;
        let took = t.elapsed();
        assert!(matches!(r.content.first(), Some(ContentBlock::Image(_))));
        took
    }

    /// A click at `point` over HTTP, timed to its answer, which must carry an image.
    async fn time_http(&self, point: [i32; 2]) -> Duration {
        let t = Instant::now();
        let r = self.over_http(click(point)).await;
        let took = t.elapsed();
        assert!(r["base64_image"].is_string());
        took
    }
}

/// A `left_click` at `point`.
fn click(point: [i32; 2]) -> Value {
    json!({"action": "left_click", "coordinate": point})
}

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
    let routes = Routes {
        mcp: ().serve(transport).await.expect("an MCP session"),
        http: reqwest::Client::new(),
        computer_url: a.url("/v1/computer"),
    };
    let (mc, hc) = time_clicks(&routes, n).await;
    let (mp, hp) = time_cursor_position(&routes, n).await;

    println!("mcp: 1920x1080 XFCE desktop, one agent, rmcp client session vs POST /v1/computer");
    println!("{:<48} {:>14} {:>18}", "", "MCP /mcp", "POST /v1/computer");
    for (what, (m50, m99), (h50, h99)) in [
        (format!("left_click + settled PNG p50/p99 ms ({n})"), mc, hc),
        (format!("cursor_position p50/p99 ms ({n})"), mp, hp),
    ] {
        println!("{what:<48} {m50:>8.2}/{m99:<5.2} {h50:>12.2}/{h99:<5.2}");
    }
    routes.mcp.cancel().await.ok();
}

/// `n` clicks each way (after 4 warm-up rounds): p50 and p99 over MCP, then over HTTP.
/// Clicks alternate between the two windows, so focus (and the screen) changes with each;
/// the two ways take turns going first and each gets both windows equally often.
async fn time_clicks(routes: &Routes, n: usize) -> ((f64, f64), (f64, f64)) {
    let points = [[400, 300], [1300, 400]];
    let (mut m, mut h) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n + 4 {
        // Each round clicks the first window, then the second.
        let (dm, dh) = if i % 2 == 0 {
            let dm = routes.time_mcp(points[0]).await;
            (dm, routes.time_http(points[1]).await)
        } else {
            let dh = routes.time_http(points[0]).await;
            (routes.time_mcp(points[1]).await, dh)
        };
        // The first rounds warm up.
        if i >= 4 {
            m.push(dm);
            h.push(dh);
        }
    }
    (percentiles(m), percentiles(h))
}

/// `n` `cursor_position` calls each way (no screenshot: what the protocol itself costs):
/// p50 and p99 over MCP, then over HTTP.
async fn time_cursor_position(routes: &Routes, n: usize) -> ((f64, f64), (f64, f64)) {
    let pos = json!({"action": "cursor_position"});
    let (mut m, mut h) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let t = Instant::now();
        routes.over_mcp(pos.clone()).await;
        m.push(t.elapsed());
        let t = Instant::now();
        routes.over_http(pos.clone()).await;
        h.push(t.elapsed());
    }
    (percentiles(m), percentiles(h))
}
