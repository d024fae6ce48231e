"""The agent asks for a person's hands (MCP `request_human_control`), and is refused while a person
has the controls; the person answers in the session view.

Usage: request.py BASE API_KEY SANDBOX_ID SESSION_URL SHOT_PATH

With the official MCP Python SDK on the sandbox's MCP server (BASE/sandbox/sandboxes/v1/ID/mcp, the
X-Api-Key header): lists the tools; takes control over REST and calls `screenshot` (refused), hands
back with the token and calls it again; then calls `request_human_control` twice while Chromium, on
SESSION_URL, answers the banner: `#request-take` then `#hand-back` the first time (a screenshot of
the page with the banner to SHOT_PATH), `#request-decline` the second.

Prints one JSON object: listed, refused_is_error, refused_text, after_is_error, returned_text,
declined_text, banner_text, errors. The Rust test asserts on it.
"""

import asyncio
import json
import sys

import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from playwright.async_api import async_playwright

BASE, KEY, SB, SESSION_URL, SHOT = sys.argv[1:6]
SBURL = f"{BASE}/sandbox/sandboxes/v1/{SB}"
WAIT = 60000  # ms, in the page
ANSWER = 120.0  # s, for a tool's answer once the person acted
BANNER = """(reason) => {
    const e = document.querySelector('#control-request');
    return !!e && !e.hidden && e.offsetParent !== null && e.textContent.includes(reason);
}"""


def first_text(result):
    return next((c.text for c in result.content if c.type == "text"), None)


async def while_held(s, http, out):
    """Control taken over REST: the desktop tool is refused; handed back with the token: it runs."""
    r = await http.post(f"{SBURL}/control", json={})
    assert r.status_code < 300, ("take", r.status_code, r.text)
    token = r.json()["token"]
    shot = await s.call_tool("screenshot", {})
    out["refused_is_error"], out["refused_text"] = bool(shot.is_error), first_text(shot)
    r = await http.delete(f"{SBURL}/control", headers={"x-berth-control": token})
    assert r.status_code < 300, ("hand back", r.status_code, r.text)
    shot = await s.call_tool("screenshot", {})
    out["after_is_error"] = bool(shot.is_error)


async def request(s, page, reason, answer):
    """Asks for a person's hands with `reason`; the page answers once the banner shows it."""
    call = asyncio.create_task(
        s.call_tool("request_human_control", {"reason": reason}, read_timeout_seconds=ANSWER)
    )
    try:
        await page.wait_for_function(BANNER, arg=reason, timeout=WAIT)
        banner = await page.inner_text("#control-request")
        await answer(page)
        result = await asyncio.wait_for(call, ANSWER)
    finally:
        call.cancel()  # a no-op once it has answered
    return banner, first_text(result)


async def take_and_return(page):
    await page.screenshot(path=SHOT, full_page=True)
    await page.click("#request-take")
    await page.wait_for_selector("body[data-control=you]", state="attached", timeout=WAIT)
    await page.click("#hand-back")


async def decline(page):
    await page.click("#request-decline")


async def main():
    out = {}
    errors = []
    async with httpx2.AsyncClient(headers={"X-Api-Key": KEY}, timeout=httpx2.Timeout(ANSWER + 60)) as http:
        async with streamable_http_client(f"{SBURL}/mcp", http_client=http) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                tools = [t.name for t in (await s.list_tools()).tools]
                out["listed"] = "request_human_control" in tools
                await while_held(s, http, out)
                async with async_playwright() as p:
                    browser = await p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
                    page = await browser.new_page(viewport={"width": 1400, "height": 1000})
                    page.on("pageerror", lambda e: errors.append(str(e)))
                    await page.goto(SESSION_URL)
                    await page.wait_for_selector("#control-bar", state="attached", timeout=WAIT)
                    out["banner_text"], out["returned_text"] = await request(
                        s, page, "Type the 2FA code", take_and_return
                    )
                    _, out["declined_text"] = await request(s, page, "Solve the CAPTCHA", decline)
                    await browser.close()
    out["errors"] = errors
    print(json.dumps(out))


asyncio.run(main())
