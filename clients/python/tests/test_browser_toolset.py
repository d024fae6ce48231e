"""Anthropic's browser toolset through the ``anthropic`` SDK (2.10, from PyPI) and
``berth.anthropic.BrowserToolset``, against a desktop sandbox behind the controller: the SDK's own
``tool_result()`` on hand-built ``tool_use`` blocks for every default member, each effect checked in
the page by Playwright over CDP through the controller (its DOM, its URL, its tabs), the agent's
whole-turn route answering what the SDK renders, and refusals (a stale reference, a member this
sandbox does not serve, a turn that stops at its first failure)."""

from __future__ import annotations

import base64
import json
import os
import re
import time
from urllib.parse import urlparse

import pytest

anthropic = pytest.importorskip("anthropic", minversion="2.10")
playwright_sync = pytest.importorskip("playwright.sync_api")

import berth  # noqa: E402
from toolset_helpers import png_size, texts, tool_use, wait_for  # noqa: E402
from berth.anthropic import BrowserToolset  # noqa: E402

PORT = 8099
SITE = f"http://127.0.0.1:{PORT}"
OPTIONAL = ("file_upload", "read_console", "read_network", "javascript_exec")
# The optional members the controller under test enables (its `browser_toolset_enable`).
ENABLED = [n for n in os.environ.get("BERTH_BROWSER_TOOLSET_ENABLED", "").split(",") if n]
# One the controller leaves off, for the refusal.
DISABLED = next(n for n in OPTIONAL if n not in ENABLED)

FORM = """<!doctype html>
<html><head><title>Berth form</title></head>
<body style="margin:0;font:16px sans-serif">
<h1>Order</h1>
<input id="q" type="search" aria-label="Search products" style="width:300px">
<button id="add" onclick="note('added')">Add to cart</button>
<label><input id="sub" type="checkbox"> Subscribe</label>
<select id="size" aria-label="Size"><option value="s">Small</option><option value="l">Large</option></select>
<a id="next" href="next.html">Next page</a>
<a id="pop" href="next.html" target="_blank">Open in a new tab</a>
<button id="ask" onclick="note(confirm('Sure?') ? 'yes' : 'no')">Ask</button>
<div id="log"></div>
<div style="height:4000px"></div>
<p id="far">Far below</p>
<script>
function note(s) { document.getElementById('log').textContent += s + ';'; }
document.addEventListener('keydown', e => { if (e.ctrlKey && e.key === 'k') note('ctrl+k'); });
document.getElementById('add').addEventListener('contextmenu', e => { e.preventDefault(); note('context'); });
document.getElementById('add').addEventListener('dblclick', () => note('dblclick'));
console.log('form ready');
</script>
</body></html>
"""
NEXT = "<!doctype html><html><head><title>Next</title></head><body><p>Second page</p></body></html>"




@pytest.fixture(scope="module")
def desktop(berth_url):
    client = berth.Client(berth_url)
    sb = client.create_sandbox("desktop", labels={"suite": "python-browser-toolset"})
    try:
        client.write_file(sb, "/tmp/site/form.html", FORM)
        client.write_file(sb, "/tmp/site/next.html", NEXT)
        client.exec(sb, f"cd /tmp/site && exec python3 -m http.server {PORT} --bind 127.0.0.1", wait=False)
        fetch = f"import urllib.request; urllib.request.urlopen('{SITE}/next.html', timeout=5)"
        wait_for("the site", lambda: client.exec(sb, ["python3", "-c", fetch]).exit_code == 0)
        yield client, sb
    finally:
        client.delete_sandbox(sb)
        client.session.close()


@pytest.fixture(scope="module")
def browser(desktop):
    client, sb = desktop
    return BrowserToolset(sb, client)


class Page:
    """The sandbox's browser as Playwright sees it over CDP, through the controller."""

    def __init__(self, client: berth.Client, sb):
        base = urlparse(client.url)
        scheme = "wss" if base.scheme == "https" else "ws"
        url = f"{scheme}://{base.netloc}/sandbox/sandboxes/v1/{berth.Client._sb(sb)}/v1/browser/cdp"
        self.pw = playwright_sync.sync_playwright().start()
        self.browser = self.pw.chromium.connect_over_cdp(url, headers={"x-api-key": client.api_key}, timeout=30000)

    def pages(self):
        return [p for c in self.browser.contexts for p in c.pages]

    def urls(self):
        """Each page's address, read in the page (a round trip, which also lets Playwright's sync API
        take the browser's events in)."""
        out = []
        for p in self.pages():
            try:
                out.append((p, p.evaluate("location.href")))
            except Exception:  # a page closing meanwhile
                pass
        return out

    def at(self, path: str):
        """The page showing `path` of the test site."""
        return wait_for(path, lambda: next((p for p, url in self.urls() if url == SITE + path), None))

    def eval(self, path: str, js: str):
        return self.at(path).evaluate(js)

    def close(self):
        self.browser.close()
        self.pw.stop()


@pytest.fixture(scope="module")
def page(desktop):
    client, sb = desktop
    p = Page(client, sb)
    yield p
    p.close()




def block(name: str, **input):
    return tool_use("browser", name, **input)


def call(browser: BrowserToolset, name: str, **input):
    return browser.tool_result(block(name, **input))




def state(result):
    (s,) = [b for b in result["content"] if b["type"] == "browser_state"]
    return s


def active(result):
    (t,) = [t for t in state(result)["tabs"] if t.get("active")]
    return t




def ref_of(text: str, line_start: str) -> str:
    for line in text.splitlines():
        if line.strip().startswith(line_start):
            m = re.search(r"\[(ref_\d+)\]", line)
            assert m, line
            return m.group(1)
    raise AssertionError(f"{line_start!r} not in:\n{text}")


def to_shot(browser: BrowserToolset, box):
    """The centre of a Playwright bounding box (CSS pixels) in the toolset's screenshot pixels."""
    info = browser.info()
    s = info["screenshot_width_px"] / info["viewport_width_px"]
    return {"type": "coordinate", "x": int((box["x"] + box["width"] / 2) * s), "y": int((box["y"] + box["height"] / 2) * s)}


def test_the_tools_entry_is_the_sdks(browser: BrowserToolset):
    info = browser.info()
    assert info["tool"]["type"] == browser.to_dict()["type"] == "browser_toolset_20260801", info
    assert info["tool"].get("configs", {}) == {n: {"enabled": True} for n in ENABLED}, info
    assert len(info["members"]) == 27 + len(ENABLED), info
    assert [n for n in OPTIONAL if n in info["members"]] == [n for n in OPTIONAL if n in ENABLED], info
    w, h = info["screenshot_width_px"], info["screenshot_height_px"]
    assert max(w, h) <= 1568 and w * h <= 1_150_000, info
    assert info["viewport_width_px"] >= w, info


def test_every_member_checked_in_the_page(browser: BrowserToolset, page: Page):
    # navigate: the SDK's line with the title and the status, and the tab in the state block
    r = call(browser, "navigate", url=f"{SITE}/form.html")
    assert "is_error" not in r, r
    assert texts(r) == [f"Navigated to {SITE}/form.html \u2014 Berth form (HTTP 200)"], r
    assert active(r)["url"] == f"{SITE}/form.html" and active(r)["title"] == "Berth form", r
    assert page.eval("/form.html", "document.readyState") == "complete"

    # find and read_page: references that name the elements
    found = texts(call(browser, "find", query="search box"))[0]
    search = ref_of(found, 'searchbox "Search products"')
    tree = texts(call(browser, "read_page"))[0]
    assert 'button "Add to cart"' in tree and "Far below" not in tree, tree
    assert "Far below" in texts(call(browser, "read_page", filter="all"))[0]
    interactive = texts(call(browser, "read_page", filter="interactive"))[0]
    assert "heading" not in interactive and 'link "Next page"' in interactive, interactive
    add = ref_of(tree, 'button "Add to cart"')
    assert texts(call(browser, "read_page", ref=add)) == [f'button "Add to cart" [{add}]']

    # left_click by reference, then type into the field
    assert texts(call(browser, "left_click", target={"type": "ref", "ref": search})) == ["Clicked."]
    assert texts(call(browser, "type", text="red shoes")) == ["Typed."]
    assert page.eval("/form.html", "document.getElementById('q').value") == "red shoes"
    assert page.eval("/form.html", "document.activeElement.id") == "q"

    # key: a chord the page sees, and keys in sequence with a repeat
    assert texts(call(browser, "key", text="ctrl+k")) == ["Pressed ctrl+k."]
    assert "ctrl+k;" in page.eval("/form.html", "document.getElementById('log').textContent")
    assert texts(call(browser, "key", text="BackSpace", repeat=6)) == ["Pressed BackSpace."]
    assert page.eval("/form.html", "document.getElementById('q').value") == "red"

    # a click by coordinate (screenshot pixels), a right and a double click
    box = page.at("/form.html").locator("#add").bounding_box()
    assert texts(call(browser, "left_click", target=to_shot(browser, box))) == ["Clicked."]
    assert texts(call(browser, "right_click", target={"type": "ref", "ref": add})) == ["Right-clicked."]
    assert texts(call(browser, "double_click", target={"type": "ref", "ref": add})) == ["Double-clicked."]
    log = page.eval("/form.html", "document.getElementById('log').textContent")
    assert log.count("added;") == 3 and "context;" in log and "dblclick;" in log, log

    # hover: the page sees the pointer over the element
    page.eval("/form.html", "window.hovered = false; document.getElementById('add').onmouseenter = () => window.hovered = true")
    call(browser, "mouse_move", target={"type": "coordinate", "x": 5, "y": 5})
    assert texts(call(browser, "hover", target={"type": "ref", "ref": add})) == ["Hovered."]
    assert page.eval("/form.html", "window.hovered") is True

    # form_input: a checkbox and a select
    sub = ref_of(texts(call(browser, "find", query="subscribe checkbox"))[0], 'checkbox "Subscribe"')
    assert texts(call(browser, "form_input", target={"type": "ref", "ref": sub}, value=True)) == [
        f"Set the value of {sub}."
    ]
    size = ref_of(texts(call(browser, "find", query="size"))[0], 'combobox "Size"')
    call(browser, "form_input", target={"type": "ref", "ref": size}, value="Large")
    assert page.eval("/form.html", "[document.getElementById('sub').checked, document.getElementById('size').value]") == [True, "l"]
    assert f"checkbox \"Subscribe\" [{sub}] checked" in texts(call(browser, "read_page"))[0]

    # scroll and scroll_to
    assert texts(
        call(browser, "scroll", scroll_direction="down", scroll_amount=5, target={"type": "coordinate", "x": 100, "y": 100})
    ) == ["Scrolled down."]
    assert wait_for("the scroll", lambda: page.eval("/form.html", "window.scrollY") >= 400)
    far = ref_of(texts(call(browser, "find", query="far below"))[0], 'text "Far below"')
    assert texts(call(browser, "scroll_to", target={"type": "ref", "ref": far})) == [f"Scrolled to {far}."]
    in_view = "(() => { const r = document.getElementById('far').getBoundingClientRect(); return r.top >= 0 && r.bottom <= innerHeight; })()"
    assert page.eval("/form.html", in_view) is True
    call(browser, "scroll", scroll_direction="up", scroll_amount=100, target={"type": "coordinate", "x": 100, "y": 100})
    wait_for("back at the top", lambda: page.eval("/form.html", "window.scrollY") == 0)

    # screenshot and zoom: PNGs at the toolset's sizes
    info = browser.info()
    (image,) = [b for b in call(browser, "screenshot")["content"] if b["type"] == "image"]
    assert png_size(base64.b64decode(image["source"]["data"])) == (info["screenshot_width_px"], info["screenshot_height_px"])
    (image,) = [b for b in call(browser, "zoom", region=[0, 0, 200, 100])["content"] if b["type"] == "image"]
    w, h = png_size(base64.b64decode(image["source"]["data"]))
    assert w > 200 and abs(w / h - 2) < 0.02 and w * h <= 1_150_000, (w, h)

    # a dialog the page opens is dismissed and told
    r = call(browser, "left_click", target={"type": "ref", "ref": ref_of(tree, 'button "Ask"')})
    assert texts(r) == ["Clicked.", 'A confirm dialog "Sure?" was dismissed.'], r
    assert page.eval("/form.html", "document.getElementById('log').textContent").endswith("no;")

    # drag, press and release: the page's pointer events
    page.eval("/form.html", "window.seen = []; for (const k of ['mousedown','mouseup']) addEventListener(k, e => seen.push(k + ':' + e.clientX))")
    call(browser, "left_click_drag", **{"from": {"type": "coordinate", "x": 50, "y": 300}}, target={"type": "coordinate", "x": 150, "y": 300})
    assert texts(call(browser, "left_mouse_down", target={"type": "coordinate", "x": 60, "y": 300})) == ["Mouse button pressed."]
    assert texts(call(browser, "left_mouse_up", target={"type": "coordinate", "x": 60, "y": 300})) == ["Mouse button released."]
    seen = page.eval("/form.html", "window.seen")
    assert [s.split(":")[0] for s in seen] == ["mousedown", "mouseup", "mousedown", "mouseup"], seen

    # get_page_text, wait, hold_key
    text = texts(call(browser, "get_page_text"))[0]
    assert "Order" in text and "Add to cart" in text, text
    started = time.monotonic()
    assert texts(call(browser, "wait", duration=0.5)) == ["Waited 0.5s."]
    assert time.monotonic() - started >= 0.5
    assert texts(call(browser, "hold_key", text="shift", duration=0.2)) == ["Held shift for 0.2s."]

    # a link: the page navigates; back returns
    call(browser, "left_click", target={"type": "ref", "ref": ref_of(tree, 'link "Next page"')})
    wait_for("next.html", lambda: any(url == f"{SITE}/next.html" for _, url in page.urls()))
    r = call(browser, "navigate", url="back")
    assert texts(r)[0].startswith(f"Navigated to {SITE}/form.html"), r
    assert active(r)["url"] == f"{SITE}/form.html"


def test_tabs(browser: BrowserToolset, page: Page):
    call(browser, "navigate", url=f"{SITE}/form.html")
    first = active(call(browser, "list_tabs"))["tab_id"]
    # a link the page opens in a new tab: reported opened, and in front
    r = call(browser, "left_click", target={"type": "ref", "ref": ref_of(texts(call(browser, "read_page"))[0], 'link "Open in a new tab"')})
    s = state(r)
    popup = active(r)["tab_id"]
    assert popup != first and {"type": "tab_opened", "tab_id": popup} in s.get("state_changes", []), s
    wait_for("the popup's page", lambda: active(call(browser, "list_tabs"))["url"] == f"{SITE}/next.html")
    # new_tab: only the block, with exactly one tab_opened
    r = call(browser, "new_tab")
    (only,) = r["content"]
    assert only["type"] == "browser_state" and len(only["tabs"]) >= 3, r
    blank = active(r)["tab_id"]
    assert only["state_changes"] == [{"type": "tab_opened", "tab_id": blank}], r
    # a member on a named tab acts there, not in the active one
    r = call(browser, "navigate", url=f"{SITE}/next.html", tab_id=blank)
    assert "is_error" not in r, r
    # switch_tab and close_tab
    r = call(browser, "switch_tab", tab_id=first)
    assert active(r)["tab_id"] == first, r
    for t in (popup, blank):
        r = call(browser, "close_tab", tab_id=t)
        assert t not in [x["tab_id"] for x in state(r)["tabs"]], r
    assert [t["tab_id"] for t in state(call(browser, "list_tabs"))["tabs"]] == [first]
    r = call(browser, "switch_tab", tab_id="no-such-tab")
    assert r["is_error"] is True and texts(r) == ["No open tab has this tab_id: call list_tabs to see the tabs."], r


def test_a_whole_turn_answers_what_the_sdk_renders_and_stops_at_the_first_failure(browser: BrowserToolset, page: Page):
    calls = [
        block("navigate", url=f"{SITE}/form.html"),
        block("find", query="add to cart button"),
        block("get_page_text"),
        block("list_tabs"),
        block("wait", duration=0),
    ]
    answered = browser.turn([{"type": "text", "text": "Shopping."}] + [c.model_dump() for c in calls])
    assert len(answered) == len(calls), answered
    # Each result is the one the SDK builds running the member itself on the same document (its
    # references are that document's), and the navigation renders the same line.
    for c, got in zip(calls[1:], answered[1:]):
        assert got == browser.tool_result(c), (c, got)
    assert texts(answered[0]) == texts(browser.tool_result(calls[0])), answered[0]

    # A stale reference fails; nothing after it runs.
    answered = browser.turn(
        [
            block("left_click", target={"type": "ref", "ref": "ref_999999"}).model_dump(),
            block("type", text="never").model_dump(),
        ]
    )
    assert [r.get("is_error", False) for r in answered] == [True, True], answered
    assert texts(answered[0])[0].startswith("ref_999999 names no element on this page"), answered
    assert answered[1]["content"] == "Not executed: an earlier action in this turn failed."

    # An optional member this sandbox does not serve, and an unknown one.
    (r,) = browser.turn([block(DISABLED).model_dump()])
    assert texts(r) == [f"The browser toolset member '{DISABLED}' is not available in this environment."], r
    (r,) = browser.turn([block("fly").model_dump()])
    assert texts(r) == ["Error: unknown browser toolset member 'fly'"], r
    # Bad inputs name the field.
    r = call(browser, "scroll", scroll_direction="down", scroll_amount=0, target={"type": "coordinate", "x": 1, "y": 1})
    assert r["is_error"] and texts(r) == ["invalid input for browser member 'scroll': scroll_amount: must be 1 to 100"], r
    r = call(browser, "left_click", target={"type": "coordinate", "x": 99999, "y": 1})
    assert r["is_error"] and "is outside the" in texts(r)[0], r
    assert json.dumps(r)  # every answer is plain JSON


@pytest.mark.skipif(
    not {"javascript_exec", "read_console"} <= set(ENABLED),
    reason="the controller under test does not enable javascript_exec and read_console",
)
def test_optional_members_the_controller_enables(desktop, page: Page):
    # The SDK sends an optional member only when its own configs enable it too.
    client, sb = desktop
    enabled = BrowserToolset(sb, client, configs={n: {"enabled": True} for n in ENABLED})
    r = call(enabled, "navigate", url=f"{SITE}/form.html")
    assert "is_error" not in r, r
    r = call(enabled, "javascript_exec", text="document.getElementById('log').textContent = 'from js'; document.title")
    assert "is_error" not in r and texts(r) == ["Berth form"], r
    assert page.eval("/form.html", "document.getElementById('log').textContent") == "from js"
    r = call(enabled, "read_console")
    assert "is_error" not in r and "[log] form ready" in texts(r)[0], r


def test_the_async_driver(desktop):
    import asyncio

    from berth.anthropic import AsyncBrowserToolset

    from concurrent.futures import ThreadPoolExecutor

    client, sb = desktop
    toolset = AsyncBrowserToolset(sb, client)

    def run(name):
        # On a thread of its own: Playwright's sync API holds this thread's event loop.
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, toolset.tool_result(block(name))).result()

    r = run("list_tabs")
    assert "is_error" not in r and state(r)["tabs"], r
    r = run("get_page_text")
    assert "is_error" not in r and texts(r), r
