"""What an MCP tool answered, as plain JSON the Rust tests assert on; shared by the MCP clients
(tests/mcp/client.py, tests/mcp_controller/client.py)."""

import base64
import struct


def png_size(data: bytes) -> list:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return [width, height]


def blocks(result) -> list:
    out = []
    for c in result.content:
        if c.type == "text":
            out.append({"type": "text", "text": c.text})
        elif c.type == "image":
            data = base64.b64decode(c.data)
            out.append({"type": "image", "mime_type": c.mime_type, "size": png_size(data)})
        elif c.type == "resource":
            r = c.resource
            out.append({
                "type": "resource",
                "uri": r.uri,
                "mime_type": r.mime_type,
                "blob": getattr(r, "blob", None),
            })
        else:
            out.append({"type": c.type})
    return out


def answer(result) -> dict:
    return {
        "is_error": bool(result.is_error),
        "content": blocks(result),
        "structured": result.structured_content,
    }
