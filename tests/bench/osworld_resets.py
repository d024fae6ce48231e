"""OSWorld's episode reset through berth.osworld, as a benchmark harness makes it: N
``DesktopEnv``s (desktop-env from PyPI, unchanged) on one controller, each stepping once and
resetting R times; prints one JSON line: every reset's seconds and the wall time.

    python3 tests/bench/osworld_resets.py URL KEY IMAGE_REF RESETS ENVS
"""

import concurrent.futures
import json
import os
import sys
import tempfile
import time

# OSWorld's code as the Python tests load it (its metrics package without the imports of every
# metric module; tests/setup.sh installs what the rest needs).
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "clients", "python", "tests"))
import conftest  # noqa: E402,F401

import berth.osworld  # noqa: E402
from desktop_env.desktop_env import DesktopEnv  # noqa: E402

url, key, image, resets, envs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
berth.osworld.register(url, key, image_ref=image, labels={"suite": "bench"})

TASK = {
    "id": "berth-bench-reset",
    "instruction": "Nothing: the reset is measured.",
    "config": [],
    "evaluator": {
        "func": "exact_match",
        "result": {"type": "vm_command_line", "command": "echo ok", "shell": True},
        "expected": {"type": "rule", "rules": {"expected": "ok\n"}},
    },
}


def one(n):
    times = []
    env = DesktopEnv(provider_name="berth", action_space="pyautogui", cache_dir=tempfile.mkdtemp(), require_a11y_tree=False)
    try:
        for _ in range(resets):
            # A used env: the next reset is a real one (a fresh sandbox).
            env.step("pyautogui.moveTo(10, 10)", pause=0)
            t = time.monotonic()
            env.reset(task_config=TASK)
            times.append(time.monotonic() - t)
    finally:
        env.close()
    return times


t0 = time.monotonic()
with concurrent.futures.ThreadPoolExecutor(envs) as pool:
    per_env = list(pool.map(one, range(envs)))
print(json.dumps({"resets": [t for ts in per_env for t in ts], "wall": time.monotonic() - t0}))
