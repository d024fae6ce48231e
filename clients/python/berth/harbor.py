"""Harbor on berth: a Harbor environment whose trials run in berth sandboxes.

``harbor run -p TASKS -a oracle -e berth.harbor:BerthEnvironment`` (Harbor from PyPI, unchanged;
``--ek url=…`` and ``--ek api_key=…``, else ``BERTH_URL`` / ``BERTH_API_KEY``). Each trial:

- **start**: the task's ``environment/`` (its Dockerfile) or its prebuilt ``docker_image`` becomes
  a berth image with the agent put in (``POST …/images/build``; content-addressed, so the second
  trial of a task finds it built), then a sandbox of the ``custom`` profile starts from it: warm
  when the controller keeps a pool of that image (``[[pools]] profile = "custom"``, its
  ``image_ref``). Harbor's resource overrides are the sandbox's ``limits`` (CPUs and memory as
  hard limits), its network policy the sandbox's egress policy (``public`` → ``"open"``,
  ``no-network`` → ``"none"``, ``allowlist`` → ``{"allow": [...], "deny_private": false}``:
  host names, ``*.name``, addresses and ranges, enforced by the controller's proxy on the Docker
  provider, as Harbor's own Docker environment enforces them; ``--ek deny_private=true`` also
  refuses private addresses an allowed name resolves to);
- **exec**: ``bash -c`` (``sh`` where the image has no bash) through ``POST …/{id}/exec``, as
  the account Harbor names, in the task's ``workdir`` or the image's ``WORKDIR``;
- **files**: single files through ``PUT``/``GET …/{id}/files``; directories as one tar archive
  each way;
- **stop**: the sandbox is deleted (kept until its TTL with ``--no-delete``).

What it declares it cannot do (Harbor refuses such tasks before start): GPUs, TPUs, Windows,
Docker Compose environments, host mounts, SSH streaming, and changing the network policy of a
running sandbox.
"""

from __future__ import annotations

import asyncio
import io
import shlex
import tarfile
import tempfile
import uuid
from pathlib import Path
from typing import Any, Dict, Optional

from harbor.environments.base import (
    BaseEnvironment,
    ExecResult,
    SandboxBuildFailedError,
    transfer_tar_filter,
)
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.environments.options import EnvironmentOptions
from harbor.models.task.config import NetworkMode, NetworkPolicy
from harbor.models.trial.config import ResourceMode
from pydantic import Field

from .client import BerthError, Client

#: The catalog profile brought images run on (no desktop; Docker by default).
PROFILE = "custom"
#: Labels every sandbox of a trial carries.
LABEL_SESSION = "harbor.session"
LABEL_TASK = "harbor.task"


class BerthOptions(EnvironmentOptions):
    """``--ek`` options of the berth environment."""

    url: Optional[str] = Field(default=None, description="The controller (default: BERTH_URL).")
    api_key: Optional[str] = Field(default=None, description="Its API key (default: BERTH_API_KEY).")
    profile: str = Field(default=PROFILE, description="The catalog profile the sandboxes run on.")
    ttl_seconds: int = Field(default=4 * 3600, gt=0, description="A sandbox's lifetime once ready.")
    deny_private: bool = Field(
        default=False,
        description="Under an allow-list, also refuse private addresses an allowed name resolves to "
        "(berth's own default; Harbor's Docker environment allows them).",
    )


def egress_of(policy: NetworkPolicy, deny_private: bool = False) -> Any:
    """The berth egress policy that enforces Harbor's network policy (pure): an allow-list as
    Harbor's own Docker environment enforces it (the names, addresses and ranges listed, an
    allowed name whatever address it resolves to) unless ``deny_private``."""
    if policy.network_mode == NetworkMode.PUBLIC:
        return "open"
    if policy.network_mode == NetworkMode.NO_NETWORK:
        return "none"
    return {"allow": list(policy.allowed_hosts), "deny_private": deny_private}


def limits_of(cpus: Optional[float], memory_mb: Optional[int]) -> Dict[str, Any]:
    """The sandbox's ``limits`` for Harbor's CPU and memory values (pure)."""
    limits: Dict[str, Any] = {}
    if cpus:
        limits["cpus"] = float(cpus)
    if memory_mb:
        limits["memory_mb"] = int(memory_mb)
    return limits


class BerthEnvironment(BaseEnvironment):
    """A Harbor environment served by a berth controller (see the module's text)."""

    options_model = BerthOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._sandbox: Optional[str] = None
        self._shell = "bash"
        self.image_ref: Optional[str] = None
        #: ``warm`` or ``cold``: how the controller served the sandbox.
        self.claim: Optional[str] = None
        super().__init__(*args, **kwargs)
        opts = self.options if isinstance(self.options, BerthOptions) else BerthOptions()
        self._opts = opts
        self._client = Client(opts.url, opts.api_key)

    @staticmethod
    def type() -> str:
        return "berth"

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True, fractional_cpus=True)

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(
            disable_internet=True,
            network_allowlist=True,
            network_allowlist_hostnames=True,
            network_allowlist_wildcard_hostnames=True,
            network_allowlist_ipv4_addresses=True,
            network_allowlist_ipv6_addresses=True,
            network_allowlist_ipv4_cidrs=True,
            network_allowlist_ipv6_cidrs=True,
        )

    @property
    def _dockerfile(self) -> Path:
        return self.environment_dir / "Dockerfile"

    def _validate_definition(self) -> None:
        for compose in ("docker-compose.yaml", "docker-compose.yml", "compose.yaml"):
            if (self.environment_dir / compose).exists():
                raise ValueError(
                    f"{compose} in {self.environment_dir}: berth runs one container per trial; "
                    "Docker Compose environments are not supported"
                )
        if not self._dockerfile.exists() and not self.task_env_config.docker_image:
            raise FileNotFoundError(f"{self._dockerfile} not found and the task names no docker_image")

    @property
    def sandbox_id(self) -> str:
        if self._sandbox is None:
            raise RuntimeError("the berth sandbox is not started")
        return self._sandbox

    # ---- lifecycle ----

    async def start(self, force_build: bool) -> None:
        """Builds (or finds) the task's image and starts a sandbox of it. ``force_build`` is
        moot: the image is named by its content, and Docker's own cache decides what a
        Dockerfile's build reruns."""
        try:
            if self._dockerfile.exists():
                job = await asyncio.to_thread(self._client.build_image, dockerfile=str(self.environment_dir))
            else:
                job = await asyncio.to_thread(self._client.build_image, from_image=self.task_env_config.docker_image)
        except BerthError as e:
            if e.code in ("image_build_failed", "invalid_request"):
                raise SandboxBuildFailedError(f"berth could not build {self.environment_name}'s image: {e}") from e
            raise
        self.image_ref = job["image_ref"]
        limits = limits_of(
            self._resource_limit_value("cpu", auto_mode=ResourceMode.LIMIT),
            self._resource_limit_value("memory", auto_mode=ResourceMode.LIMIT),
        )
        labels = {LABEL_SESSION: self.session_id[:1024], LABEL_TASK: self.environment_name[:1024]}
        sb = await asyncio.to_thread(
            self._client.create_sandbox,
            self._opts.profile,
            image_ref=self.image_ref,
            labels=labels,
            ttl_seconds=self._opts.ttl_seconds,
            egress=egress_of(self.network_policy, self._opts.deny_private),
            limits=limits or None,
        )
        self._sandbox = sb.id
        self.claim = sb.claim
        self.logger.info(f"berth sandbox {sb.id} ({self.claim}) from {self.image_ref}")
        probe = await self.exec("command -v bash >/dev/null 2>&1 && echo bash || echo sh", user="root")
        self._shell = "bash" if (probe.stdout or "").strip() == "bash" else "sh"
        # Harbor's log, verifier and artifact directories, as a mounted provider would have them.
        await self.ensure_dirs(self._mount_targets(writable_only=True))
        await self._upload_environment_dir_after_start()

    async def stop(self, delete: bool) -> None:
        if self._sandbox is None:
            return
        if delete:
            await asyncio.to_thread(self._client.delete_sandbox, self._sandbox)
            self._sandbox = None

    # ---- commands ----

    async def exec(
        self,
        command: str,
        cwd: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
        timeout_sec: Optional[int] = None,
        user: Optional[str | int] = None,
    ) -> ExecResult:
        user = self._resolve_user(user)
        env = self._merge_env(env)
        timeout_ms = int(timeout_sec * 1000) if timeout_sec else None
        run = await asyncio.to_thread(
            self._client.exec,
            self.sandbox_id,
            [self._shell, "-c", command],
            env=env or None,
            cwd=cwd or self.task_env_config.workdir,
            user=None if user is None else str(user),
            timeout_ms=timeout_ms,
        )
        if not run.done:
            wait = (timeout_sec or 24 * 3600) + 60
            run = await asyncio.to_thread(self._client.wait_run, self.sandbox_id, run.id, timeout=wait)
        if run.exit_code is None:
            if timeout_sec and "timed out" in (run.error or "") + run.stderr:
                raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
            raise RuntimeError(f"berth run {run.id} ended {run.status}: {run.error or run.stderr}")
        return ExecResult(stdout=run.stdout, stderr=run.stderr, return_code=run.exit_code)

    async def _root(self, line: str) -> None:
        result = await self.exec(line, user="root")
        if result.return_code != 0:
            raise RuntimeError(f"{line!r} failed ({result.return_code}): {result.stderr or result.stdout}")

    # ---- files ----

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        data = Path(source_path).read_bytes()
        try:
            await asyncio.to_thread(self._client.write_file, self.sandbox_id, target_path, data)
        except BerthError as e:
            if e.status not in (403, 409):
                raise
            # A place the sandbox's user may not write: staged, then put there as root.
            staged = f"/tmp/.berth-upload-{uuid.uuid4().hex}"
            await asyncio.to_thread(self._client.write_file, self.sandbox_id, staged, data)
            q, t = shlex.quote(staged), shlex.quote(target_path)
            await self._root(f"mkdir -p \"$(dirname {t})\" && cat {q} > {t}; s=$?; rm -f {q}; exit $s")

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for p in sorted(Path(source_dir).iterdir()):
                tar.add(p, arcname=p.name)
        staged = f"/tmp/.berth-upload-{uuid.uuid4().hex}.tar.gz"
        await asyncio.to_thread(self._client.write_file, self.sandbox_id, staged, buf.getvalue())
        q, t = shlex.quote(staged), shlex.quote(target_dir)
        await self._root(f"mkdir -p {t} && tar -xzf {q} -C {t} --no-same-owner; s=$?; rm -f {q}; exit $s")

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self._client.download_file, self.sandbox_id, source_path, target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        staged = f"/tmp/.berth-download-{uuid.uuid4().hex}.tar.gz"
        q, s = shlex.quote(staged), shlex.quote(source_dir)
        await self._root(f"tar -czf {q} -C {s} . && chmod 644 {q}")
        try:
            with tempfile.TemporaryDirectory() as tmp:
                local = Path(tmp) / "dir.tar.gz"
                await asyncio.to_thread(self._client.download_file, self.sandbox_id, staged, local)
                target = Path(target_dir)
                target.mkdir(parents=True, exist_ok=True)
                with tarfile.open(local, "r:gz") as tar:
                    tar.extractall(target, filter=transfer_tar_filter)
        finally:
            await self.exec(f"rm -f {q}", user="root")

