"""The /execute benchmark's cross-check: OSWorld's own client, timed in-process.

    requests_execute.py N BASE_URL [BASE_URL ...]

Posts `echo hi` to each BASE_URL's /execute as desktop-env 1.0.2's
PythonController.execute_python_command does: requests.post with no Session, so each request is
a new connection that requests closes once it has read the answer by its Content-Length. 50
warm-up requests per server, then N timed each, interleaved in blocks of 50 so machine noise hits
every server alike. Prints [{"p50_ms": ..., "p99_ms": ...}, ...] in BASE_URL order.
"""

import json
import sys
import time

import requests

PAYLOAD = json.dumps({"command": ["echo", "hi"], "shell": False})
BLOCK = 50


def once(base):
    t = time.perf_counter()
    r = requests.post(
        base + "/execute", headers={"Content-Type": "application/json"}, data=PAYLOAD, timeout=90
    )
    took = (time.perf_counter() - t) * 1000
    if r.status_code != 200 or r.json().get("output") != "hi\n":
        sys.exit(f"unexpected answer from {base}: {r.status_code} {r.text!r}")
    return took


def percentile(sorted_times, p):
    # The same index as the Rust side: (n - 1) * p rounded half away from zero.
    return sorted_times[int((len(sorted_times) - 1) * p + 0.5)]


def main():
    n, bases = int(sys.argv[1]), sys.argv[2:]
    for _ in range(BLOCK):
        for base in bases:
            once(base)
    times = [[] for _ in bases]
    while len(times[0]) < n:
        for base, ts in zip(bases, times):
            for _ in range(min(BLOCK, n - len(ts))):
                ts.append(once(base))
    out = []
    for ts in times:
        ts.sort()
        out.append({"p50_ms": percentile(ts, 0.5), "p99_ms": percentile(ts, 0.99)})
    print(json.dumps(out))


main()
