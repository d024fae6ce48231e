#!/usr/bin/env bash
# Builds berth-agent and starts it on this machine (127.0.0.1:${PORT:-5000}) with its desktop
# (Xvnc, XFCE, Chromium, supervised by the agent), waits until it is strictly ready and shows it
# working: an OSWorld-style /execute, a native exec, a background command and its replayed
# output, input, a screenshot saved to a file, and a one-time noVNC viewer URL. The agent then
# keeps running until Ctrl-C (or exits at once with --once).
set -euo pipefail
cd "$(dirname "$0")/.."

tests/setup.sh
cargo build -p berth-agent --bins

port="${PORT:-5000}"
base="http://127.0.0.1:$port"
work="$(mktemp -d /tmp/berth-demo.XXXXXX)"
token="demo-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
mkdir -p "$work/home"
BERTH_AGENT_TOKEN="$token" ./target/debug/berth-agent --desktop --screen 1280x800 \
  --listen "127.0.0.1:$port" --cdp-listen "127.0.0.1:${CDP_PORT:-9222}" \
  --state-dir "$work/state" --home "$work/home" &
agent=$!
trap 'kill -INT $agent 2>/dev/null; wait $agent 2>/dev/null; rm -rf "$work"' EXIT

for _ in $(seq 1 200); do
  curl -fsS "$base/healthz" >/dev/null 2>&1 && break
  kill -0 $agent 2>/dev/null || { echo "berth-agent did not start" >&2; exit 1; }
  sleep 0.05
done
curl -fsS "$base/healthz" >/dev/null

show() { printf '\n$ %s\n' "$*"; eval "$@"; echo; }
auth=(-H "Authorization: Bearer $token")
hdr="-H 'Authorization: Bearer $token'"

# Strict readiness: the viewer, the window manager and panel, the browser and both CDP relays.
show "curl -sS '$base/v1/ready?wait=60s' $hdr | python3 -c 'import json,sys; r=json.load(sys.stdin); print(\"ready:\", r[\"ready\"]); [print(\" \", k, v[\"state\"], v[\"reason\"]) for k, v in sorted(r[\"components\"].items())]'"
curl -fsS "$base/v1/ready" "${auth[@]}" >/dev/null || { echo "the desktop did not become ready" >&2; exit 1; }
display=$(curl -sS "$base/v1/display" "${auth[@]}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["display"])')
show "curl -sS -X POST $base/execute -H 'Content-Type: application/json' -d '{\"command\": [\"uname\", \"-sr\"]}'"
show "curl -sS -X POST $base/v1/exec $hdr -d '{\"shell\": \"echo hello from \$USER in \$PWD\"}'"
id=$(curl -sS -X POST "$base/v1/exec" "${auth[@]}" \
  -d '{"shell": "for i in 1 2 3; do echo tick $i; sleep 0.2; done", "background": true}' |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
echo "started background command $id"
show "curl -sS '$base/v1/commands/$id/output?from_seq=0&follow=true' -H 'Accept: text/event-stream' $hdr"
show "curl -sS $base/v1/commands/$id $hdr"
show "curl -sS -X POST $base/v1/input $hdr -d '{\"actions\": [{\"type\": \"move\", \"x\": 640, \"y\": 400}, {\"type\": \"click\"}]}'"
shot="$PWD/berth-demo-screenshot.png"
curl -sS "$base/screenshot" -o "$shot"
echo "screenshot of $display saved to $shot ($(stat -c %s "$shot") bytes)"

viewer=$(curl -sS -X POST "$base/v1/viewer-tokens" "${auth[@]}" -d '{"ttl_seconds": 600, "view_only": false}' |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["url"])')
cat <<INFO
berth-agent is running on $base with its desktop on display $display (state in $work).
  viewer (noVNC, one-time URL, 10 min): $base$viewer
  browser over CDP: http://127.0.0.1:${CDP_PORT:-9222} (GET $base/v1/browser for more)
  native API token: $token
  compat surface:   curl -X POST $base/execute -H 'Content-Type: application/json' -d '{"command": "ls -la", "shell": true}'
INFO
if [ "${1:-}" = "--once" ]; then
  exit 0
fi
echo "Ctrl-C stops it."
wait $agent
