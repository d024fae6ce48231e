"""Drives the controller's MCP servers with the official MCP Python SDK, as an engine would.

Usage:
  client.py controller URL KEY PROFILE
      The controller's own /mcp: a session (the initialize handshake) lists the tools, creates a
      sandbox of PROFILE with a label, lists by that label, shows it, asks for an unknown one,
      acquires and releases a lease, deletes the sandbox; then a session-less connection
      (server/discover, 2026-07-28) lists the tools.
  client.py engine URL KEY PROFILE SCREEN X Y
      As an engine works: the controller's /mcp creates a sandbox of PROFILE with SCREEN
      ("WxH"); a second session, to the `mcp_url` it answered, lists the tools, clicks at (X, Y)
      with `computer` and reads the cursor back, takes a `screenshot`, drives the computer
      toolset's members (`computer_left_click`, `computer_cursor_position`,
      `computer_screenshot`, a refused click) and the browser toolset's (`browser_navigate`,
      `browser_find`), runs `exec`; a
      session-less connection there runs `exec` too; the first session deletes the sandbox.
  client.py github URL KEY SANDBOX REPOSITORY PATH
      The GitHub tools: lists the tools, calls `github_repositories`, then
      `github_clone_repository` of REPOSITORY into SANDBOX at PATH; then the reads bound to
      the sandbox: `github_pull_requests` and `github_issues` of REPOSITORY, `github_issue` 2,
      and `github_pull_requests` of OTHER (not cloned: refused).
  client.py login SANDBOX_MCP_URL KEY SITE [SITE…]
      The sandbox's own MCP server, as an engine's session would list it: its tools (with the
      `login` tool's input schema), then a `login` call for each SITE.

Every request carries the X-Api-Key header. Prints one JSON object with what it saw; the Rust
test (tests/tests/mcp_controller.rs) asserts on it.
"""

import asyncio
import json
import os
import sys

import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mcp"))
from answers import answer  # noqa: E402


def tools_of(listed) -> dict:
    return {
        t.name: {
            "description": t.description,
            "input_schema": t.input_schema,
            "output_schema": t.output_schema,
        }
        for t in listed.tools
    }


async def controller(url: str, http: httpx2.AsyncClient, profile: str) -> dict:
    out = {}
    async with streamable_http_client(url, http_client=http) as (read, write):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            out["server"] = {
                "name": init.server_info.name,
                "protocol_version": init.protocol_version,
                "instructions": init.instructions,
            }
            out["tools"] = tools_of(await s.list_tools())
            created = answer(
                await s.call_tool(
                    "create_sandbox",
                    {"profile": profile, "labels": {"suite": "mcp"}, "ttl_seconds": 600},
                )
            )
            out["create"] = created
            sid = (created["structured"] or {}).get("id")
            out["list"] = answer(await s.call_tool("list_sandboxes", {"labels": {"suite": "mcp"}}))
            out["list_other"] = answer(
                await s.call_tool("list_sandboxes", {"labels": {"suite": "other"}})
            )
            out["list_running"] = answer(
                await s.call_tool("list_sandboxes", {"status": "running"})
            )
            out["get"] = answer(await s.call_tool("get_sandbox", {"id": sid}))
            out["get_unknown"] = answer(await s.call_tool("get_sandbox", {"id": "sb_nosuch"}))
            out["bad_status"] = answer(
                await s.call_tool("list_sandboxes", {"status": "sleeping"})
            )
            out["bad_field"] = answer(
                await s.call_tool("create_sandbox", {"profile": profile, "bogus": True})
            )
            out["bad_profile"] = answer(
                await s.call_tool("create_sandbox", {"profile": "no-such-profile"})
            )
            lease = answer(
                await s.call_tool("acquire_lease", {"thread_id": "mcp-thread", "profile": profile})
            )
            out["acquire"] = lease
            out["acquire_again"] = answer(
                await s.call_tool("acquire_lease", {"thread_id": "mcp-thread", "profile": profile})
            )
            lid = (lease["structured"] or {}).get("lease_id")
            out["release"] = answer(await s.call_tool("release_lease", {"lease_id": lid}))
            out["release_unknown"] = answer(
                await s.call_tool("release_lease", {"lease_id": "ls_nosuch"})
            )
            out["delete"] = answer(await s.call_tool("delete_sandbox", {"id": sid}))
            out["list_after"] = answer(
                await s.call_tool("list_sandboxes", {"labels": {"suite": "mcp"}})
            )
    async with streamable_http_client(url, http_client=http) as (read, write):
        async with ClientSession(read, write) as s:
            await s.discover()
            out["stateless"] = {
                "protocol_version": s.protocol_version,
                "tools": sorted(t.name for t in (await s.list_tools()).tools),
            }
    return out


async def sandbox(url: str, http: httpx2.AsyncClient, x: int, y: int) -> dict:
    out = {}
    async with streamable_http_client(url, http_client=http) as (read, write):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            out["server"] = {
                "name": init.server_info.name,
                "protocol_version": init.protocol_version,
            }
            out["tools"] = sorted(t.name for t in (await s.list_tools()).tools)
            out["click"] = answer(
                await s.call_tool("computer", {"action": "left_click", "coordinate": [x, y]})
            )
            out["cursor"] = answer(await s.call_tool("computer", {"action": "cursor_position"}))
            out["screenshot"] = answer(await s.call_tool("screenshot", {}))
            out["toolset_click"] = answer(
                await s.call_tool("computer_left_click", {"coordinate": [100, 120]})
            )
            out["toolset_cursor"] = answer(await s.call_tool("computer_cursor_position", {}))
            out["toolset_screenshot"] = answer(await s.call_tool("computer_screenshot", {}))
            out["toolset_refused"] = answer(
                await s.call_tool("computer_left_click", {"coordinate": [1280, 0]})
            )
            out["browser_navigate"] = answer(
                await s.call_tool(
                    "browser_navigate", {"url": "data:text/html,<title>MCP page</title><button>Go</button>"}
                )
            )
            out["browser_find"] = answer(await s.call_tool("browser_find", {"query": "go button"}))
            out["exec"] = answer(await s.call_tool("exec", {"shell": "echo out; exit 7"}))
    async with streamable_http_client(url, http_client=http) as (read, write):
        async with ClientSession(read, write) as s:
            await s.discover()
            out["stateless"] = {
                "protocol_version": s.protocol_version,
                "exec": answer(await s.call_tool("exec", {"argv": ["echo", "stateless"]})),
            }
    return out


async def engine(url: str, http: httpx2.AsyncClient, profile: str, screen: str, x: int, y: int) -> dict:
    out = {}
    async with streamable_http_client(url, http_client=http) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            created = answer(
                await s.call_tool("create_sandbox", {"profile": profile, "screen": screen})
            )
            out["create"] = created
            if created["is_error"]:
                return out
            out["sandbox"] = await sandbox(created["structured"]["mcp_url"], http, x, y)
            out["delete"] = answer(
                await s.call_tool("delete_sandbox", {"id": created["structured"]["id"]})
            )
    return out


async def github(
    url: str, http: httpx2.AsyncClient, sid: str, repo: str, path: str, other: str
) -> dict:
    async with streamable_http_client(url, http_client=http) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            out = {
                "tools": sorted(t.name for t in (await s.list_tools()).tools),
                "repositories": answer(await s.call_tool("github_repositories", {})),
                "clone": answer(
                    await s.call_tool(
                        "github_clone_repository", {"id": sid, "repository": repo, "path": path}
                    )
                ),
            }
            out["pulls"] = answer(
                await s.call_tool("github_pull_requests", {"id": sid, "repository": repo})
            )
            out["issues"] = answer(
                await s.call_tool("github_issues", {"id": sid, "repository": repo, "state": "all"})
            )
            out["issue"] = answer(
                await s.call_tool("github_issue", {"id": sid, "repository": repo, "number": 2})
            )
            out["other"] = answer(
                await s.call_tool("github_pull_requests", {"id": sid, "repository": other})
            )
            return out


async def login(url: str, http: httpx2.AsyncClient, sites: list) -> dict:
    async with streamable_http_client(url, http_client=http) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            listed = tools_of(await s.list_tools())
            out = {"tools": sorted(listed), "login": listed.get("login")}
            out["calls"] = [
                answer(await s.call_tool("login", {"site": site})) for site in sites
            ]
            return out


async def main() -> None:
    mode, url, key = sys.argv[1], sys.argv[2], sys.argv[3]
    headers = {"X-Api-Key": key}
    # A create waits until the sandbox is ready: a cold Docker desktop takes a while.
    timeout = httpx2.Timeout(180.0)
    async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
        if mode == "controller":
            result = await controller(url, http, sys.argv[4])
        elif mode == "engine":
            x, y = int(sys.argv[6]), int(sys.argv[7])
            result = await engine(url, http, sys.argv[4], sys.argv[5], x, y)
        elif mode == "github":
            result = await github(url, http, sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7])
        elif mode == "login":
            result = await login(url, http, sys.argv[4:])
        else:
            raise SystemExit(f"unknown mode {mode!r}")
    print(json.dumps(result))


asyncio.run(main())
