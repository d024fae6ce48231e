"""Wire types of the controller API (see docs/src/controller/api.md and protocol/src/controller.rs).

Records are dataclasses built from the JSON the controller answers; fields the controller adds
later land in ``extra`` so an older client keeps working. Free-form objects (events, run output
chunks) are TypedDicts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional, Tuple, TypedDict
from urllib.parse import urlsplit


#: Where a sandbox is in its life (``berth_protocol::lifecycle::SandboxStatus``).
SandboxStatus = Literal["pending", "starting", "running", "stopping", "stopped", "failed"]
#: Where a run is (``RunStatus``); the last three are final.
RunStatus = Literal["pending", "running", "exited", "failed", "lost"]


def _split(cls: type, data: Dict[str, Any]) -> Dict[str, Any]:
    """Keyword arguments for ``cls`` from ``data``: known fields, the rest under ``extra``."""
    names = {f.name for f in dataclasses.fields(cls)}
    known = {k: v for k, v in data.items() if k in names and k != "extra"}
    known["extra"] = {k: v for k, v in data.items() if k not in names}
    return known


@dataclass
class Viewer:
    """``viewer``: ``kind`` is ``novnc`` or ``none``; ``url`` is stable and needs the API key."""

    kind: str
    url: Optional[str] = None

    @classmethod
    def from_json(cls, data: Optional[Dict[str, Any]]) -> "Viewer":
        data = data or {}
        return cls(kind=data.get("kind", "none"), url=data.get("url"))


@dataclass
class Endpoints:
    """How harnesses on the controller's host reach a sandbox.

    ``compat`` is the agent's OSWorld-compatible surface (port 5000 inside), ``cdp`` Chromium's
    DevTools through the agent's relay (9222 inside), ``ports`` the ports the sandbox's image
    declares, by name (``{"vlc": "http://127.0.0.1:49153"}``).
    """

    compat: Optional[str] = None
    cdp: Optional[str] = None
    ports: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Optional[Dict[str, Any]]) -> "Endpoints":
        data = dict(data or {})
        compat = data.pop("compat", None)
        cdp = data.pop("cdp", None)
        ports = {k: v for k, v in data.items() if isinstance(v, str)}
        return cls(compat=compat, cdp=cdp, ports=ports)

    def url(self, name: str) -> Optional[str]:
        """The URL of ``compat``, ``cdp`` or a declared port."""
        if name == "compat":
            return self.compat
        if name == "cdp":
            return self.cdp
        return self.ports.get(name)

    def host_port(self, name: str) -> Optional[Tuple[str, int]]:
        """``(host, port)`` of an endpoint, or None when the sandbox has no such endpoint."""
        url = self.url(name)
        if not url:
            return None
        parts = urlsplit(url)
        if parts.hostname is None or parts.port is None:
            return None
        return parts.hostname, parts.port


@dataclass
class Sandbox:
    """A sandbox record (``GET /sandbox/sandboxes/v1/{id}``)."""

    id: str
    profile: str
    status: SandboxStatus
    image_ref: str
    viewer: Viewer = field(default_factory=lambda: Viewer("none"))
    endpoints: Endpoints = field(default_factory=Endpoints)
    labels: Dict[str, str] = field(default_factory=dict)
    created_at: Optional[str] = None
    ready_at: Optional[str] = None
    expires_at: Optional[str] = None
    error: Optional[str] = None
    #: ``warm`` (from a pool) or ``cold``
    claim: Optional[str] = None
    lease_id: Optional[str] = None
    #: A desktop's screen, ``"1280x800"`` (as asked at create or by its pool)
    screen: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "Sandbox":
        kw = _split(cls, data)
        kw["viewer"] = Viewer.from_json(data.get("viewer"))
        kw["endpoints"] = Endpoints.from_json(data.get("endpoints"))
        kw["labels"] = dict(data.get("labels") or {})
        return cls(**kw)

    @property
    def running(self) -> bool:
        return self.status == "running"

    @property
    def ended(self) -> bool:
        return self.status in ("stopping", "stopped", "failed")


@dataclass
class Run:
    """A run (``POST …/{id}/exec``, ``GET …/{id}/runs/{run_id}``)."""

    id: str
    status: RunStatus
    exit_code: Optional[int] = None
    stdout: str = ""
    stderr: str = ""
    sandbox_id: str = ""
    started_at: Optional[str] = None
    ended_at: Optional[str] = None
    error: Optional[str] = None
    output_truncated: bool = False
    #: Output past the controller's inline bound: ``stdout``/``stderr`` are its first bytes,
    #: ``output_preview`` its first and last lines (``head``, ``tail``, ``bytes``,
    #: ``omitted_bytes``), and the whole is the artifact ``output_artifact`` (read by range).
    truncated: bool = False
    output_artifact: Optional[str] = None
    output_preview: Optional[Dict[str, Any]] = None
    extra: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "Run":
        kw = _split(cls, data)
        kw["stdout"] = kw.get("stdout") or ""
        kw["stderr"] = kw.get("stderr") or ""
        return cls(**kw)

    @property
    def done(self) -> bool:
        return self.status in ("exited", "failed", "lost")

    @property
    def ok(self) -> bool:
        return self.status == "exited" and self.exit_code == 0


@dataclass
class Lease:
    """A lease (``POST /sandbox/v1/leases``): one sandbox per thread, reused across its runs."""

    lease_id: str
    sandbox: Sandbox
    thread_id: str = ""
    expires_at: Optional[str] = None
    #: ``reused``, ``warm`` or ``cold``
    how: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "Lease":
        kw = _split(cls, data)
        kw["sandbox"] = Sandbox.from_json(data["sandbox"])
        return cls(**kw)


class _EventBase(TypedDict):
    seq: int
    at: Any
    kind: str


class Event(_EventBase, total=False):
    """One timeline entry: the controller's and the agent's events in one sequence (``source``:
    ``controller`` or ``agent``; the rest depends on the kind)."""

    source: str


class EventPage(TypedDict):
    events: List[Event]
    next_seq: int


class _ChunkBase(TypedDict):
    seq: int
    stream: str


class OutputChunk(_ChunkBase, total=False):
    """``seq`` is the byte offset in the run's one combined output stream; ``data`` (UTF-8) or
    ``data_b64`` (other bytes)."""

    data: str
    data_b64: str


class _OutputBase(TypedDict):
    chunks: List[OutputChunk]
    next_seq: int
    done: bool


class RunOutput(_OutputBase, total=False):
    exit_code: Optional[int]
    truncated_before_seq: int


class ComputerResult(TypedDict, total=False):
    """``POST …/{id}/computer``: the tool result engines expect."""

    output: str
    error: str
    base64_image: str
    settled_ms: int
    settle_timed_out: bool
