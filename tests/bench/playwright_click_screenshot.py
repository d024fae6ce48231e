"""The peer of `berth-bench browser`: what an engine's own browser driver does today for one
browser-toolset step — Playwright over CDP to the same browser, a click on the page and the
viewport's screenshot — timed in Python. Prints `p50 p99` in milliseconds.

    python3 playwright_click_screenshot.py CDP_URL PAGE_URL X Y ROUNDS
"""

import sys
import time

from playwright.sync_api import sync_playwright


def main() -> None:
    cdp, url, x, y, rounds = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    with sync_playwright() as p:
        browser = p.chromium.connect_over_cdp(cdp, timeout=30000)
        page = next(pg for ctx in browser.contexts for pg in ctx.pages if pg.url == url)
        times = []
        for i in range(rounds + 2):
            t = time.perf_counter()
            page.mouse.click(x, y)
            page.screenshot(type="png")
            if i >= 2:  # two warm-up rounds, as the berth side has
                times.append((time.perf_counter() - t) * 1000)
        times.sort()
        at = lambda q: times[round((len(times) - 1) * q)]  # noqa: E731
        print(f"{at(0.5):.1f} {at(0.99):.1f}")


if __name__ == "__main__":
    main()
