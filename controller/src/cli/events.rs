//! `berth sandbox events`: a sandbox's timeline (`GET /sandbox/sandboxes/v1/{id}/events`), the
//! controller's events and the agent's in one sequence, and with `--follow` the new ones as they
//! come.

use std::time::Duration;

use berth_protocol::controller::ControllerClient;
use berth_protocol::lifecycle::SandboxStatus;
use clap::Args;
use serde_json::Value;

use super::Remote;
use super::through::Through;

#[derive(Args, Debug)]
#[command(after_help = "\
Text output: one line per event, `SEQ AT KIND {other fields}`. With --json: one JSON object per \
line, as the controller stores it (`seq`, `at`, `kind` and the event's own fields).

--follow wakes on the agent's own event stream (a long-poll through the controller), so an \
agent event shows within moments; the controller's own events (status changes) within a few \
seconds. It stops at Ctrl-C, or once the sandbox has stopped or failed (after its last events).")]
pub struct EventsArgs {
    /// The sandbox's id.
    pub id: String,
    /// Keep printing new events until Ctrl-C.
    #[arg(short, long)]
    pub follow: bool,
    /// Start at this sequence number (default: the first kept).
    #[arg(long, default_value_t = 0)]
    pub from_seq: u64,
    #[command(flatten)]
    pub remote: Remote,
}

/// How long one wait on the agent's events lasts before the timeline is read again (what
/// bounds the delay of controller-only events).
const WAKE: Duration = Duration::from_secs(3);

pub async fn run(a: EventsArgs) -> anyhow::Result<i32> {
    let client = ControllerClient::new(a.remote.url(), a.remote.key());
    let through = Through::new(&a.remote, &a.id);
    let mut from = a.from_seq;
    // The agent's next sequence number, learnt from the imported events (`agent_seq`).
    let mut agent_next = 0u64;
    let stop = tokio::signal::ctrl_c();
    tokio::pin!(stop);
    // Set once the sandbox has ended: one last read, then the follow ends too.
    let mut ended: Option<String> = None;
    loop {
        let page = client.events(&a.id, from).await?;
        let events = page["events"].as_array().cloned().unwrap_or_default();
        for e in &events {
            print_event(e, a.remote.json);
            if let Some(s) = e["agent_seq"].as_u64() {
                agent_next = agent_next.max(s + 1);
            }
        }
        from = page["next_seq"].as_u64().unwrap_or(from).max(from);
        if !a.follow {
            return Ok(0);
        }
        if let Some(status) = &ended {
            if !a.remote.json {
                eprintln!("sandbox {} is {status}: no more events", a.id);
            }
            return Ok(0);
        }
        if !events.is_empty() && events.len() >= 10_000 {
            continue;
        }
        tokio::select! {
            _ = &mut stop => return Ok(0),
            next = wait_for_agent(&through, agent_next) => {
                match next {
                    Some(n) => agent_next = agent_next.max(n),
                    // The agent is not reachable: has the sandbox ended?
                    None => match client.get(&a.id).await {
                        Ok(sb) if !sb.status.live() && sb.status != SandboxStatus::Stopping => {
                            ended = Some(sb.status.to_string());
                        }
                        Ok(_) => {}
                        Err(e) if e.status() == Some(404) => ended = Some("gone".into()),
                        Err(_) => {}
                    },
                }
            }
        }
    }
}

/// Returns when the agent has an event at or past `from` (a long-poll), or after [`WAKE`], with
/// the agent's next sequence number; an agent that cannot be reached is simply waited out.
async fn wait_for_agent(through: &Through, from: u64) -> Option<u64> {
    let started = tokio::time::Instant::now();
    let wait = through.agent().events_wait(from, WAKE);
    if let Ok(Ok(page)) = tokio::time::timeout(WAKE + Duration::from_secs(5), wait).await {
        return Some(page.next_seq);
    }
    tokio::time::sleep_until(started + WAKE).await;
    None
}

fn print_event(e: &Value, json: bool) {
    if json {
        println!("{e}");
        return;
    }
    let mut rest = e.as_object().cloned().unwrap_or_default();
    let seq = rest.remove("seq").unwrap_or(Value::Null);
    let at = rest.remove("at");
    let kind = rest.remove("kind");
    let text = |v: Option<Value>| match v {
        Some(Value::String(s)) => s,
        Some(v) => v.to_string(),
        None => String::new(),
    };
    let rest = match rest.is_empty() {
        true => String::new(),
        false => Value::Object(rest).to_string(),
    };
    println!("{seq:>5} {} {} {rest}", text(at), text(kind))
}
