"""Drivers for the ``anthropic`` SDK's toolsets (``pip install anthropic>=2.10``): Anthropic's
computer toolset (``computer_toolset_20260801``) run in a berth sandbox.

    import anthropic, berth
    from berth.anthropic import ComputerToolset
    sb = berth.Client().create_sandbox("desktop")
    computer = ComputerToolset(sb)
    runner = anthropic.Anthropic().beta.messages.tool_runner(
        model="claude-opus-4-5", max_tokens=4096, tools=[computer],
        messages=[{"role": "user", "content": "Open a terminal"}])

Each member call the SDK runs goes to the sandbox's agent (``POST …/{id}/v1/toolsets/computer``),
which runs it on the desktop and answers the ``tool_result`` the SDK would have built; the driver
hands the SDK what its abstract class expects back (nothing for a pure action, the image for
``screenshot`` and ``zoom``, the point for ``cursor_position``), so the SDK's own rendering,
``confirm`` hook, halting and bounds all apply unchanged. Coordinates are in the toolset's
screenshot pixels (``info()``: the display fitted to the model's image limits).

``confirm`` defaults to allowing every call: the SDK asks for one because keyboard input
normally reaches the operator's own machine, and here it reaches the sandbox's isolated desktop.
Pass your own to gate ``type``, ``key`` and ``hold_key`` anyway.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, Dict, List, Mapping, Optional, Union

from anthropic.tools import ToolError
from anthropic.tools.computer import (
    BetaAbstractComputerToolset20260801,
    BetaAsyncAbstractComputerToolset20260801,
    BetaComputerCursorPositionResult,
    BetaScreenshotResult,
    BetaToolsetCallContext,
)

from .client import SANDBOXES, Client
from .types import Sandbox

__all__ = ["ComputerToolset", "AsyncComputerToolset", "allow_all"]

FAMILY = "computer"
_POINT = re.compile(r"^X=(-?\d+),Y=(-?\d+)$")


def allow_all(context: Any) -> bool:
    """The default ``confirm``: every call runs (the sandbox is the boundary)."""
    return True


class _Forwarder:
    """Sends one member call to the sandbox and turns its ``tool_result`` into the member's return."""

    def __init__(self, sandbox: Union[str, Sandbox], client: Optional[Client], timeout: float) -> None:
        self.client = client or Client()
        self.sandbox = Client._sb(sandbox)
        self.timeout = timeout

    def path(self) -> str:
        return f"{SANDBOXES}/{self.sandbox}/v1/toolsets/{FAMILY}"

    def info(self) -> Dict[str, Any]:
        return self.client._json("GET", self.path(), timeout=self.timeout)

    def turn(self, content: List[Mapping[str, Any]]) -> List[Dict[str, Any]]:
        answer = self.client._json("POST", self.path(), json={"content": list(content)}, timeout=self.timeout)
        return answer["content"]

    def call(self, context: BetaToolsetCallContext, name: str) -> Any:
        tool_use = context.tool_use
        block = {
            "type": "tool_use",
            "id": tool_use.id,
            "name": name,
            "toolset_name": FAMILY,
            # What the model sent, as it sent it: the agent checks it against the same types.
            "input": dict(tool_use.input) if isinstance(tool_use.input, Mapping) else tool_use.input,
        }
        (result,) = self.turn([block])
        content = result.get("content")
        texts = [b["text"] for b in content or [] if isinstance(b, dict) and b.get("type") == "text"]
        if result.get("is_error"):
            raise ToolError(" ".join(texts) if texts else str(content))
        if name in ("screenshot", "zoom"):
            (image,) = [b for b in content if b.get("type") == "image"]
            source = image["source"]
            return BetaScreenshotResult(data=source["data"], media_type=source["media_type"])
        if name == "cursor_position":
            match = _POINT.match(texts[0] if texts else "")
            if match is None:
                raise ToolError("The cursor position could not be read.")
            return BetaComputerCursorPositionResult(x=int(match.group(1)), y=int(match.group(2)))
        # A pure action: the SDK renders its own acknowledgment; a second line is the agent's own.
        return texts[1] if len(texts) > 1 else None


class ComputerToolset(BetaAbstractComputerToolset20260801):
    """Anthropic's computer toolset on a berth sandbox's desktop, for ``anthropic.Anthropic``.

    ``sandbox`` is a :class:`berth.Sandbox` or its id; ``client`` a :class:`berth.Client`
    (default: from ``BERTH_URL`` and ``BERTH_API_KEY``). ``configs``, ``confirm`` and
    ``tool_configs`` are the SDK's own options."""

    def __init__(
        self,
        sandbox: Union[str, Sandbox],
        client: Optional[Client] = None,
        *,
        configs: Any = None,
        confirm: Any = allow_all,
        tool_configs: Any = None,
        timeout: float = 300.0,
    ) -> None:
        super().__init__(configs=configs, confirm=confirm, tool_configs=tool_configs)
        self._berth = _Forwarder(sandbox, client, timeout)

    def info(self) -> Dict[str, Any]:
        """``GET …/v1/toolsets/computer``: the ``tools[]`` entry, the display and the screenshot
        size member coordinates are in."""
        return self._berth.info()

    def turn(self, content: List[Mapping[str, Any]]) -> List[Dict[str, Any]]:
        """A whole model turn's content in one request: its computer ``tool_use`` blocks run in
        order on the sandbox, answered with their ``tool_result`` blocks (the SDK's ``confirm``
        does not run on this path)."""
        return self._berth.turn(content)

    def execute(self, context: BetaToolsetCallContext, name: Any, input: Any) -> Any:
        return self._berth.call(context, name)


class AsyncComputerToolset(BetaAsyncAbstractComputerToolset20260801):
    """:class:`ComputerToolset` for ``anthropic.AsyncAnthropic``."""

    def __init__(
        self,
        sandbox: Union[str, Sandbox],
        client: Optional[Client] = None,
        *,
        configs: Any = None,
        confirm: Any = allow_all,
        tool_configs: Any = None,
        timeout: float = 300.0,
    ) -> None:
        super().__init__(configs=configs, confirm=confirm, tool_configs=tool_configs)
        self._berth = _Forwarder(sandbox, client, timeout)

    async def info(self) -> Dict[str, Any]:
        return await asyncio.to_thread(self._berth.info)

    async def execute(self, context: BetaToolsetCallContext, name: Any, input: Any) -> Any:
        return await asyncio.to_thread(self._berth.call, context, name)
