"""A typed, synchronous client for the berth controller (``berth serve``).

Every route is the controller's ``/sandbox/...`` API with the ``X-Api-Key`` header; every request
has a timeout; every error answer raises :class:`BerthError` with the status and the ``code`` and
``message`` of the controller's error body (``{"error": {"code", "message"}}``).
"""

from __future__ import annotations

import os
import time
from typing import IO, Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import quote

import requests

from .types import ComputerResult, Event, EventPage, Lease, Run, RunOutput, Sandbox

SANDBOXES = "/sandbox/sandboxes/v1"
LEASES = "/sandbox/v1/leases"
CATALOG = "/sandbox/v1/catalog"
API_KEY_HEADER = "X-Api-Key"
#: The seed's default gateway URL, where ``berth serve`` listens unless told otherwise.
DEFAULT_URL = "http://localhost:8780"

#: Seconds to connect, and to wait for an answer to an ordinary call.
CONNECT_TIMEOUT = 10.0
DEFAULT_TIMEOUT = 60.0
#: A create waits (bounded by the controller's ``create_timeout_secs``) until the sandbox is ready.
CREATE_TIMEOUT = 600.0
#: An exec with ``wait`` is answered within the controller's ``exec_wait_secs`` (300 by default).
EXEC_TIMEOUT = 330.0
#: File transfers stream: this bounds each read, not the whole transfer.
TRANSFER_TIMEOUT = 300.0

Timeout = Union[float, Tuple[float, float]]


class BerthError(Exception):
    """An error from the controller (or from reaching it).

    ``status`` is the HTTP status (None when the controller could not be reached or did not
    answer in time), ``code`` the error body's code (``invalid_request``, ``unauthorized``,
    ``not_found``, ``conflict``, ``unprocessable``, ``unavailable``, ``agent``, ``internal``, …;
    ``unreachable`` and ``timeout`` for transport failures), ``message`` its message.
    """

    def __init__(self, status: Optional[int], code: str, message: str, body: Any = None):
        super().__init__(f"{status or '-'} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.body = body

    @classmethod
    def from_response(cls, resp: requests.Response) -> "BerthError":
        code, message, body = "http_error", (resp.text or resp.reason or "").strip(), None
        try:
            body = resp.json()
        except ValueError:
            body = None
        if isinstance(body, dict):
            err = body.get("error")
            if isinstance(err, dict):
                code = str(err.get("code") or code)
                message = str(err.get("message") or message)
            elif isinstance(body.get("message"), str):
                message = body["message"]
        return cls(resp.status_code, code, message or f"HTTP {resp.status_code}", body)


def _env(*names: str) -> Optional[str]:
    for n in names:
        v = os.environ.get(n)
        if v:
            return v
    return None


class Client:
    """The controller API.

    ``url`` and ``api_key`` default to ``BERTH_URL`` / ``BERTH_API_KEY`` (then the seed's
    ``SANDBOX_GATEWAY_URL`` / ``SANDBOX_API_KEY``); the URL falls back to the seed's
    ``http://localhost:8780``, where ``berth serve`` listens by default.
    ``timeout`` is the read timeout of ordinary calls; creates, execs and transfers have their own
    (longer) bounds, and every call takes an explicit ``timeout=`` too.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = CONNECT_TIMEOUT,
        session: Optional[requests.Session] = None,
    ):
        self.url = (url or _env("BERTH_URL", "SANDBOX_GATEWAY_URL") or DEFAULT_URL).rstrip("/")
        self.api_key = api_key or _env("BERTH_API_KEY", "SANDBOX_API_KEY")
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.session = session or requests.Session()
        # The controller is usually on this host or a private network: no proxy in between.
        self.session.trust_env = False

    def __repr__(self) -> str:
        return f"berth.Client({self.url!r})"

    # ---- transport ----

    def _timeout(self, read: Optional[Timeout]) -> Tuple[float, float]:
        if isinstance(read, tuple):
            return read
        return (self.connect_timeout, self.timeout if read is None else read)

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Any = None,
        json: Any = None,
        data: Any = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Optional[Timeout] = None,
        stream: bool = False,
    ) -> requests.Response:
        """One call to the controller; raises :class:`BerthError` unless it answers 2xx."""
        h = dict(headers or {})
        if self.api_key:
            h[API_KEY_HEADER] = self.api_key
        try:
            resp = self.session.request(
                method,
                self.url + path,
                params=params,
                json=json,
                data=data,
                headers=h,
                timeout=self._timeout(timeout),
                stream=stream,
            )
        except requests.Timeout as e:
            raise BerthError(None, "timeout", f"{method} {path}: {e}") from e
        except requests.RequestException as e:
            raise BerthError(None, "unreachable", f"{method} {path}: {e}") from e
        if resp.status_code >= 400:
            try:
                raise BerthError.from_response(resp)
            finally:
                resp.close()
        return resp

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        resp = self.request(method, path, **kw)
        try:
            return resp.json()
        except ValueError as e:
            raise BerthError(resp.status_code, "decode", f"{method} {path}: not JSON: {resp.text[:200]!r}") from e

    @staticmethod
    def _sb(sandbox: Union[str, Sandbox]) -> str:
        return sandbox.id if isinstance(sandbox, Sandbox) else quote(sandbox, safe="")

    # ---- health ----

    def healthz(self, *, timeout: Optional[Timeout] = None) -> Dict[str, Any]:
        """``GET /healthz`` (needs no key)."""
        return self._json("GET", "/healthz", timeout=timeout)

    # ---- sandboxes ----

    def create_sandbox(
        self,
        profile: str = "desktop",
        *,
        image_ref: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        ttl_seconds: Optional[int] = None,
        screen: Optional[str] = None,
        egress: Optional[Any] = None,
        logins: Optional[Sequence[str]] = None,
        limits: Optional[Mapping[str, Any]] = None,
        wait: bool = True,
        timeout: Optional[Timeout] = None,
    ) -> Sandbox:
        """``POST /sandbox/sandboxes/v1``. With ``wait`` (the default) the controller answers once
        the sandbox is ``running`` (strict readiness for desktops) or failed; ``wait=False``
        answers at once (``starting``): then :meth:`wait_until_running`. ``screen``
        (``"1280x800"``) is a desktop's screen size, set before it counts as running. ``egress``
        is its policy (``"open"``, ``"none"`` or ``{"allow": [...], "deny_private": bool}``);
        ``logins`` the controller's ``[[login]]`` sites its run may sign its browser in to;
        ``limits`` its resources over its profile's (``{"cpus": 1.5, "memory_mb": 2048}``)."""
        body: Dict[str, Any] = {"profile": profile}
        if limits:
            body["limits"] = dict(limits)
        if egress is not None:
            body["egress"] = egress
        if logins:
            body["logins"] = list(logins)
        if screen:
            body["screen"] = screen
        if image_ref:
            body["image_ref"] = image_ref
        if labels:
            body["labels"] = dict(labels)
        if ttl_seconds is not None:
            body["ttl_seconds"] = int(ttl_seconds)
        params = None if wait else {"wait": "false"}
        data = self._json(
            "POST", SANDBOXES, params=params, json=body, timeout=CREATE_TIMEOUT if timeout is None else timeout
        )
        return Sandbox.from_json(data)

    def get_sandbox(self, sandbox: Union[str, Sandbox], *, timeout: Optional[Timeout] = None) -> Sandbox:
        return Sandbox.from_json(self._json("GET", f"{SANDBOXES}/{self._sb(sandbox)}", timeout=timeout))

    def list_sandboxes(
        self,
        labels: Optional[Mapping[str, str]] = None,
        *,
        status: Optional[str] = None,
        timeout: Optional[Timeout] = None,
    ) -> List[Sandbox]:
        """Sandboxes carrying every label in ``labels``; stopped ones only with ``status="stopped"``."""
        params: List[Tuple[str, str]] = [("label", f"{k}={v}") for k, v in (labels or {}).items()]
        if status:
            params.append(("status", status))
        data = self._json("GET", SANDBOXES, params=params, timeout=timeout)
        return [Sandbox.from_json(s) for s in data.get("sandboxes", [])]

    def delete_sandbox(self, sandbox: Union[str, Sandbox], *, timeout: Optional[Timeout] = None) -> Sandbox:
        """Destroys the sandbox (its lease ends); answers the ``stopped`` record. Idempotent."""
        return Sandbox.from_json(
            self._json("DELETE", f"{SANDBOXES}/{self._sb(sandbox)}", timeout=120.0 if timeout is None else timeout)
        )

    def wait_until_running(
        self, sandbox: Union[str, Sandbox], *, timeout: float = 300.0, interval: float = 0.5
    ) -> Sandbox:
        """Polls until the sandbox is ``running``; raises :class:`BerthError` when it fails, ends
        or is not running within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            sb = self.get_sandbox(sandbox)
            if sb.running:
                return sb
            if sb.ended:
                raise BerthError(None, "sandbox_" + sb.status, f"sandbox {sb.id} is {sb.status}: {sb.error or ''}".strip())
            if time.monotonic() >= deadline:
                raise BerthError(None, "timeout", f"sandbox {sb.id} still {sb.status} after {timeout:g} s")
            time.sleep(interval)

    def viewer_url(self, sandbox: Union[str, Sandbox], *, timeout: Optional[Timeout] = None) -> str:
        """A one-time, short-lived URL that opens the sandbox's noVNC viewer in a browser (it sets
        an HttpOnly cookie scoped to the sandbox and redirects); a second open is refused."""
        return self._json("POST", f"{SANDBOXES}/{self._sb(sandbox)}/viewer", timeout=timeout)["url"]

    # ---- runs ----

    def exec(
        self,
        sandbox: Union[str, Sandbox],
        command: Union[str, Sequence[str]],
        *,
        shell: Optional[bool] = None,
        env: Optional[Mapping[str, str]] = None,
        secrets: Optional[Mapping[str, str]] = None,
        timeout_ms: Optional[int] = None,
        wait: bool = True,
        run_id: Optional[str] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        timeout: Optional[Timeout] = None,
    ) -> Run:
        """``POST …/{id}/exec``: an argv list runs directly, a string with ``sh -c``. With ``wait``
        the answer carries ``stdout``/``stderr``/``exit_code`` unless the run outlasts the
        controller's bound (then :meth:`wait_run`). A repeated ``run_id`` returns the same run.
        ``secrets`` join the run's environment and appear in no answer, event or log. ``user``
        runs it as another account of the sandbox (``"root"``)."""
        body: Dict[str, Any] = {"command": command if isinstance(command, str) else list(command)}
        if shell is not None:
            body["shell"] = shell
        if env:
            body["env"] = dict(env)
        if secrets:
            body["secrets"] = dict(secrets)
        if timeout_ms is not None:
            body["timeout_ms"] = int(timeout_ms)
        if not wait:
            body["wait"] = False
        if run_id:
            body["run_id"] = run_id
        if cwd:
            body["cwd"] = cwd
        if user is not None:
            body["user"] = str(user)
        if timeout is None:
            timeout = EXEC_TIMEOUT + (timeout_ms or 0) / 1000.0 if wait else self.timeout
        data = self._json("POST", f"{SANDBOXES}/{self._sb(sandbox)}/exec", json=body, timeout=timeout)
        return Run.from_json(data)

    def get_run(self, sandbox: Union[str, Sandbox], run_id: str, *, timeout: Optional[Timeout] = None) -> Run:
        """The run at any time, also after a controller restart or the sandbox's end."""
        path = f"{SANDBOXES}/{self._sb(sandbox)}/runs/{quote(run_id, safe='')}"
        return Run.from_json(self._json("GET", path, timeout=timeout))

    def run_output(
        self, sandbox: Union[str, Sandbox], run_id: str, from_seq: int = 0, *, timeout: Optional[Timeout] = None
    ) -> RunOutput:
        """Output chunks from byte offset ``from_seq`` (the agent's chunk format)."""
        path = f"{SANDBOXES}/{self._sb(sandbox)}/runs/{quote(run_id, safe='')}/output"
        return self._json("GET", path, params={"from_seq": int(from_seq)}, timeout=timeout)

    def wait_run(
        self, sandbox: Union[str, Sandbox], run_id: str, *, timeout: float = 600.0, interval: float = 0.5
    ) -> Run:
        """Polls until the run has ended (``exited``, ``failed`` or ``lost``)."""
        deadline = time.monotonic() + timeout
        while True:
            run = self.get_run(sandbox, run_id)
            if run.done:
                return run
            if time.monotonic() >= deadline:
                raise BerthError(None, "timeout", f"run {run_id} still {run.status} after {timeout:g} s")
            time.sleep(interval)

    # ---- files ----

    def read_file(self, sandbox: Union[str, Sandbox], path: str, *, timeout: Optional[Timeout] = None) -> bytes:
        """The file's bytes (``GET …/{id}/files?path=``)."""
        resp = self.request(
            "GET",
            f"{SANDBOXES}/{self._sb(sandbox)}/files",
            params={"path": path},
            timeout=TRANSFER_TIMEOUT if timeout is None else timeout,
        )
        return resp.content

    def download_file(
        self,
        sandbox: Union[str, Sandbox],
        path: str,
        dest: Union[str, "os.PathLike[str]"],
        *,
        chunk_size: int = 1 << 20,
        timeout: Optional[Timeout] = None,
    ) -> int:
        """Streams a file to ``dest`` on this machine; answers the bytes written."""
        resp = self.request(
            "GET",
            f"{SANDBOXES}/{self._sb(sandbox)}/files",
            params={"path": path},
            timeout=TRANSFER_TIMEOUT if timeout is None else timeout,
            stream=True,
        )
        n = 0
        with resp, open(dest, "wb") as f:
            for chunk in resp.iter_content(chunk_size):
                f.write(chunk)
                n += len(chunk)
        return n

    def write_file(
        self,
        sandbox: Union[str, Sandbox],
        path: str,
        data: Union[bytes, str, IO[bytes]],
        *,
        mode: Optional[Union[int, str]] = None,
        timeout: Optional[Timeout] = None,
    ) -> Any:
        """Uploads ``data`` (bytes, text or a binary file object, streamed) to ``path``: atomic,
        parents created, owned by the sandbox user; ``mode`` like ``0o644`` or ``"644"``."""
        params: Dict[str, str] = {"path": path}
        if mode is not None:
            params["mode"] = format(mode, "o") if isinstance(mode, int) else str(mode)
        body = data.encode() if isinstance(data, str) else data
        resp = self.request(
            "PUT",
            f"{SANDBOXES}/{self._sb(sandbox)}/files",
            params=params,
            data=body,
            headers={"Content-Type": "application/octet-stream"},
            timeout=TRANSFER_TIMEOUT if timeout is None else timeout,
        )
        try:
            return resp.json()
        except ValueError:
            return None

    def desktop_state(self, sandbox: Union[str, Sandbox], *, timeout: Optional[Timeout] = None) -> Dict[str, Any]:
        """``GET …/{id}/v1/desktop/state``: the session, theme, dock, default applications,
        windows, first-run state, programs, volume and time zone, with the image's expected
        state and ``fidelity``: one ``{"item", "ok", "expected", "actual"}`` per expected item."""
        return self._json("GET", f"{SANDBOXES}/{self._sb(sandbox)}/v1/desktop/state", timeout=timeout)

    # ---- screen and input ----

    def screenshot(
        self,
        sandbox: Union[str, Sandbox],
        *,
        format: str = "png",
        timeout: Optional[Timeout] = None,
        **params: Any,
    ) -> bytes:
        """The screen (``png``, ``jpeg`` or ``webp``); other query parameters of the agent's
        ``/v1/screenshot`` pass through (``quality``, ``scale``, ``region="x,y,w,h"``,
        ``cursor``, ``settle_ms``, ``timeout_ms``)."""
        q: Dict[str, Any] = {"format": format}
        for k, v in params.items():
            q[k] = ("true" if v else "false") if isinstance(v, bool) else v
        return self.request("GET", f"{SANDBOXES}/{self._sb(sandbox)}/screenshot", params=q, timeout=timeout).content

    def computer(
        self,
        sandbox: Union[str, Sandbox],
        action: Union[str, Mapping[str, Any]],
        *,
        timeout: Optional[Timeout] = None,
        **fields: Any,
    ) -> ComputerResult:
        """One computer-use tool input (``POST …/{id}/computer``): the object engines emit, e.g.
        ``{"action": "left_click", "coordinate": [100, 200]}``, or the action name with its fields
        as keywords: ``computer(sb, "type", text="hi")``. Answers ``{output?, error?,
        base64_image?}`` with the settled screen."""
        body = {"action": action, **fields} if isinstance(action, str) else {**dict(action), **fields}
        return self._json(
            "POST", f"{SANDBOXES}/{self._sb(sandbox)}/computer", json=body, timeout=300.0 if timeout is None else timeout
        )

    # ---- events ----

    def events(
        self,
        sandbox: Union[str, Sandbox],
        from_seq: int = 0,
        *,
        limit: Optional[int] = None,
        timeout: Optional[Timeout] = None,
    ) -> EventPage:
        """One page of the sandbox's timeline from ``from_seq``: ``{"events": [...], "next_seq"}``."""
        params: Dict[str, int] = {"from_seq": int(from_seq)}
        if limit is not None:
            params["limit"] = int(limit)
        return self._json("GET", f"{SANDBOXES}/{self._sb(sandbox)}/events", params=params, timeout=timeout)

    def stream_events(
        self,
        sandbox: Union[str, Sandbox],
        from_seq: int = 0,
        *,
        poll_interval: float = 1.0,
        timeout: Optional[float] = None,
        stop_when_ended: bool = True,
    ) -> Iterator[Event]:
        """The timeline as it grows: every event from ``from_seq`` on, in order, polling for new
        ones. Ends after ``timeout`` seconds (None: never), or once the sandbox has ended and its
        last events are out (``stop_when_ended``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        seq = from_seq
        while True:
            page = self.events(sandbox, seq)
            for e in page["events"]:
                yield e
            seq = page.get("next_seq", seq)
            if page["events"]:
                continue
            if stop_when_ended and self.get_sandbox(sandbox).ended:
                page = self.events(sandbox, seq)
                for e in page["events"]:
                    yield e
                return
            if deadline is not None and time.monotonic() >= deadline:
                return
            time.sleep(poll_interval)

    # ---- the login tool ----

    def login_sites(self, sandbox: Union[str, Sandbox], *, timeout: Optional[Timeout] = None) -> Dict[str, Any]:
        """``GET …/{id}/login``: ``{"run", "sites": [{"name", "host", "url", "uses", "max_uses"}]}``,
        the sites the sandbox's run may sign its browser in to."""
        return self._json("GET", f"{SANDBOXES}/{self._sb(sandbox)}/login", timeout=timeout)

    def login(self, sandbox: Union[str, Sandbox], site: str, *, timeout: Optional[Timeout] = None) -> Dict[str, Any]:
        """``POST …/{id}/login``: signs the sandbox's browser in to ``site`` with the values the
        controller holds: ``{"site", "outcome", "message", "signed_in", "run", "uses",
        "max_uses"}``. A refusal (not enabled, host off the allow list, past the count) raises
        :class:`BerthError` with its code."""
        return self._json(
            "POST",
            f"{SANDBOXES}/{self._sb(sandbox)}/login",
            json={"site": site},
            timeout=180.0 if timeout is None else timeout,
        )

    # ---- leases ----

    def acquire_lease(
        self,
        thread_id: str,
        profile: str = "desktop",
        *,
        image_ref: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        ttl_seconds: Optional[int] = None,
        screen: Optional[str] = None,
        human_control: Optional[bool] = None,
        egress: Optional[Any] = None,
        logins: Optional[Sequence[str]] = None,
        timeout: Optional[Timeout] = None,
    ) -> Lease:
        """``POST /sandbox/v1/leases``: the thread's sandbox (the same lease comes back for the
        same ``thread_id``; a stale sandbox is replaced; a reused one is resized to ``screen``).
        ``human_control`` lets its agent ask for a person (``request_human_control``); ``egress``
        is a new sandbox's policy (a reused one must have the same); ``logins`` the
        ``[[login]]`` sites this run (this acquire) may sign the browser in to: the last run's
        are forgotten."""
        body: Dict[str, Any] = {"thread_id": thread_id, "profile": profile}
        if egress is not None:
            body["egress"] = egress
        if logins:
            body["logins"] = list(logins)
        if human_control is not None:
            body["human_control"] = bool(human_control)
        if screen:
            body["screen"] = screen
        if image_ref:
            body["image_ref"] = image_ref
        if labels:
            body["labels"] = dict(labels)
        if ttl_seconds is not None:
            body["ttl_seconds"] = int(ttl_seconds)
        data = self._json("POST", LEASES, json=body, timeout=CREATE_TIMEOUT if timeout is None else timeout)
        return Lease.from_json(data)

    def renew_lease(self, lease_id: str, ttl_seconds: int, *, timeout: Optional[Timeout] = None) -> Lease:
        """Extend-only: the later of now + ``ttl_seconds`` (clamped) and the current expiry."""
        data = self._json(
            "POST", f"{LEASES}/{quote(lease_id, safe='')}/renew", json={"ttl_seconds": int(ttl_seconds)}, timeout=timeout
        )
        return Lease.from_json(data)

    def release_lease(self, lease_id: str, *, timeout: Optional[Timeout] = None) -> Dict[str, Any]:
        """Releases the lease and destroys its sandbox."""
        return self._json("DELETE", f"{LEASES}/{quote(lease_id, safe='')}", timeout=120.0 if timeout is None else timeout)

    # ---- catalog ----

    # ---- images ----

    def build_image(
        self,
        *,
        from_image: Optional[str] = None,
        dockerfile: Optional[str] = None,
        profile: Optional[str] = None,
        wait: bool = True,
        timeout: float = 1800.0,
        interval: float = 1.0,
    ) -> Dict[str, Any]:
        """``POST …/images/build``: ``from_image`` (an image in the controller's engine) or
        ``dockerfile`` (a build context on the controller's host) with the agent put in, or a
        recipe's ``profile``. With ``wait`` it polls the job until the image is ``ready`` and
        raises :class:`BerthError` (``image_build_failed``) with the build's reason when it fails."""
        body: Dict[str, Any] = {}
        if from_image:
            body["from"] = from_image
        if dockerfile:
            body["dockerfile"] = str(dockerfile)
        if profile:
            body["profile"] = profile
        job = self._json("POST", f"{SANDBOXES}/images/build", json=body, timeout=timeout)
        deadline = time.monotonic() + timeout
        while wait and job.get("status") == "building":
            if time.monotonic() >= deadline:
                raise BerthError(None, "timeout", f"image {job.get('image_ref')} still building after {timeout:g} s")
            time.sleep(interval)
            job = self.image_job(job["image_ref"])
        if wait and job.get("status") == "failed":
            raise BerthError(None, "image_build_failed", job.get("error") or "the image build failed", job)
        return job

    def image_job(self, image_ref: str, *, timeout: Optional[Timeout] = None) -> Dict[str, Any]:
        """``GET …/images/{image_ref}``: the build job of that image (``building``, ``ready``, ``failed``)."""
        return self._json("GET", f"{SANDBOXES}/images/{quote(image_ref, safe='')}", timeout=timeout)

    def catalog(self, kind: str = "profile", *, timeout: Optional[Timeout] = None) -> List[Dict[str, Any]]:
        """``profile``, ``desktop_app`` or ``desktop_app_bundle`` entries."""
        return self._json("GET", CATALOG, params={"kind": kind}, timeout=timeout)["items"]
