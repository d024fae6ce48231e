"""The peers of berth's display benchmark, timed in-process (no interpreter start-up counted).

    peers.py scrot-png N     OSWorld v2's path: scrot -p -z to a file, Pillow re-encodes PNG
    peers.py grab-png N      OSWorld v1's path: Pillow ImageGrab (XCB) + PNG save
    peers.py grab-jpeg N     Pillow ImageGrab + JPEG quality 80

Prints {"p50_ms": ..., "p99_ms": ...} for N runs on $DISPLAY.
"""

import io
import json
import os
import subprocess
import sys
import tempfile
import time

from PIL import Image, ImageGrab


def scrot_png(tmp):
    subprocess.run(["scrot", "-p", "-z", "-o", tmp], check=True, timeout=8)
    img = Image.open(tmp)
    out = io.BytesIO()
    img.save(out, "PNG", optimize=True)
    return out.getvalue()


def grab_png(tmp):
    img = ImageGrab.grab()
    img.save(tmp, "PNG")
    with open(tmp, "rb") as f:
        return f.read()


def grab_jpeg(_tmp):
    img = ImageGrab.grab()
    out = io.BytesIO()
    img.convert("RGB").save(out, "JPEG", quality=80)
    return out.getvalue()


def main():
    kind, n = sys.argv[1], int(sys.argv[2])
    fn = {"scrot-png": scrot_png, "grab-png": grab_png, "grab-jpeg": grab_jpeg}[kind]
    tmp = os.path.join(tempfile.mkdtemp(), "shot.png")
    fn(tmp)  # warm-up
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn(tmp)
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    print(json.dumps({"p50_ms": times[len(times) // 2], "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))]}))


main()
