"""OSWorld's ``DesktopEnv`` on berth: a ``Provider`` and a ``VMManager`` for
``desktop_env.providers.base``, and one call that makes ``provider_name="berth"`` use them.

    import berth.osworld
    berth.osworld.register()                 # BERTH_URL / BERTH_API_KEY, profile "desktop"

    from desktop_env.desktop_env import DesktopEnv
    env = DesktopEnv(provider_name="berth", action_space="pyautogui")
    obs = env.reset(task_config=task)        # a fresh berth desktop sandbox per env
    obs, reward, done, info = env.step("pyautogui.click(960, 540)")
    score = env.evaluate()
    env.close()                              # deletes the sandbox

Each ``DesktopEnv`` gets its own sandbox; OSWorld's controllers reach its compat surface (the
agent's :5000), Chromium's DevTools (:9222) and the image's declared ports (``vlc``) through the
loopback ports the controller publishes, so any number of envs run side by side without a port
clash. An episode reset (``revert_to_snapshot``) deletes the sandbox and creates a new one from
the same ``image_ref``; ``stop_emulator`` (``env.close()``) deletes it.

``path_to_vm`` may be a profile name (``"desktop"``, the default), an ``image_ref``
(``"berth-desktop:…"``, run with the registered profile) or ``"berth-sandbox:<id>"`` — the form
``revert_to_snapshot`` answers — to drive an existing sandbox.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import re
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import requests

from .client import BerthError, Client
from .types import Sandbox

try:
    from desktop_env.providers.base import Provider as _OSWorldProvider
    from desktop_env.providers.base import VMManager as _OSWorldVMManager
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "berth.osworld needs OSWorld's desktop_env package: pip install desktop-env "
        "(or `pip install --no-deps desktop-env` plus the modules your tasks import)"
    ) from e

logger = logging.getLogger("berth.osworld")

PROVIDER_NAME = "berth"
DEFAULT_PROFILE = "desktop"
#: ``path_to_vm`` of a sandbox this provider made (what ``revert_to_snapshot`` answers).
SANDBOX_PATH_PREFIX = "berth-sandbox:"
#: Between a VM path and the screen it asks for (``desktop@1280x800``).
SCREEN_SEP = "@"
#: How long to wait for a sandbox's compat surface to answer ``/screenshot`` from this host.
COMPAT_WAIT_SECS = 120.0


class DesktopMismatch(BerthError):
    """A fresh sandbox's desktop differs from what its image promises (``check_desktop``):
    ``rows`` are the failed fidelity rows of ``GET …/v1/desktop/state``."""

    def __init__(self, sandbox_id: str, rows: List[Dict[str, Any]]):
        self.rows = rows
        lines = "; ".join(f"{r['item']}: expected {r['expected']}, found {r['actual']}" for r in rows)
        super().__init__(None, "desktop_mismatch", f"sandbox {sandbox_id}'s desktop differs from its image's: {lines}")


def sandbox_path(sandbox: Sandbox) -> str:
    return SANDBOX_PATH_PREFIX + sandbox.id


def split_screen(path_to_vm: Optional[str]) -> Tuple[str, Optional[str]]:
    """A VM path and the screen it asks for: ``desktop@1280x800`` is ``("desktop", "1280x800")``
    (what :meth:`BerthVMManager.get_vm_path` answers for a ``DesktopEnv(screen_size=…)``)."""
    path = (path_to_vm or "").strip()
    base, sep, screen = path.rpartition(SCREEN_SEP)
    if sep and re.fullmatch(r"[0-9]+x[0-9]+", screen):
        return base, screen
    return path, None


def parse_path(path_to_vm: Optional[str], default_profile: str = DEFAULT_PROFILE) -> Tuple[str, str]:
    """``("sandbox", id)``, ``("image", image_ref)`` or ``("profile", name)`` (a screen suffix,
    ``@1280x800``, set aside: :func:`split_screen`)."""
    path, _ = split_screen(path_to_vm)
    if path.startswith(SANDBOX_PATH_PREFIX):
        return "sandbox", path[len(SANDBOX_PATH_PREFIX):]
    if not path:
        return "profile", default_profile
    # image refs are `name:tag` (berth-desktop:<hash>, process:<sha256>); profile names have no colon.
    if ":" in path:
        return "image", path
    return "profile", path


class BerthProvider(_OSWorldProvider):
    """One berth sandbox at a time, the one its ``DesktopEnv`` drives."""

    def __init__(
        self,
        region: Optional[str] = None,
        *,
        client: Optional[Client] = None,
        profile: str = DEFAULT_PROFILE,
        labels: Optional[Mapping[str, str]] = None,
        ttl_seconds: Optional[int] = None,
        check_desktop: bool = False,
    ):
        super().__init__(region)
        self.client = client or Client()
        self.profile = profile
        self.labels: Dict[str, str] = {"osworld": "true", **dict(labels or {})}
        self.ttl_seconds = ttl_seconds
        #: After each new sandbox is up (every episode reset), hold its desktop to its image's
        #: expected state and raise :class:`DesktopMismatch` on a difference.
        self.check_desktop = check_desktop
        #: The sandbox this provider runs (None before ``start_emulator`` and after a stop).
        self.sandbox: Optional[Sandbox] = None

    # ---- OSWorld's Provider ----

    def start_emulator(self, path_to_vm: str, headless: bool = True, os_type: str = "Ubuntu", *args: Any, **kwargs: Any):
        if os_type not in (None, "Ubuntu", "Linux"):
            raise ValueError(f"berth provides Linux (Ubuntu-like) desktops, not {os_type}")
        kind, value = parse_path(path_to_vm, self.profile)
        if kind == "sandbox":
            if self.sandbox is None or self.sandbox.id != value or not self.sandbox.running:
                self.sandbox = self.client.wait_until_running(value)
        else:
            profile, image_ref = (value, None) if kind == "profile" else (self.profile, value)
            self.sandbox = self._create(profile, image_ref, split_screen(path_to_vm)[1])
            self._check_desktop(self.sandbox)
        self._wait_for_compat(self.sandbox)

    def get_ip_address(self, path_to_vm: str) -> str:
        """``"host:server_port:chromium_port:vnc_port:vlc_port"`` as DesktopEnv splits it.

        The server port is the compat endpoint's; chromium the CDP endpoint's (0 without a
        desktop); vnc the image's declared ``vnc`` port, else the compat port (the agent serves
        noVNC at ``/v1/vnc/`` on that listener, behind a viewer token); vlc the image's declared
        ``vlc`` port, 0 when the image declares none (OSWorld's VLC getters then fail)."""
        sb = self._current(path_to_vm)
        ep = sb.endpoints
        compat = ep.host_port("compat")
        if compat is None:
            sb = self.sandbox = self.client.get_sandbox(sb.id)
            ep = sb.endpoints
            compat = ep.host_port("compat")
        if compat is None:
            raise BerthError(None, "no_endpoint", f"sandbox {sb.id} has no compat endpoint (status {sb.status})")
        host, server_port = compat
        cdp = ep.host_port("cdp")
        vnc = ep.host_port("vnc")
        vlc = ep.host_port("vlc")
        return ":".join(
            str(p)
            for p in (
                host,
                server_port,
                cdp[1] if cdp else 0,
                vnc[1] if vnc else server_port,
                vlc[1] if vlc else 0,
            )
        )

    def save_state(self, path_to_vm: str, snapshot_name: str):
        raise NotImplementedError(
            "berth sandboxes have no snapshots: an episode starts from a fresh sandbox of the same "
            "image (revert_to_snapshot)"
        )

    def revert_to_snapshot(self, path_to_vm: str, snapshot_name: str) -> str:
        """The episode reset: deletes the sandbox and creates a new one from the same
        ``image_ref`` (and profile); answers the new sandbox's path."""
        kind, value = parse_path(path_to_vm, self.profile)
        old: Optional[Sandbox] = self.sandbox
        if kind == "sandbox" and (old is None or old.id != value):
            old = self.client.get_sandbox(value)
        screen = split_screen(path_to_vm)[1]
        if old is not None:
            # The next episode's sandbox is the same kind, at the same screen size.
            profile, image_ref, screen = old.profile, old.image_ref, screen or old.screen
            self._delete(old.id)
        else:
            profile, image_ref = (value, None) if kind == "profile" else (self.profile, value)
        self.sandbox = None
        self.sandbox = self._create(profile, image_ref, screen)
        self._check_desktop(self.sandbox)
        self._wait_for_compat(self.sandbox)
        return sandbox_path(self.sandbox)

    def stop_emulator(self, path_to_vm: str, region: Optional[str] = None, *args: Any, **kwargs: Any):
        sb = self.sandbox
        kind, value = parse_path(path_to_vm, self.profile)
        target = sb.id if sb is not None else (value if kind == "sandbox" else None)
        self.sandbox = None
        if target:
            self._delete(target)

    # ---- helpers ----

    def _create(self, profile: str, image_ref: Optional[str], screen: Optional[str] = None) -> Sandbox:
        labels = {**self.labels, "osworld.pid": str(os.getpid())}
        sb = self.client.create_sandbox(
            profile, image_ref=image_ref, labels=labels, ttl_seconds=self.ttl_seconds, screen=screen
        )
        if not sb.running:
            sb = self.client.wait_until_running(sb.id)
        logger.info("berth sandbox %s (%s, %s) is running: %s", sb.id, sb.profile, sb.image_ref, sb.endpoints)
        return sb

    def _check_desktop(self, sb: Sandbox) -> None:
        """With ``check_desktop``: the fresh desktop against its image's expected state."""
        if not self.check_desktop:
            return
        state = self.client.desktop_state(sb)
        failed = [r for r in state.get("fidelity") or [] if not r.get("ok")]
        if failed:
            raise DesktopMismatch(sb.id, failed)
        logger.info("berth sandbox %s: %d fidelity items hold", sb.id, len(state.get("fidelity") or []))

    def _delete(self, sandbox_id: str) -> None:
        try:
            self.client.delete_sandbox(sandbox_id)
            logger.info("berth sandbox %s deleted", sandbox_id)
        except BerthError as e:
            if e.status != 404:
                raise

    def _current(self, path_to_vm: str) -> Sandbox:
        kind, value = parse_path(path_to_vm, self.profile)
        if kind == "sandbox" and (self.sandbox is None or self.sandbox.id != value):
            return self.client.get_sandbox(value)
        if self.sandbox is None:
            raise RuntimeError("the berth sandbox is not started (start_emulator first)")
        return self.sandbox

    def _wait_for_compat(self, sb: Sandbox) -> None:
        """What OSWorld's own providers do before handing out a VM: ``/screenshot`` answers 200
        from this host (the controller said ready; this checks the published port too)."""
        if not sb.endpoints.compat:
            return
        url = sb.endpoints.compat.rstrip("/") + "/screenshot"
        deadline = time.monotonic() + COMPAT_WAIT_SECS
        last: Any = None
        while time.monotonic() < deadline:
            try:
                r = requests.get(url, timeout=(10, 10))
                if r.status_code == 200:
                    return
                last = f"HTTP {r.status_code}"
            except requests.RequestException as e:
                last = e
            time.sleep(0.5)
        raise BerthError(None, "timeout", f"{url} did not answer 200 within {COMPAT_WAIT_SECS:g} s: {last}")


class BerthVMManager(_OSWorldVMManager):
    """Nothing to download or register: a "VM path" names what to create (a profile or an
    image_ref) or a sandbox. The registry is this process's own, in memory."""

    def __init__(self, profile: str = DEFAULT_PROFILE, image_ref: Optional[str] = None):
        self.profile = profile
        self.image_ref = image_ref
        self._lock = threading.Lock()
        self._registry: Dict[str, Optional[int]] = {}

    def initialize_registry(self, **kwargs: Any):
        with self._lock:
            self._registry.clear()

    def add_vm(self, vm_path: str, region: Optional[str] = None, **kwargs: Any):
        with self._lock:
            self._registry.setdefault(vm_path, None)

    def delete_vm(self, vm_path: str, region: Optional[str] = None, **kwargs: Any):
        with self._lock:
            self._registry.pop(vm_path, None)

    def occupy_vm(self, vm_path: str, pid: int, region: Optional[str] = None, **kwargs: Any):
        with self._lock:
            self._registry[vm_path] = pid

    def list_free_vms(self, region: Optional[str] = None, **kwargs: Any) -> List[str]:
        with self._lock:
            return [p for p, pid in self._registry.items() if pid is None]

    def check_and_clean(self, **kwargs: Any):
        with self._lock:
            for path, pid in list(self._registry.items()):
                if pid is not None and not _pid_alive(pid):
                    self._registry[path] = None

    def get_vm_path(self, os_type: str = "Ubuntu", region: Optional[str] = None, screen_size=(1920, 1080), **kwargs: Any) -> str:
        """What to create; a ``screen_size`` other than the desktop's own 1920x1080 rides along
        as ``@WxH`` and the sandbox is created at that size (``"screen"``)."""
        path = self.image_ref or self.profile
        if screen_size and tuple(screen_size) != (1920, 1080):
            w, h = (int(v) for v in screen_size)
            path = f"{path}{SCREEN_SEP}{w}x{h}"
        return path


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---- registration ----

_local = threading.local()
_lock = threading.Lock()
_settings: Dict[str, Any] = {}


def make_manager_and_provider(region: Optional[str] = None) -> Tuple[BerthVMManager, BerthProvider]:
    """A manager and a provider with the registered settings (each provider its own client)."""
    s = dict(_settings)
    client = Client(s.get("url"), s.get("api_key"), timeout=s.get("timeout") or 60.0)
    profile = s.get("profile") or DEFAULT_PROFILE
    provider = BerthProvider(
        region,
        client=client,
        profile=profile,
        labels=s.get("labels"),
        ttl_seconds=s.get("ttl_seconds"),
        check_desktop=bool(s.get("check_desktop")),
    )
    return BerthVMManager(profile, s.get("image_ref")), provider


def register(
    url: Optional[str] = None,
    api_key: Optional[str] = None,
    *,
    profile: str = DEFAULT_PROFILE,
    image_ref: Optional[str] = None,
    labels: Optional[Mapping[str, str]] = None,
    ttl_seconds: Optional[int] = None,
    timeout: float = 60.0,
    check_desktop: bool = False,
) -> None:
    """Makes ``DesktopEnv(provider_name="berth", …)`` provision berth sandboxes.

    ``url``/``api_key`` default to ``BERTH_URL``/``BERTH_API_KEY`` (or ``SANDBOX_GATEWAY_URL``/
    ``SANDBOX_API_KEY``), read when each env is made. ``check_desktop`` holds every new sandbox
    (each episode reset) to its image's expected desktop state and raises
    :class:`DesktopMismatch` naming each difference. ``profile`` (default ``desktop``) and
    ``image_ref`` (default: the controller's image for the profile) say what each env runs when
    it names no ``path_to_vm``; ``labels`` are added to every sandbox (``osworld=true`` always is).

    OSWorld picks providers in ``desktop_env.providers.create_vm_manager_and_provider``, which
    ``desktop_env.desktop_env`` imports by name: both are replaced by a function that answers the
    berth pair for ``"berth"`` and defers to OSWorld's for every other name. ``DesktopEnv``
    also checks the name against its own fixed set; for ``"berth"`` its constructor runs with the
    rules of OSWorld's Docker provider (an env starts clean, so the first reset reuses it), and
    ``env.provider_name`` is ``"berth"`` once it is built. Calling ``register`` again only
    updates the settings.
    """
    with _lock:
        _settings.clear()
        _settings.update(
            url=url,
            api_key=api_key,
            profile=profile,
            image_ref=image_ref,
            labels=dict(labels or {}),
            ttl_seconds=ttl_seconds,
            timeout=timeout,
            check_desktop=check_desktop,
        )
        import desktop_env.desktop_env as de_module
        import desktop_env.providers as providers_module

        original = _original(providers_module.create_vm_manager_and_provider)

        def create_vm_manager_and_provider(provider_name: str, region: Optional[str] = None, use_proxy: bool = False):
            if getattr(_local, "building", False) or _is_berth(provider_name):
                return make_manager_and_provider(region)
            return original(provider_name, region, use_proxy=use_proxy)

        create_vm_manager_and_provider.__berth_original__ = original  # type: ignore[attr-defined]
        providers_module.create_vm_manager_and_provider = create_vm_manager_and_provider
        de_module.create_vm_manager_and_provider = create_vm_manager_and_provider

        env_cls = de_module.DesktopEnv
        original_init = _original(env_cls.__init__)
        signature = inspect.signature(original_init)

        @functools.wraps(original_init)
        def __init__(self, *args: Any, **kwargs: Any):
            bound = signature.bind(self, *args, **kwargs)
            name = bound.arguments.get("provider_name", signature.parameters["provider_name"].default)
            if not _is_berth(name):
                return original_init(self, *args, **kwargs)
            bound.arguments["provider_name"] = "docker"
            _local.building = True
            try:
                original_init(*bound.args, **bound.kwargs)
            finally:
                _local.building = False
            self.provider_name = PROVIDER_NAME

        __init__.__berth_original__ = original_init  # type: ignore[attr-defined]
        env_cls.__init__ = __init__


def unregister() -> None:
    """Puts OSWorld's own provider factory and ``DesktopEnv.__init__`` back."""
    with _lock:
        import desktop_env.desktop_env as de_module
        import desktop_env.providers as providers_module

        original = _original(providers_module.create_vm_manager_and_provider)
        providers_module.create_vm_manager_and_provider = original
        de_module.create_vm_manager_and_provider = original
        de_module.DesktopEnv.__init__ = _original(de_module.DesktopEnv.__init__)


def _original(f: Callable) -> Callable:
    return getattr(f, "__berth_original__", f)


def _is_berth(name: Any) -> bool:
    return isinstance(name, str) and name.lower().strip() == PROVIDER_NAME
