"""The session view's panes in Chromium: the browser, diff, agents and workspace panes, live or from
the record (the sandbox deleted).

Usage: panes.py SESSION_URL SHOT_PATH MODE [HUGE_SHOT]      (MODE: live | record)

live: waits for the active tab `berth-tab` and its picture, the diff (opens notes.txt's diff), the
runs `long-run` and `big-run` (loads big-run's whole output), the workspace. record: waits for each
pane's note to mention the record, then reads what the record shows and opens notes.txt's diff.
Then a full-page screenshot to SHOT_PATH (the viewport only when the page is absurdly tall).
Last, huge.txt's diff: its preview (the diff pane pictured into HUGE_SHOT when given), then the
whole loaded by range.

Prints one JSON object: mode, tabs, active_tab, browser_img_width, diff_files, diff_text, runs,
big_output_len, big_output_has_last, workspace, notes, page_height, huge_gap,
huge_preview_has_last, huge_loaded, errors. The Rust test asserts.
"""

import json
import sys

from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import sync_playwright

WAIT = 60000  # ms, for anything the page fetches
PANES = ("browser", "diff", "agents", "workspace")
BIG = "#runs li[data-run=big-run]"


def texts(page, selector):
    return page.eval_on_selector_all(selector, "els => els.map(e => e.innerText.trim())")


def text_of(page, selector):
    return page.evaluate("s => { const e = document.querySelector(s); return e ? e.innerText : null; }", selector)


def soft_wait(page, expression, arg=None, timeout=10000):
    """True once `expression` holds, False after `timeout` ms: for what the record may not have kept."""
    try:
        page.wait_for_function(expression, arg=arg, timeout=timeout)
        return True
    except PlaywrightTimeout:
        return False


IMG_WIDTH = "() => { const i = document.querySelector('#browser-view'); return i && i.complete && i.naturalWidth > 0; }"
ACTIVE_TAB = """() => [...document.querySelectorAll('#browser-tabs li.active')]
                       .some(li => li.textContent.includes('berth-tab'))"""
NOTE_SAYS_RECORD = """(ids) => ids.every(id => {
    const e = document.getElementById(id);
    return e && /record/i.test(e.textContent);
})"""
DIFF_SHOWN = """() => [...document.querySelectorAll('#diff-pane pre.diff')]
                      .some(p => p.textContent.includes('uncommitted line'))"""
# The longest <pre> in big-run's entry: the tail, or the whole output once loaded (in it or beside it).
LONGEST = """(s) => [...document.querySelectorAll(s + ' pre')].map(p => p.textContent)
                       .reduce((a, t) => t.length > a.length ? t : a, '')"""
BIG_LOADED = f"(s) => ({LONGEST})(s).length > 1000000"
BIG_FACTS = f"(s) => {{ const t = ({LONGEST})(s); return [t.length, t.includes('200000')]; }}"


def open_notes_diff(page, out):
    page.wait_for_selector("#diff-pane[data-state=loaded]", state="attached", timeout=WAIT)
    page.wait_for_selector("#diff-files li", state="attached", timeout=WAIT)
    out["diff_files"] = texts(page, "#diff-files li")
    entry = page.locator("#diff-files li", has_text="notes.txt").first
    (entry.locator("button").first if entry.locator("button").count() else entry).click(timeout=WAIT)
    page.wait_for_function(DIFF_SHOWN, timeout=WAIT)
    out["diff_text"] = page.evaluate(
        """() => [...document.querySelectorAll('#diff-pane pre.diff')]
                 .map(p => p.textContent).find(t => t.includes('uncommitted line'))"""
    )


def load_big_output(page, out, required):
    button = page.locator(f"{BIG} .load-output")
    if required:
        button.first.wait_for(state="attached", timeout=WAIT)
    elif button.count() == 0:
        return
    button.first.click(timeout=WAIT)
    page.wait_for_function(BIG_LOADED, arg=BIG, timeout=WAIT)
    out["big_output_len"], out["big_output_has_last"] = page.evaluate(BIG_FACTS, BIG)


HUGE_LOADED = """() => [...document.querySelectorAll('#diff-pane pre.diff')]
                      .some(p => p.textContent.includes('+50000\\n') && p.textContent.includes('+100000'))"""


def load_huge_diff(page, out, shot=None):
    """huge.txt's diff: its first and last lines with what is left out between (pictured into
    `shot` when given), then the whole read by range on demand."""
    entry = page.locator("#diff-files li", has_text="huge.txt").first
    (entry.locator("button").first if entry.locator("button").count() else entry).click(timeout=WAIT)
    button = page.locator("#diff-pane .load-diff").first
    button.wait_for(state="attached", timeout=WAIT)
    out["huge_gap"] = text_of(page, "#diff-pane .gap")
    out["huge_preview_has_last"] = page.evaluate(
        "() => [...document.querySelectorAll('#diff-pane pre.diff')].some(p => p.textContent.includes('+100000'))"
    )
    if shot:
        page.locator("#diff-pane").screenshot(path=shot)
    button.click(timeout=WAIT)
    page.wait_for_function(HUGE_LOADED, timeout=WAIT)
    out["huge_loaded"] = True


def live(page, out):
    page.wait_for_function(ACTIVE_TAB, timeout=WAIT)
    page.wait_for_function(IMG_WIDTH, timeout=WAIT)
    open_notes_diff(page, out)
    page.wait_for_selector("#runs li[data-run=long-run]", state="attached", timeout=WAIT)
    page.wait_for_selector(BIG, state="attached", timeout=WAIT)
    load_big_output(page, out, required=True)
    page.wait_for_function("() => document.querySelector('#workspace').innerText.trim() !== ''", timeout=WAIT)


def record(page, out):
    page.wait_for_function(NOTE_SAYS_RECORD, arg=[f"{p}-note" for p in PANES], timeout=WAIT)
    open_notes_diff(page, out)
    soft_wait(page, "() => document.querySelectorAll('#runs li').length > 0")
    soft_wait(page, "() => document.querySelector('#workspace').innerText.trim() !== ''")
    soft_wait(page, IMG_WIDTH)  # the kept screenshot of the tab that was active, if there is one
    if page.locator(BIG).count():
        load_big_output(page, out, required=False)


def facts(page, out):
    out["tabs"] = texts(page, "#browser-tabs li")
    out["active_tab"] = text_of(page, "#browser-tabs li.active")
    out["browser_img_width"] = page.evaluate(
        "() => { const i = document.querySelector('#browser-view'); return i ? i.naturalWidth : null; }"
    )
    out["runs"] = page.eval_on_selector_all("#runs li[data-run]", "els => els.map(e => e.dataset.run)")
    out["workspace"] = text_of(page, "#workspace")
    out["notes"] = {p: text_of(page, f"#{p}-note") for p in PANES}


def main():
    url, shot, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    huge_shot = sys.argv[4] if len(sys.argv) > 4 else None
    assert mode in ("live", "record"), mode
    out = {"mode": mode, "diff_files": [], "diff_text": None, "big_output_len": None, "big_output_has_last": None,
           "huge_gap": None, "huge_preview_has_last": None, "huge_loaded": False}
    errors = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url)
        (live if mode == "live" else record)(page, out)
        facts(page, out)
        # A whole output in a pane could make the page too tall to picture: then the viewport only.
        out["page_height"] = page.evaluate("document.documentElement.scrollHeight")
        page.screenshot(path=shot, full_page=out["page_height"] <= 16000)
        load_huge_diff(page, out, huge_shot)
        browser.close()
    out["errors"] = errors
    print(json.dumps(out))


main()
