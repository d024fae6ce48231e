"""The plain client against a live controller: sandboxes, exec and runs, files, screenshot,
computer, viewer, events, leases, errors."""

from __future__ import annotations

import base64
import io
import os

import pytest
import requests

import berth
from berth import BerthError


def png_size(data: bytes):
    from PIL import Image

    img = Image.open(io.BytesIO(data))
    img.load()  # decodes every row: a truncated or corrupt PNG raises
    assert img.format == "PNG"
    return img.size


def kinds(events):
    return [e["kind"] for e in events]


def test_a_desktop_sandbox_end_to_end(client: berth.Client, unique: str):
    labels = {"suite": "python-client", "run": unique}
    sb = client.create_sandbox("desktop", labels=labels)
    try:
        assert sb.status == "running", sb
        # Created under the alias: reported under the seed's name.
        assert sb.profile == "desktop-ubuntu"
        assert sb.image_ref.startswith("berth-"), sb.image_ref
        assert sb.labels == labels
        assert sb.viewer.kind == "novnc" and sb.viewer.url
        assert sb.endpoints.compat and sb.endpoints.cdp, sb.endpoints
        # Harnesses reach the compat surface and CDP through loopback ports on this host.
        assert sb.endpoints.host_port("compat")[0] == "127.0.0.1", sb.endpoints
        r = requests.post(
            sb.endpoints.compat + "/execute", json={"command": ["echo", "compat"], "shell": False}, timeout=30
        )
        assert r.status_code == 200 and r.json()["output"] == "compat\n", r.text
        version = requests.get(sb.endpoints.cdp + "/json/version", timeout=30).json()
        assert "Browser" in version, version

        # get and list with a label filter
        assert client.get_sandbox(sb.id).id == sb.id
        assert [s.id for s in client.list_sandboxes(labels)] == [sb.id]
        assert client.list_sandboxes({"run": unique, "suite": "other"}) == []

        # exec: argv directly, strings through sh -c, exit codes, env, cwd
        run = client.exec(sb, ["printf", "%s|", "a b", "$HOME"])
        assert (run.status, run.exit_code, run.stdout) == ("exited", 0, "a b|$HOME|"), run
        run = client.exec(sb, "echo out; echo err >&2; echo $GREETING; pwd; exit 3", env={"GREETING": "hi"}, cwd="/tmp")
        assert (run.exit_code, run.stdout, run.stderr) == (3, "out\nhi\n/tmp\n", "err\n"), run
        assert not run.ok and run.done
        # runs: read back, output chunks, an idempotent run id
        assert client.get_run(sb, run.id).stdout == run.stdout
        out = client.run_output(sb, run.id)
        assert out["done"] and "".join(c.get("data", "") for c in out["chunks"]).count("out") == 1, out
        again = client.exec(sb, "echo second", run_id=run.id)
        assert again.id == run.id and again.stdout == run.stdout
        bg = client.exec(sb, "sleep 1; echo late", wait=False)
        assert client.wait_run(sb, bg.id, timeout=60).stdout == "late\n"

        # files: bytes in, bytes out, parents created, owned by the sandbox user
        payload = os.urandom(300_000) + b"\x00\xff end"
        client.write_file(sb, "/home/user/berth-client/blob.bin", payload)
        assert client.read_file(sb, "/home/user/berth-client/blob.bin") == payload
        client.write_file(sb, "/tmp/hello.txt", "héllo\n", mode=0o600)
        assert client.read_file(sb, "/tmp/hello.txt").decode() == "héllo\n"
        stat = client.exec(sb, ["stat", "-c", "%U %a", "/tmp/hello.txt"]).stdout.split()
        assert stat == ["user", "600"], stat
        with pytest.raises(BerthError) as e:
            client.read_file(sb, "/no/such/file")
        assert e.value.status == 404, e.value

        # screenshot: a PNG that decodes at the screen's size; JPEG too
        w, h = png_size(client.screenshot(sb))
        assert (w, h) == (1920, 1080), (w, h)
        jpeg = client.screenshot(sb, format="jpeg", quality=70, scale=0.5)
        assert jpeg[:3] == b"\xff\xd8\xff"

        # computer: the tool input engines emit, through the controller
        moved = client.computer(sb, "mouse_move", coordinate=[200, 150])
        assert "error" not in moved or not moved["error"], moved
        pos = client.computer(sb, {"action": "cursor_position"})
        assert "200" in pos.get("output", "") and "150" in pos.get("output", ""), pos
        shot = client.computer(sb, "screenshot")
        assert png_size(base64.b64decode(shot["base64_image"]))[0] > 0

        # viewer: a one-time URL; the second open is refused
        url = client.viewer_url(sb)
        assert url.startswith(client.url) and "t=" in url, url
        first = requests.get(url, allow_redirects=False, timeout=30)
        assert first.status_code in (302, 303) and "berth_viewer" in first.headers.get("set-cookie", ""), first
        assert requests.get(url, allow_redirects=False, timeout=30).status_code == 401

        # events: the controller's and the agent's, in one sequence
        page = client.events(sb)
        seqs = [e["seq"] for e in page["events"]]
        assert seqs == sorted(seqs) and page["next_seq"] > seqs[-1]
        ks = kinds(page["events"])
        for k in ("sandbox.created", "sandbox.ready", "run.started", "command.exited", "file.uploaded"):
            assert k in ks, ks
        assert {e.get("source") for e in page["events"]} >= {"controller", "agent"}
        tail = client.events(sb, from_seq=page["next_seq"])
        assert tail["events"] == [] or tail["events"][0]["seq"] >= page["next_seq"]
        seen = list(client.stream_events(sb, from_seq=seqs[-3], timeout=1, poll_interval=0.2))
        assert [e["seq"] for e in seen][:3] == seqs[-3:]
    finally:
        gone = client.delete_sandbox(sb)
    assert gone.status == "stopped", gone
    assert client.get_sandbox(sb.id).status == "stopped"
    assert client.list_sandboxes(labels) == []
    assert [s.id for s in client.list_sandboxes(labels, status="stopped")] == [sb.id]
    ended = list(client.stream_events(sb, from_seq=0, timeout=30, poll_interval=0.2))
    assert "sandbox.deleted" in kinds(ended)
    # Deleting twice is fine.
    assert client.delete_sandbox(sb.id).status == "stopped"


def test_leases(client: berth.Client, unique: str):
    thread = f"python-{unique}"
    lease = client.acquire_lease(thread, "ide", labels={"suite": "python-client"}, ttl_seconds=300)
    try:
        assert lease.lease_id and lease.thread_id == thread and lease.how == "cold", lease
        assert lease.sandbox.running and lease.sandbox.lease_id == lease.lease_id
        assert client.exec(lease.sandbox, "echo leased").stdout == "leased\n"
        again = client.acquire_lease(thread, "ide", labels={"suite": "python-client"})
        assert (again.lease_id, again.sandbox.id, again.how) == (lease.lease_id, lease.sandbox.id, "reused")
        renewed = client.renew_lease(lease.lease_id, 3600)
        assert renewed.lease_id == lease.lease_id and renewed.expires_at >= lease.expires_at
    finally:
        client.release_lease(lease.lease_id)
    assert client.get_sandbox(lease.sandbox.id).status == "stopped"
    with pytest.raises(BerthError) as e:
        client.renew_lease(lease.lease_id, 60)
    assert e.value.status == 409, e.value


def test_errors_carry_status_code_and_message(client: berth.Client, berth_url: str):
    with pytest.raises(BerthError) as e:
        client.get_sandbox("sb_doesnotexist")
    assert (e.value.status, e.value.code) == (404, "not_found"), e.value
    assert e.value.message

    with pytest.raises(BerthError) as e:
        client.create_sandbox("no-such-profile")
    assert (e.value.status, e.value.code) == (400, "invalid_request"), e.value
    assert "no-such-profile" in e.value.message

    with pytest.raises(BerthError) as e:
        berth.Client(berth_url, "wrong-key").list_sandboxes()
    assert (e.value.status, e.value.code) == (401, "unauthorized"), e.value

    with pytest.raises(BerthError) as e:
        berth.Client("http://127.0.0.1:9", "k", connect_timeout=2).healthz()
    assert e.value.status is None and e.value.code == "unreachable", e.value


def test_config_from_the_environment(monkeypatch):
    for k in ("BERTH_URL", "BERTH_API_KEY", "SANDBOX_GATEWAY_URL", "SANDBOX_API_KEY"):
        monkeypatch.delenv(k, raising=False)
    c = berth.Client()
    assert (c.url, c.api_key) == ("http://localhost:8780", None)
    monkeypatch.setenv("SANDBOX_API_KEY", "gk")
    # Only the seed's variables: the seed's default URL.
    assert (berth.Client().url, berth.Client().api_key) == ("http://localhost:8780", "gk")
    monkeypatch.setenv("SANDBOX_GATEWAY_URL", "http://gateway:1/")
    monkeypatch.setenv("SANDBOX_API_KEY", "gk")
    assert (berth.Client().url, berth.Client().api_key) == ("http://gateway:1", "gk")
    monkeypatch.setenv("BERTH_URL", "http://berth:2")
    monkeypatch.setenv("BERTH_API_KEY", "bk")
    assert (berth.Client().url, berth.Client().api_key) == ("http://berth:2", "bk")
    assert (berth.Client("http://x:3", "ak").url, berth.Client("http://x:3", "ak").api_key) == ("http://x:3", "ak")
