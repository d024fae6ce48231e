"""What the toolset tests share: a deadline-bound wait, a PNG's size, hand-built ``tool_use`` blocks run
through a driver's ``tool_result()``, and a result's text."""

from __future__ import annotations

import io
import time
import uuid

from anthropic.types.beta import BetaToolUseBlock


def wait_for(what, cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def png_size(data: bytes):
    from PIL import Image

    img = Image.open(io.BytesIO(data))
    img.load()
    assert img.format == "PNG"
    return img.size


def tool_use(family: str, name: str, **input) -> BetaToolUseBlock:
    return BetaToolUseBlock(
        type="tool_use", id=f"toolu_{uuid.uuid4().hex[:16]}", name=name, input=input, toolset_name=family
    )


def texts(result):
    content = result["content"]
    return [content] if isinstance(content, str) else [b["text"] for b in content if b["type"] == "text"]
