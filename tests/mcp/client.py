"""Drives the agent's MCP server with the official MCP Python SDK, as an engine would.

Usage: client.py URL TOKEN WORKDIR X Y

Opens a session (the initialize handshake) with the bearer token, lists the tools, clicks at
(X, Y) with `computer` and reads the cursor back, takes a `screenshot`, runs `exec`, writes and
reads back a text and a binary file under WORKDIR, lists WORKDIR, asks for more than an answer
carries, calls tools with bad arguments, records; then a second, session-less connection (server/discover, 2026-07-28) lists the tools
and runs one command. Prints one JSON object with what it saw; the Rust test asserts on it.
"""

import asyncio
import base64
import json
import sys

import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from answers import answer


async def with_session(url: str, http: httpx2.AsyncClient, workdir: str, x: int, y: int) -> dict:
    out = {}
    async with streamable_http_client(url, http_client=http) as (read, write):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            out["server"] = {
                "name": init.server_info.name,
                "version": init.server_info.version,
                "protocol_version": init.protocol_version,
                "has_tools": init.capabilities.tools is not None,
            }
            listed = await s.list_tools()
            out["tools"] = {
                t.name: {"description": t.description, "input_schema": t.input_schema}
                for t in listed.tools
            }
            out["click"] = answer(
                await s.call_tool("computer", {"action": "left_click", "coordinate": [x, y]})
            )
            out["cursor"] = answer(await s.call_tool("computer", {"action": "cursor_position"}))
            out["screenshot"] = answer(await s.call_tool("screenshot", {}))
            out["exec"] = answer(
                await s.call_tool("exec", {"shell": "echo out; echo err >&2; exit 3"})
            )
            out["exec_argv"] = answer(
                await s.call_tool("exec", {"argv": ["printf", "%s", "a b"], "timeout_ms": 10000})
            )
            text_path = f"{workdir}/sub/dir/notes.txt"
            out["write_text"] = answer(
                await s.call_tool("write_file", {"path": text_path, "content": "héllo\nworld\n"})
            )
            out["read_text"] = answer(await s.call_tool("read_file", {"path": text_path}))
            binary = bytes(range(256))
            bin_path = f"{workdir}/blob.bin"
            out["write_binary"] = answer(
                await s.call_tool(
                    "write_file",
                    {"path": bin_path, "content": base64.b64encode(binary).decode(), "base64": True},
                )
            )
            read_bin = answer(await s.call_tool("read_file", {"path": bin_path}))
            blob = read_bin["content"][0].get("blob") if read_bin["content"] else None
            read_bin["roundtrip"] = blob is not None and base64.b64decode(blob) == binary
            out["read_binary"] = read_bin
            out["list_dir"] = answer(await s.call_tool("list_dir", {"path": workdir, "depth": 3}))
            out["missing_file"] = answer(
                await s.call_tool("read_file", {"path": f"{workdir}/no-such-file"})
            )
            out["exec_big"] = answer(
                await s.call_tool("exec", {"shell": "head -c 300000 /dev/zero | tr '\\0' a"})
            )
            big_path = f"{workdir}/big.txt"
            with open(big_path, "w") as f:
                f.write("b" * (600 << 10))
            out["read_big"] = answer(await s.call_tool("read_file", {"path": big_path}))
            out["bad_action"] = answer(await s.call_tool("computer", {"action": "fly"}))
            out["bad_args"] = answer(
                await s.call_tool("computer", {"action": "left_click", "coordinate": "middle"})
            )
            rec = answer(await s.call_tool("start_recording", {"fps": 5}))
            out["start_recording"] = rec
            if not rec["is_error"]:
                rid = rec["structured"]["id"]
                out["stop_recording"] = answer(await s.call_tool("stop_recording", {"id": rid}))
    return out


async def without_session(url: str, http: httpx2.AsyncClient) -> dict:
    out = {}
    async with streamable_http_client(url, http_client=http) as (read, write):
        async with ClientSession(read, write) as s:
            found = await s.discover()
            out["supported_versions"] = list(found.supported_versions)
            out["protocol_version"] = s.protocol_version
            out["tools"] = sorted(t.name for t in (await s.list_tools()).tools)
            out["exec"] = answer(await s.call_tool("exec", {"argv": ["echo", "stateless"]}))
    return out


async def main() -> None:
    url, token, workdir, x, y = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    headers = {"Authorization": f"Bearer {token}"}
    timeout = httpx2.Timeout(60.0)
    async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
        result = {"session": await with_session(url, http, workdir, x, y)}
        try:
            result["stateless"] = await without_session(url, http)
        except Exception as e:  # reported, and asserted on by the test
            result["stateless"] = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(result))


asyncio.run(main())
