#!/usr/bin/env bash
# Builds berth-agent, starts it on this machine (127.0.0.1:${PORT:-5000}) on a fresh X display
# (Xvfb) and shows it working: an OSWorld-style /execute, a native exec, a background command
# and its replayed output, input and a screenshot saved to a file. The agent then keeps running
# until Ctrl-C (or exits at once with --once).
set -euo pipefail
cd "$(dirname "$0")/.."

tests/setup.sh
cargo build -p berth-agent --bins

port="${PORT:-5000}"
base="http://127.0.0.1:$port"
work="$(mktemp -d /tmp/berth-demo.XXXXXX)"
token="demo-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
mkdir -p "$work/home"
# An X display of its own: Xvfb picks a free number and writes it to fd 3.
exec 3> "$work/display"
Xvfb -displayfd 3 -nolisten tcp -noreset -screen 0 1280x800x24 >/dev/null 2>&1 &
xvfb=$!
exec 3>&-
for _ in $(seq 1 200); do [ -s "$work/display" ] && break; sleep 0.05; done
display=":$(head -n1 "$work/display")"
BERTH_AGENT_TOKEN="$token" ./target/debug/berth-agent --display "$display" \
  --listen "127.0.0.1:$port" --state-dir "$work/state" --home "$work/home" &
agent=$!
trap 'kill -INT $agent 2>/dev/null; wait $agent 2>/dev/null; kill $xvfb 2>/dev/null; rm -rf "$work"' EXIT

for _ in $(seq 1 200); do
  curl -fsS "$base/healthz" >/dev/null 2>&1 && break
  kill -0 $agent 2>/dev/null || { echo "berth-agent did not start" >&2; exit 1; }
  sleep 0.05
done
curl -fsS "$base/healthz" >/dev/null

show() { printf '\n$ %s\n' "$*"; eval "$@"; echo; }
auth=(-H "Authorization: Bearer $token")
hdr="-H 'Authorization: Bearer $token'"

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

cat <<INFO
berth-agent is running on $base with display $display (state in $work).
  native API token: $token
  compat surface:   curl -X POST $base/execute -H 'Content-Type: application/json' -d '{"command": "ls -la", "shell": true}'
INFO
if [ "${1:-}" = "--once" ]; then
  exit 0
fi
echo "Ctrl-C stops it."
wait $agent
