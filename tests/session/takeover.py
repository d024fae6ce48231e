"""A person takes the controls of the sandbox's desktop in the session view while the agent works.

Usage: takeover.py BASE API_KEY SANDBOX_ID SESSION_URL_A SESSION_URL_B SHOT_DIR

Two browser contexts open the session view (A and B). A takes control (its noVNC reconnects
writable); B sees another holder. The agent's turns (berth's driver for the anthropic SDK's
computer toolset, `tool_result()` on hand-built `tool_use` blocks as the toolset example in docs/src/agent/toolsets.md)
are refused meanwhile. A types `person-typed-42` into the desktop, B (view-only) types
`viewer-b-typed`; A sends `clip-from-person` to the clipboard and fetches it back; a screenshot of
A's page to SHOT_DIR/session-takeover.png; A hands back, and one more agent turn gets the notice.

Prints one JSON object: refused [{member, is_error, text}], after {types, first_text, is_error},
clipboard_note, clipboard_back, control_b_while_held, control_after, errors_a, errors_b.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))

import anthropic  # noqa: E402
import berth  # noqa: E402
from berth.anthropic import ComputerToolset  # noqa: E402
from playwright.sync_api import TimeoutError as PlaywrightTimeout  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

WAIT = 60000  # ms
CONNECTED = "#desktop[data-state=connected]"


def open_page(browser, url):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_selector(CONNECTED, timeout=WAIT)
    return page, errors


def control_of(page, who):
    page.wait_for_selector(f"body[data-control={who}]", state="attached", timeout=WAIT)


def control_now(page):
    return page.evaluate("document.body.dataset.control ?? null")


def take_control(page):
    """Takes control and waits for the new, writable noVNC connection: the old canvas is marked
    first, so a connected desktop with an unmarked canvas is the reconnected one."""
    page.evaluate("document.querySelectorAll('#desktop canvas').forEach(c => { c.dataset.before = '1'; })")
    page.click("#take-control")
    control_of(page, "you")
    page.wait_for_selector(f"{CONNECTED} canvas:not([data-before])", state="attached", timeout=WAIT)


def type_on_desktop(page, text):
    """A click at the desktop's centre (as a person clicks: at the point, whatever covers it), then keys."""
    canvas = page.locator("#desktop canvas:not([data-before])").last  # not a closing connection's
    canvas.scroll_into_view_if_needed(timeout=WAIT)
    box = canvas.bounding_box()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    canvas.focus()
    page.keyboard.type(text)
    page.keyboard.press("Enter")


def turn(computer, n, name, **input):
    block = anthropic.types.beta.BetaToolUseBlock(
        type="tool_use", id=f"toolu_{n}", name=name, input=input, toolset_name="computer"
    )
    return computer.tool_result(block)


def blocks(result):
    content = result["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def text_of(result):
    return " ".join(x["text"] for x in blocks(result) if x.get("type") == "text")


def clipboard(page, out):
    """Sends a text to the desktop's clipboard, then fetches it back into the emptied textarea."""
    before = page.inner_text("#control-note")
    page.fill("#clipboard-text", "clip-from-person")
    page.click("#clipboard-send")
    try:  # the page's confirmation, if it gives one in the note
        page.wait_for_function(
            "(b) => { const t = document.querySelector('#control-note').textContent.trim(); return t && t !== b; }",
            arg=before.strip(),
            timeout=15000,
        )
    except PlaywrightTimeout:
        pass
    out["clipboard_note"] = page.inner_text("#control-note")
    page.fill("#clipboard-text", "")
    page.click("#clipboard-fetch")
    page.wait_for_function("() => document.querySelector('#clipboard-text').value !== ''", timeout=30000)
    out["clipboard_back"] = page.input_value("#clipboard-text")


def main():
    base, key, sandbox, url_a, url_b, shot_dir = sys.argv[1:7]
    computer = ComputerToolset(sandbox, berth.Client(base, key))
    out = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        a, errors_a = open_page(browser, url_a)
        b, errors_b = open_page(browser, url_b)
        take_control(a)
        control_of(b, "other")
        out["control_b_while_held"] = control_now(b)

        out["refused"] = []
        for n, (member, input) in enumerate([("left_click", {"coordinate": [10, 10]}), ("screenshot", {})], 1):
            result = turn(computer, n, member, **input)
            out["refused"].append({"member": member, "is_error": bool(result.get("is_error")), "text": text_of(result)})

        type_on_desktop(a, "person-typed-42")
        type_on_desktop(b, "viewer-b-typed")
        clipboard(a, out)
        a.screenshot(path=os.path.join(shot_dir, "session-takeover.png"), full_page=True)

        a.click("#hand-back")
        control_of(a, "agent")
        result = turn(computer, 3, "mouse_move", coordinate=[20, 20])
        texts = [x["text"] for x in blocks(result) if x.get("type") == "text"]
        out["after"] = {
            "types": [x.get("type") for x in blocks(result)],
            "first_text": texts[0] if texts else None,
            "is_error": bool(result.get("is_error")),
        }
        out["control_after"] = {"a": control_now(a), "b": control_now(b)}
        browser.close()
    out["errors_a"], out["errors_b"] = errors_a, errors_b
    print(json.dumps(out))


main()
