#!/usr/bin/env bash
# The kubernetes provider's checks against a REAL cluster — the ones the test suite runs
# against its in-process fake API server (tests/tests/kubernetes_fake_apiserver.rs and the
# `kubernetes_fake_apiserver::` cases of tests/tests/controller.rs). Not run in CI: no cluster
# runs on the build machines.
#
# Needs: KUBECONFIG (a context allowed to make Pods, Secrets, ConfigMaps, NetworkPolicies and
# port-forwards in the namespace: deploy/kubernetes's Role), kubectl, curl, python3, and an
# image the cluster can pull, pushed with `berth image push --registry HOST/PATH`:
#
#   KUBECONFIG=~/.kube/config BERTH_K8S_IMAGE=registry.example:5000/berth/desktop:TAG \
#     tests/kubernetes/verify.sh
#
# Optional: BERTH_K8S_NAMESPACE (default: a fresh berth-verify-<random>, deleted at the end
# unless BERTH_K8S_KEEP=1), BERTH_K8S_REACH (default port-forward: this script runs outside
# the cluster), BERTH (the berth binary; default target/debug/berth, built when missing).
#
# It runs `berth serve` here with every profile on `kubernetes`, then checks, with kubectl
# as the witness: a create makes one Pod, one Secret and one NetworkPolicy, labelled, owned
# (Pod → the controller's ConfigMap; Secret and NetworkPolicy → the Pod), the token only in
# the Secret (never in the Pod spec), /dev/shm a memory emptyDir, requests/limits set; a
# command runs; a kill -9 of the controller and a restart adopt the sandbox (a list by
# label); a Pod deleted behind the controller's back marks the sandbox failed; a
# delete leaves nothing; a pool of 2 fills with Pods and drains when resized to 0; deleting
# the owner ConfigMap garbage-collects every Pod left.
set -euo pipefail
cd "$(dirname "$0")/../.."

: "${KUBECONFIG:?set KUBECONFIG to the cluster to verify against}"
: "${BERTH_K8S_IMAGE:?set BERTH_K8S_IMAGE to an image the cluster pulls (berth image push)}"
export KUBECONFIG
NS="${BERTH_K8S_NAMESPACE:-berth-verify-$(head -c4 /dev/urandom | od -An -tx1 | tr -d ' \n')}"
REACH="${BERTH_K8S_REACH:-port-forward}"
BERTH="${BERTH:-target/debug/berth}"
KEY="verify-key-$(head -c8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
WORK="$(mktemp -d)"
SERVE_PID=""

for tool in kubectl curl python3; do
    command -v "$tool" >/dev/null || { echo "verify: $tool is required" >&2; exit 2; }
done
[ -x "$BERTH" ] || cargo build -p berth-controller --bin berth
kubectl version >/dev/null || { echo "verify: the cluster does not answer" >&2; exit 2; }

pass=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
fail() { echo "FAIL $*" >&2; echo "--- controller log (tail)" >&2; tail -n 40 "$WORK/serve.log" >&2 || true; exit 1; }
k() { kubectl -n "$NS" "$@"; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
api() { curl -fsS -H "X-Api-Key: $KEY" "$@"; }

cleanup() {
    [ -n "$SERVE_PID" ] && kill -9 "$SERVE_PID" 2>/dev/null || true
    if [ -z "${BERTH_K8S_NAMESPACE:-}" ] && [ "${BERTH_K8S_KEEP:-0}" != 1 ]; then
        kubectl delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

# Waits up to $1 seconds for the command after it to succeed.
wait_for() {
    local deadline=$(( $(date +%s) + $1 )); shift
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        sleep 1
    done
}

kubectl get namespace "$NS" >/dev/null 2>&1 || kubectl create namespace "$NS" >/dev/null
cat >"$WORK/berth.toml" <<EOF
reconcile_interval_secs = 1.0
orphan_grace_secs = 0
[[pools]]
profile = "ide"
size = 0
[providers]
ide = "kubernetes"
desktop = "kubernetes"
[kubernetes]
namespace = "$NS"
image = "$BERTH_K8S_IMAGE"
reach = "$REACH"
EOF

serve() {
    BERTH_API_KEYS="$KEY" BERTH_LOG=info "$BERTH" serve --listen 127.0.0.1:0 \
        --data-dir "$WORK/data" --config "$WORK/berth.toml" >"$WORK/serve.out" 2>>"$WORK/serve.log" &
    SERVE_PID=$!
    wait_for 120 grep -q "berth serving on" "$WORK/serve.out" || fail "berth serve did not start"
    URL="$(sed -n 's/^berth serving on //p' "$WORK/serve.out" | tail -n1)"
    CID="$(sed -n 's/^controller id //p' "$WORK/serve.out" | tail -n1)"
    export BERTH_URL="$URL" BERTH_API_KEY="$KEY"
}
serve
ok "berth serve on $URL (controller $CID, namespace $NS, reach $REACH)"

# The owner ConfigMap, made or adopted at start.
OWNER="$(k get configmap -l "berth.controller=$CID" -o jsonpath='{.items[0].metadata.name}')"
[ -n "$OWNER" ] || fail "no owner ConfigMap labelled berth.controller=$CID"
OWNER_UID="$(k get configmap "$OWNER" -o jsonpath='{.metadata.uid}')"
ok "owner ConfigMap $OWNER"

# A create: one Pod, one Secret, one NetworkPolicy.
SB="$("$BERTH" sandbox create --profile ide --json | json 'd["id"]')"
[ "$(api "$URL/sandbox/sandboxes/v1/$SB" | json 'd["status"]')" = running ] || fail "$SB is not running"
sel="berth.sandbox=$SB"
[ "$(k get pods -l "$sel" -o name | wc -l)" = 1 ] || fail "not exactly one Pod for $SB"
[ "$(k get secrets -l "$sel" -o name | wc -l)" = 1 ] || fail "not exactly one Secret for $SB"
[ "$(k get networkpolicies -l "$sel" -o name | wc -l)" = 1 ] || fail "not exactly one NetworkPolicy for $SB"
POD="$(k get pods -l "$sel" -o jsonpath='{.items[0].metadata.name}')"
POD_UID="$(k get pod "$POD" -o jsonpath='{.metadata.uid}')"
k get pod "$POD" -o json >"$WORK/pod.json"
python3 - "$WORK/pod.json" "$OWNER_UID" "$CID" <<'EOF' || fail "the Pod's shape"
import json, sys
pod = json.load(open(sys.argv[1])); owner_uid, cid = sys.argv[2], sys.argv[3]
m, spec = pod["metadata"], pod["spec"]
assert m["labels"]["berth.controller"] == cid and m["labels"].get("berth.managed") == "true", m["labels"]
assert "berth.image_ref" in m.get("annotations", {}), m.get("annotations")
assert [r["uid"] for r in m["ownerReferences"]] == [owner_uid], m["ownerReferences"]
assert spec.get("automountServiceAccountToken") is False
assert spec["restartPolicy"] == "Never"
c = [c for c in spec["containers"] if c["name"] == "agent"][0]
env = {e["name"]: e for e in c.get("env", [])}
assert "BERTH_AGENT_TOKEN" not in env and "BERTH_AGENT_TOKEN_FILE" in env, env
assert c["resources"].get("limits") and c["resources"].get("requests"), c["resources"]
assert c.get("readinessProbe"), "no readiness probe"
shm = [v for v in spec["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
assert shm, spec["volumes"]
EOF
TOKEN="$(k get secret -l "$sel" -o jsonpath='{.items[0].data.token}' | base64 -d)"
[ -n "$TOKEN" ] || fail "the Secret holds no token"
if grep -qF "$TOKEN" "$WORK/pod.json"; then fail "the token is in the Pod"; fi
for kind in secret networkpolicy; do
    owner="$(k get "$kind" -l "$sel" -o jsonpath='{.items[0].metadata.ownerReferences[0].uid}')"
    [ "$owner" = "$POD_UID" ] || fail "the $kind is not owned by the Pod"
done
ok "create: one Pod (owned by $OWNER), one Secret and one NetworkPolicy (owned by the Pod), no token in the Pod"

out="$("$BERTH" sandbox exec "$SB" -- sh -c 'echo hello-from-the-cluster')"
[ "$out" = hello-from-the-cluster ] || fail "exec answered $out"
ok "a command runs in the Pod"

# kill -9 of the controller, a restart: the sandbox is adopted.
kill -9 "$SERVE_PID"; wait "$SERVE_PID" 2>/dev/null || true
k get pod "$POD" >/dev/null || fail "the Pod did not outlive the controller"
serve
[ "$(api "$URL/sandbox/sandboxes/v1/$SB" | json 'd["status"]')" = running ] || fail "not adopted"
api "$URL/sandbox/sandboxes/v1/$SB/events" | grep -q sandbox.adopted || fail "no sandbox.adopted event"
out="$("$BERTH" sandbox exec "$SB" -- echo again)"
[ "$out" = again ] || fail "exec after the restart answered $out"
ok "kill -9 and restart: the sandbox is adopted and runs commands"

# Its Pod killed behind the controller's back (a force delete, as a node loss or an operator
# would; a kill from inside the container cannot end its PID 1, berth-agent init, which also
# restarts the agent): failed, at once.
k delete pod "$POD" --grace-period=0 --force >/dev/null 2>&1 || true
failed() { [ "$(api "$URL/sandbox/sandboxes/v1/$SB" | json 'd["status"]')" = failed ]; }
wait_for 60 failed || fail "$SB was not marked failed"
ok "a Pod deleted behind its back marks the sandbox failed: $(api "$URL/sandbox/sandboxes/v1/$SB" | json 'd.get("error")')"

# A delete leaves nothing (a Pod being deleted is the kubelet's to finish).
SB2="$("$BERTH" sandbox create --profile ide --json | json 'd["id"]')"
"$BERTH" sandbox rm "$SB2" >/dev/null
"$BERTH" sandbox rm "$SB" >/dev/null
gone() { [ -z "$(k get pods,secrets,networkpolicies -l "berth.controller=$CID" -o name)" ]; }
wait_for 120 gone || fail "objects left after deletes: $(k get pods,secrets,networkpolicies -l "berth.controller=$CID" -o name)"
ok "deletes leave no Pod, Secret or NetworkPolicy"

# A pool: pre-created Pods, drained when resized to 0.
api -X PUT -H 'content-type: application/json' -d '{"size": 2}' "$URL/sandbox/v1/pools/ide" >/dev/null
ready() { [ "$(api "$URL/sandbox/v1/pools" | json 'd["pools"][0]["ready"]')" = 2 ]; }
wait_for 300 ready || fail "the pool did not fill"
[ "$(k get pods -l "berth.controller=$CID" -o name | wc -l)" = 2 ] || fail "not 2 Pods for a pool of 2"
ok "a pool of 2 is 2 ready Pods"
api -X PUT -H 'content-type: application/json' -d '{"size": 0}' "$URL/sandbox/v1/pools/ide" >/dev/null
wait_for 120 gone || fail "the pool's Pods outlived its resize to 0"
ok "resized to 0, its Pods are deleted"

# Deleting the owner garbage-collects what is left.
SB3="$("$BERTH" sandbox create --profile ide --json | json 'd["id"]')"
kill -9 "$SERVE_PID"; wait "$SERVE_PID" 2>/dev/null || true; SERVE_PID=""
k delete configmap "$OWNER" --wait=true >/dev/null
wait_for 120 gone || fail "$SB3's objects survived their owner"
ok "deleting the owner ConfigMap garbage-collects its Pods, Secrets and NetworkPolicies"

echo "verify: $pass checks passed against $(kubectl config current-context)"
