"""Drivers for the ``anthropic`` SDK's toolsets (``pip install anthropic>=2.10``): Anthropic's
computer toolset (``computer_toolset_20260801``) and browser toolset (``browser_toolset_20260801``)
run in a berth sandbox.

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

``BrowserToolset(sb)`` drives the sandbox's own Chromium the same way (``POST
…/v1/toolsets/browser``, over CDP in the guest): the agent answers each member with its result and
the ``browser_state`` block (tabs, the active one, tabs opened and downloads), which the driver
reports to the SDK as its ``_browser_state``; element references (``ref_7``) come from ``read_page``
and ``find``. The optional members (``javascript_exec``, ``read_console``, ``read_network``,
``file_upload``) are served only when the sandbox's agent enables them, and the SDK asks for a
``confirm`` for the first two kinds.

``confirm`` defaults to allowing every call: the SDK asks for one because keyboard input
normally reaches the operator's own machine, and here it reaches the sandbox's isolated desktop.
Pass your own to gate ``type``, ``key`` and ``hold_key`` anyway.

While a person has the controls of the desktop (the session view's "Take control"), the sandbox
refuses the agent (409 ``human_in_control``): a member call then raises the SDK's ``ToolError``
``human_in_control: <the sandbox's message>``, an ``is_error`` ``tool_result`` the model reads.
After the person hands back, the first computer ``tool_result`` starts with the sandbox's notice,
a text block ("The screen changed: a person had the controls…") and an image block (the screen
now). A member can return the SDK only one line or one image, so the driver adds both blocks in
front of the content the SDK's pipeline renders (``_toolset_run``, after its checks and
``confirm``): the model reads the notice, sees the screen, then the member's own result.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from anthropic.tools import ToolError
from anthropic.tools.computer import (
    BetaAbstractComputerToolset20260801,
    BetaAsyncAbstractComputerToolset20260801,
    BetaComputerCursorPositionResult,
    BetaScreenshotResult,
    BetaToolsetCallContext,
)

from anthropic.tools.browser import (
    BetaAbstractBrowserToolset20260801,
    BetaAsyncAbstractBrowserToolset20260801,
    BetaBrowserNavigateResult,
    BetaBrowserState,
    BetaDialogDismissed,
)

from .client import SANDBOXES, BerthError, Client
from .types import Sandbox

__all__ = ["ComputerToolset", "AsyncComputerToolset", "BrowserToolset", "AsyncBrowserToolset", "allow_all"]

FAMILY = "computer"
BROWSER = "browser"
_NAVIGATED = re.compile(r"^Navigated to (.*?)(?: \u2014 (.*?))?(?: \(HTTP (\d+)\))?$", re.S)
_DIALOG = re.compile(r'^An? (.+?)(?: dialog)?( ".*")? was dismissed\.$', re.S)
_POINT = re.compile(r"^X=(-?\d+),Y=(-?\d+)$")
#: How the sandbox's notice starts, on the first computer ``tool_result`` after a person handed control back.
NOTICE = "The screen changed: a person had the controls"


def allow_all(context: Any) -> bool:
    """The default ``confirm``: every call runs (the sandbox is the boundary)."""
    return True


def _split_notice(content: Any) -> Tuple[List[Dict[str, Any]], Any]:
    """``(notice, own)``: the notice's text and image blocks when ``content`` starts with them, and the member's own
    content after them; ``([], content)`` otherwise."""
    if (
        isinstance(content, list)
        and len(content) >= 2
        and content[0].get("type") == "text"
        and str(content[0].get("text", "")).startswith(NOTICE)
        and content[1].get("type") == "image"
    ):
        return list(content[:2]), content[2:]
    return [], content


class _Forwarder:
    """Sends one member call to the sandbox and turns its ``tool_result`` into the member's return."""

    def __init__(
        self, sandbox: Union[str, Sandbox], client: Optional[Client], timeout: float, family: str = FAMILY
    ) -> None:
        self.client = client or Client()
        self.sandbox = Client._sb(sandbox)
        self.timeout = timeout
        self.family = family
        #: The hand-back notice of the last computer call, for the toolset to put before the SDK's content.
        self.notice: List[Dict[str, Any]] = []

    def take_notice(self) -> List[Dict[str, Any]]:
        notice, self.notice = self.notice, []
        return notice

    def path(self) -> str:
        return f"{SANDBOXES}/{self.sandbox}/v1/toolsets/{self.family}"

    def info(self) -> Dict[str, Any]:
        return self.client._json("GET", self.path(), timeout=self.timeout)

    def turn(self, content: List[Mapping[str, Any]]) -> List[Dict[str, Any]]:
        answer = self.client._json("POST", self.path(), json={"content": list(content)}, timeout=self.timeout)
        return answer["content"]

    def one(self, context: BetaToolsetCallContext, name: str) -> Dict[str, Any]:
        """The ``tool_result`` of one member call, as the agent answers it."""
        tool_use = context.tool_use
        block = {
            "type": "tool_use",
            "id": tool_use.id,
            "name": name,
            "toolset_name": self.family,
            # What the model sent, as it sent it: the agent checks it against the same types.
            "input": dict(tool_use.input) if isinstance(tool_use.input, Mapping) else tool_use.input,
        }
        try:
            (result,) = self.turn([block])
        except BerthError as e:
            if e.status == 409 and e.code == "human_in_control":
                # A person has the controls: the model reads why, and may wait or ask.
                raise ToolError(f"human_in_control: {e.message}") from e
            raise
        return result

    def call(self, context: BetaToolsetCallContext, name: str) -> Any:
        result = self.one(context, name)
        notice, content = _split_notice(result.get("content"))
        texts = [b["text"] for b in content or [] if isinstance(b, dict) and b.get("type") == "text"]
        if result.get("is_error"):
            # An error result carries text only (the SDK drops images from it): the notice's text leads.
            texts = [b["text"] for b in notice if b.get("type") == "text"] + texts
            raise ToolError(" ".join(texts) if texts else str(content))
        self.notice = notice
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


class _Driver:
    """The constructor every driver shares: the sandbox and client, then the SDK's own options."""

    _forwarder: Any = _Forwarder

    def __init__(
        self,
        sandbox: Union[str, Sandbox],
        client: Optional[Client] = None,
        *,
        configs: Any = None,
        confirm: Any = allow_all,
        tool_configs: Any = None,
        timeout: float = 300.0,
        **options: Any,
    ) -> None:
        super().__init__(configs=configs, confirm=confirm, tool_configs=tool_configs, **options)  # type: ignore[call-arg]
        self._berth = type(self)._forwarder(sandbox, client, timeout)


class ComputerToolset(_Driver, BetaAbstractComputerToolset20260801):
    """Anthropic's computer toolset on a berth sandbox's desktop, for ``anthropic.Anthropic``.

    ``sandbox`` is a :class:`berth.Sandbox` or its id; ``client`` a :class:`berth.Client`
    (default: from ``BERTH_URL`` and ``BERTH_API_KEY``). ``configs``, ``confirm`` and
    ``tool_configs`` are the SDK's own options."""

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

    def _toolset_run(self, context: BetaToolsetCallContext, name: str, input: Mapping[str, object]) -> Any:
        # The SDK's pipeline renders the member's result; a hand-back notice goes in front of it.
        self._berth.notice = []
        content = super()._toolset_run(context, name, input)
        return [*self._berth.take_notice(), *content]


class AsyncComputerToolset(_Driver, BetaAsyncAbstractComputerToolset20260801):
    """:class:`ComputerToolset` for ``anthropic.AsyncAnthropic``."""

    async def info(self) -> Dict[str, Any]:
        return await asyncio.to_thread(self._berth.info)

    async def execute(self, context: BetaToolsetCallContext, name: Any, input: Any) -> Any:
        return await asyncio.to_thread(self._berth.call, context, name)

    async def _toolset_run(self, context: BetaToolsetCallContext, name: str, input: Mapping[str, object]) -> Any:
        self._berth.notice = []
        content = await super()._toolset_run(context, name, input)
        return [*self._berth.take_notice(), *content]


class _BrowserForwarder(_Forwarder):
    """A browser member's ``tool_result`` turned back into what the SDK's abstract class expects, and the last
    ``browser_state`` block kept for ``_browser_state``."""

    def __init__(self, sandbox: Union[str, Sandbox], client: Optional[Client], timeout: float) -> None:
        super().__init__(sandbox, client, timeout, BROWSER)
        self.tabs: List[Dict[str, Any]] = []
        self.changes: List[Any] = []

    def state(self) -> BetaBrowserState:
        changes, self.changes = self.changes, []
        return BetaBrowserState(tabs=list(self.tabs), state_changes=changes)

    def call(self, context: BetaToolsetCallContext, name: str) -> Any:
        result = self.one(context, name)
        content = result.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": str(content)}]
        texts = [b["text"] for b in blocks if b.get("type") == "text"]
        # The agent's lines for dismissed dialogs go back to the SDK as state changes: it words them itself.
        dialogs = [m for m in (_DIALOG.match(x) for x in texts) if m is not None]
        texts = [x for x in texts if _DIALOG.match(x) is None]
        for m in dialogs:
            kind = m.group(1)
            message = json.loads(m.group(2).strip()) if m.group(2) else ""
            self.changes.append(BetaDialogDismissed(kind=kind, message=message))
        for block in blocks:
            if block.get("type") == "browser_state":
                self.tabs = list(block.get("tabs", []))
                self.changes.extend(block.get("state_changes", []))
        if result.get("is_error"):
            raise ToolError(texts[0] if texts else str(content))
        if name == "navigate":
            m = _NAVIGATED.match(texts[0] if texts else "")
            if m is None:
                raise ToolError("The navigation's result could not be read.")
            status = int(m.group(3)) if m.group(3) else None
            return BetaBrowserNavigateResult(url=m.group(1), title=m.group(2), status=status)
        if name in ("screenshot", "zoom"):
            (image,) = [b for b in blocks if b.get("type") == "image"]
            source = image["source"]
            return BetaScreenshotResult(data=source["data"], media_type=source["media_type"])
        if name in ("read_page", "find", "get_page_text", "read_console", "read_network", "javascript_exec"):
            text = texts[0] if texts else ""
            return "" if text == "(empty)" else text
        if name in ("new_tab", "switch_tab"):
            (active,) = [t for t in self.tabs if t.get("active")]
            return active
        if name == "list_tabs":
            return list(self.tabs)
        return None


class _BrowserMembers:
    """Every member forwarded (a subclass of the SDK's abstract class serves what it overrides)."""

    _berth: _BrowserForwarder

    def info(self) -> Dict[str, Any]:
        """``GET …/v1/toolsets/browser``: the ``tools[]`` entry, the members the sandbox serves, and the active
        tab's viewport and the screenshot size member coordinates are in."""
        return self._berth.info()

    def turn(self, content: List[Mapping[str, Any]]) -> List[Dict[str, Any]]:
        """A whole model turn's content in one request: its browser ``tool_use`` blocks run in order in the
        sandbox, answered with their ``tool_result`` blocks (the SDK's hooks do not run on this path)."""
        return self._berth.turn(content)


def _forward(name: str) -> Any:
    def member(self: Any, context: BetaToolsetCallContext, input: Any) -> Any:
        return self._berth.call(context, name)

    member.__name__ = name
    return member


def _forward_async(name: str) -> Any:
    async def member(self: Any, context: BetaToolsetCallContext, input: Any) -> Any:
        return await asyncio.to_thread(self._berth.call, context, name)

    member.__name__ = name
    return member


_DEFAULT_MEMBERS = (
    "navigate", "screenshot", "zoom", "left_click", "right_click", "middle_click", "double_click",
    "triple_click", "hover", "left_click_drag", "left_mouse_down", "left_mouse_up", "mouse_move", "scroll",
    "scroll_to", "type", "key", "hold_key", "form_input", "read_page", "find", "get_page_text", "wait",
    "new_tab", "list_tabs", "switch_tab", "close_tab",
)
_OPTIONAL_MEMBERS = ("javascript_exec", "file_upload", "read_console", "read_network")


class BrowserToolset(_Driver, _BrowserMembers, BetaAbstractBrowserToolset20260801):
    """Anthropic's browser toolset on a berth sandbox's Chromium, for ``anthropic.Anthropic``.

    ``sandbox`` is a :class:`berth.Sandbox` or its id; ``client`` a :class:`berth.Client`. ``configs``,
    ``confirm``, ``url_policy`` and ``tool_configs`` are the SDK's own options; the optional members are
    served when ``configs`` enables them (and the sandbox's agent does)."""

    _forwarder = _BrowserForwarder

    def _browser_state(self, context: BetaToolsetCallContext) -> BetaBrowserState:
        return self._berth.state()


class AsyncBrowserToolset(_Driver, _BrowserMembers, BetaAsyncAbstractBrowserToolset20260801):
    """:class:`BrowserToolset` for ``anthropic.AsyncAnthropic``."""

    _forwarder = _BrowserForwarder

    async def _browser_state(self, context: BetaToolsetCallContext) -> BetaBrowserState:
        return self._berth.state()


for _name in (*_DEFAULT_MEMBERS, *_OPTIONAL_MEMBERS):
    setattr(BrowserToolset, _name, _forward(_name))
    setattr(AsyncBrowserToolset, _name, _forward_async(_name))
del _name
