"""OSWorld's own harness (``desktop_env`` from PyPI, unchanged) on berth desktop sandboxes:
``DesktopEnv(provider_name="berth")``, ``reset(task_config=…)`` with task configs written here,
``step()`` with pyautogui actions, ``evaluate()`` with OSWorld's metrics.

The tasks serve their own page from inside the sandbox (no internet): a small HTTP server the
setup uploads and launches. Its form page covers the whole viewport with one text field and
reports where the page sits on the screen, so the agent's click lands in it wherever the window
is; submitting the form makes the server write the text to a file, which the evaluator reads.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import struct
import textwrap
import threading
import time

import pytest

import berth

HOME = "/home/user"
SITE = f"{HOME}/berth-site"
PORT = 8765
FORM_URL = f"http://127.0.0.1:{PORT}/form.html"
ANSWER = "hello berth"

SERVER = textwrap.dedent(
    '''
    """A page with one field; /submit writes the field's text to a file, /where where the page is."""
    import http.server, json, sys, urllib.parse

    PORT, OUT, WHERE = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>berth form</title>
    <style>html,body{margin:0;height:100%}
    input{position:fixed;top:0;left:0;width:100%;height:100%;font-size:64px;border:0}</style></head>
    <body><form action="/submit" method="get"><input id="t" name="text" autocomplete="off" autofocus></form>
    <script>
    const t = document.getElementById("t");
    t.focus();
    // Where the page's middle is on the screen, once the window has its size (a tab opened in
    // the background reports none at first).
    setInterval(() => {
      if (document.visibilityState !== "visible" || outerWidth <= 0 || innerHeight <= 0) return;
      const top = outerHeight - innerHeight;
      fetch("/where?x=" + Math.round(screenX + outerWidth / 2)
            + "&y=" + Math.round(screenY + top + innerHeight / 2));
    }, 300);
    </script></body></html>"""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            url = urllib.parse.urlsplit(self.path)
            q = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
            if url.path == "/submit":
                with open(OUT, "w") as f:
                    f.write(q.get("text", ""))
                body = "<title>saved</title>saved"
            elif url.path == "/where":
                with open(WHERE, "w") as f:
                    json.dump({"x": int(q["x"]), "y": int(q["y"])}, f)
                body = "ok"
            elif url.path in ("/", "/form.html"):
                body = PAGE
            else:
                self.send_error(404)
                return
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
    '''
)

WAIT_FOR_SERVER = (
    "import time, urllib.request\n"
    "for _ in range(100):\n"
    "    try:\n"
    f"        urllib.request.urlopen('{FORM_URL}', timeout=2).read(); break\n"
    "    except Exception:\n"
    "        time.sleep(0.2)\n"
    "else:\n"
    "    raise SystemExit('the page server did not start')\n"
)

OPEN_CHECK_STEM = "berth-open-check"
OPEN_CHECK = f"<!doctype html><html><head><title>{OPEN_CHECK_STEM}</title></head><body>opened</body></html>"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    d = tmp_path_factory.mktemp("site")
    (d / "server.py").write_text(SERVER)
    (d / "expected.txt").write_text(ANSWER)
    (d / f"{OPEN_CHECK_STEM}.html").write_text(OPEN_CHECK)
    return d


def form_task(task_id: str, site, *, open_file: bool = False) -> dict:
    """A task whose setup uses launch, execute, upload_file, chrome_open_tabs and activate_window
    (and open_file): solved when the field's text was submitted."""
    config = [
        {"type": "execute", "parameters": {"command": ["mkdir", "-p", SITE]}},
        {
            "type": "upload_file",
            "parameters": {
                "files": [
                    {"local_path": str(site / "server.py"), "path": f"{SITE}/server.py"},
                    {"local_path": str(site / "expected.txt"), "path": f"{SITE}/expected.txt"},
                    {"local_path": str(site / f"{OPEN_CHECK_STEM}.html"), "path": f"{HOME}/{OPEN_CHECK_STEM}.html"},
                ]
            },
        },
        {
            "type": "launch",
            "parameters": {
                "command": ["python3", f"{SITE}/server.py", str(PORT), f"{SITE}/submitted.txt", f"{SITE}/where.json"]
            },
        },
        {"type": "execute", "parameters": {"command": ["python3", "-c", WAIT_FOR_SERVER]}},
    ]
    if open_file:
        config.append({"type": "open", "parameters": {"path": f"{HOME}/{OPEN_CHECK_STEM}.html"}})
    config += [
        {"type": "chrome_open_tabs", "parameters": {"urls_to_open": [FORM_URL]}},
        {"type": "activate_window", "parameters": {"window_name": "Google Chrome"}},
    ]
    return {
        "id": task_id,
        "instruction": f"Type '{ANSWER}' into the page's field and submit it.",
        "config": config,
        "evaluator": {
            "func": "compare_text_file",
            "result": {"type": "vm_file", "path": f"{SITE}/submitted.txt", "dest": "submitted.txt"},
            "expected": {"type": "vm_file", "path": f"{SITE}/expected.txt", "dest": "expected.txt"},
        },
    }


#: A reset runs a handful of setup steps; past this something waits on what will not come (OSWorld's
#: open_file waits 30 minutes for its window).
RESET_SECS = 180


@contextlib.contextmanager
def bounded(env, what: str, seconds: float = RESET_SECS):
    """Fails the test when ``what`` outlasts ``seconds``, ending it by deleting the env's sandbox
    (what OSWorld's client waits on then errors out)."""
    fired = threading.Event()

    def fire():
        fired.set()
        sb = env.provider.sandbox
        if sb is not None:
            berth.Client().delete_sandbox(sb.id)

    timer = threading.Timer(seconds, fire)
    timer.start()
    try:
        yield
    except Exception:
        if fired.is_set():
            pytest.fail(f"{what} did not finish within {seconds} s (its sandbox was deleted to end it)")
        raise
    finally:
        timer.cancel()
    if fired.is_set():
        pytest.fail(f"{what} did not finish within {seconds} s (its sandbox was deleted to end it)")


def make_env(DesktopEnv, tmp_path, **kw):
    kw.setdefault("require_a11y_tree", False)
    return DesktopEnv(provider_name="berth", action_space="pyautogui", cache_dir=str(tmp_path / "cache"), **kw)


def where(env) -> tuple:
    """Where the form page is on the screen, as the page reported it (the screen's centre if it
    did not say within 10 s)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        raw = env.controller.get_file(f"{SITE}/where.json")
        if raw:
            p = json.loads(raw)
            if 0 < p["x"] < env.screen_width and 0 < p["y"] < env.screen_height:
                return p["x"], p["y"]
        time.sleep(0.5)
    return env.screen_width // 2, env.screen_height // 2


def solve(env) -> None:
    x, y = where(env)
    obs, reward, done, info = env.step(
        f"pyautogui.click({x}, {y}); pyautogui.typewrite('{ANSWER}'); pyautogui.press('enter')"
    )
    assert obs["screenshot"] and obs["screenshot"][:8] == b"\x89PNG\r\n\x1a\n"
    assert (reward, done) == (0, False)


def active_window_title(client: berth.Client, sandbox_id: str) -> str:
    code = (
        "from Xlib import X, display\n"
        "d = display.Display(); r = d.screen().root\n"
        "a = r.get_full_property(d.intern_atom('_NET_ACTIVE_WINDOW'), X.AnyPropertyType).value[0]\n"
        "w = d.create_resource_object('window', a)\n"
        "n = w.get_full_property(d.intern_atom('_NET_WM_NAME'), d.intern_atom('UTF8_STRING'))\n"
        "v = n.value if n else ''\n"
        "print('TITLE=' + (v.decode() if isinstance(v, bytes) else v))\n"
    )
    run = client.exec(sandbox_id, ["python3", "-c", code])
    titles = [line[6:] for line in run.stdout.splitlines() if line.startswith("TITLE=")]
    assert titles, run
    return titles[-1]


def test_reset_step_evaluate_solves_a_task_and_scores_one_left_alone_zero(osworld, site, tmp_path, client):
    env = make_env(osworld, tmp_path)
    try:
        assert env.provider_name == "berth"
        first = env.provider.sandbox
        assert first is not None and first.running
        assert env.vm_ip == "127.0.0.1"
        assert (env.server_port, env.chromium_port) == (
            first.endpoints.host_port("compat")[1],
            first.endpoints.host_port("cdp")[1],
        )
        assert env.vm_platform == "Linux"

        with bounded(env, "reset (the solved task)"):
            obs = env.reset(task_config=form_task("berth-solved", site))
        assert obs["screenshot"][:8] == b"\x89PNG\r\n\x1a\n"
        # A fresh env is clean: the first reset runs in the sandbox the env started with.
        assert env.provider.sandbox.id == first.id
        solve(env)
        assert env.evaluate() == 1.0
        # What activate_window "Google Chrome" left active (checked last, below).
        title = active_window_title(client, first.id)

        # The next task gets a fresh sandbox from the same image (the episode reset).
        with bounded(env, "reset (the task left alone, with open_file)"):
            env.reset(task_config=form_task("berth-left", site, open_file=True))
        second = env.provider.sandbox
        assert second.id != first.id and second.image_ref == first.image_ref
        assert client.get_sandbox(first.id).status == "stopped"
        assert env.path_to_vm == f"berth-sandbox:{second.id}"
        assert env.evaluate() == 0.0
    finally:
        env.close()
    assert client.get_sandbox(second.id).status == "stopped"
    # The browser's window is titled as Google Chrome's, so OSWorld's activate_window found it.
    assert title.endswith(" - Google Chrome"), title


def test_a_chrome_profile_getter_the_platform_and_the_accessibility_tree(osworld, tmp_path, client):
    env = make_env(osworld, tmp_path, require_a11y_tree=True)
    try:
        sb = env.provider.sandbox
        # OSWorld's Chrome getters read the profile at ~/.config/google-chrome; the browser
        # writes its Preferences a few seconds after it starts.
        prefs_path = f"{HOME}/.config/google-chrome/Default/Preferences"
        deadline = time.monotonic() + 60
        while True:
            try:
                prefs = json.loads(client.read_file(sb, prefs_path))
                break
            except berth.BerthError as e:
                if e.status != 404 or time.monotonic() > deadline:
                    raise
                time.sleep(1)
        name = prefs["profile"]["name"]
        assert name
        task = {
            "id": "berth-chrome-profile",
            "instruction": "Nothing to do: the evaluator reads the browser's profile.",
            "config": [{"type": "launch", "parameters": {"command": ["google-chrome", FORM_URL]}}],
            "evaluator": {
                "func": "compare_answer",
                "result": {"type": "profile_name"},
                "expected": {"type": "rule", "rules": {"expected": name}},
            },
        }
        with bounded(env, "reset (the Chrome profile task)"):
            obs = env.reset(task_config=task)
        assert env.vm_platform == "Linux"
        tree = obs["accessibility_tree"]
        assert tree and tree.startswith("<desktop-frame"), (tree or "")[:200]
        assert 'name="Google Chrome"' in tree, tree[:2000]
        assert env.evaluate() == 1.0
    finally:
        env.close()
    assert client.get_sandbox(sb.id).status == "stopped"


def test_two_envs_in_parallel(osworld, site, tmp_path, client):
    def episode(n: int):
        env = make_env(osworld, tmp_path / f"env{n}")
        try:
            with bounded(env, f"reset (env {n})"):
                env.reset(task_config=form_task(f"berth-parallel-{n}", site))
            solve(env)
            return env, env.evaluate()
        except BaseException:
            env.close()
            raise

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(episode, [1, 2]))
    (a, score_a), (b, score_b) = results
    try:
        assert (score_a, score_b) == (1.0, 1.0)
        assert a.provider.sandbox.id != b.provider.sandbox.id
        ports_a = {a.server_port, a.chromium_port}
        ports_b = {b.server_port, b.chromium_port}
        assert len(ports_a) == 2 and not ports_a & ports_b, (ports_a, ports_b)
        assert a.provider.get_ip_address(a.path_to_vm) != b.provider.get_ip_address(b.path_to_vm)
    finally:
        ids = [a.provider.sandbox.id, b.provider.sandbox.id]
        a.close()
        b.close()
    assert [client.get_sandbox(i).status for i in ids] == ["stopped", "stopped"]


def test_a_screen_size_asked_of_desktop_env_is_the_sandboxs_screen(osworld, site, tmp_path, client):
    env = make_env(osworld, tmp_path, screen_size=(1280, 800))
    try:
        sb = env.provider.sandbox
        assert env.path_to_vm.endswith("@1280x800"), env.path_to_vm
        assert client.get_sandbox(sb.id).screen == "1280x800"
        # OSWorld's own controller reads the size back from /screen_size and the screenshot.
        assert env.vm_screen_size == {"width": 1280, "height": 800}
        png = env.controller.get_screenshot()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">II", png[16:24]) == (1280, 800)
        # The episode reset's fresh sandbox (a used env is reverted) keeps the size.
        obs, _, _, _ = env.step("pyautogui.moveTo(1279, 799)")
        assert struct.unpack(">II", obs["screenshot"][16:24]) == (1280, 800)
        with bounded(env, "reset (the screen-size task)"):
            env.reset(task_config=form_task("berth-screen", site))
        again = env.provider.sandbox
        assert again.id != sb.id and client.get_sandbox(again.id).screen == "1280x800"
        assert env.vm_screen_size == {"width": 1280, "height": 800}
    finally:
        env.close()


def test_paths_and_the_ip_address_format(osworld_code):
    from berth.osworld import BerthProvider, BerthVMManager, parse_path, split_screen

    assert split_screen("desktop@1280x800") == ("desktop", "1280x800")
    assert split_screen("berth-desktop:ab@1024x768") == ("berth-desktop:ab", "1024x768")
    assert split_screen("desktop") == ("desktop", None)
    assert parse_path("berth-desktop:ab@1024x768") == ("image", "berth-desktop:ab")
    assert BerthVMManager().get_vm_path("Ubuntu", None, screen_size=(1280, 800)) == "desktop@1280x800"
    assert BerthVMManager().get_vm_path("Ubuntu", None, screen_size=(1920, 1080)) == "desktop"

    assert parse_path(None) == ("profile", "desktop")
    assert parse_path("desktop") == ("profile", "desktop")
    assert parse_path("berth-desktop:0123abcd") == ("image", "berth-desktop:0123abcd")
    assert parse_path("berth-sandbox:sb_1") == ("sandbox", "sb_1")
    assert BerthVMManager().get_vm_path(os_type="Ubuntu", region=None) == "desktop"
    assert BerthVMManager(image_ref="berth-desktop:x").get_vm_path("Ubuntu", None) == "berth-desktop:x"

    p = BerthProvider(client=berth.Client("http://127.0.0.1:9", "k"))
    p.sandbox = berth.Sandbox.from_json(
        {
            "id": "sb_x",
            "profile": "desktop",
            "status": "running",
            "image_ref": "berth-desktop:x",
            "endpoints": {"compat": "http://127.0.0.1:40001", "cdp": "http://127.0.0.1:40002", "vlc": "http://127.0.0.1:40003"},
        }
    )
    assert p.get_ip_address("desktop") == "127.0.0.1:40001:40002:40001:40003"
    p.sandbox.endpoints.ports.clear()
    assert p.get_ip_address("desktop") == "127.0.0.1:40001:40002:40001:0"


def test_check_desktop_raises_naming_each_difference_and_passes_a_faithful_desktop(osworld_code):
    """``check_desktop`` reads ``/v1/desktop/state`` of each new sandbox: a failed fidelity row
    raises ``DesktopMismatch`` naming it; all rows passing, or the option off, raise nothing."""
    from berth.osworld import BerthProvider, DesktopMismatch

    class Answers:
        def __init__(self, rows):
            self.rows, self.asked = rows, 0

        def desktop_state(self, sb):
            self.asked += 1
            return {"session": "gnome", "fidelity": self.rows}

    sb = berth.Sandbox.from_json({"id": "sb_f", "profile": "desktop", "status": "running", "image_ref": "berth-desktop-osworld:x"})
    bad = Answers(
        [
            {"item": "session", "ok": True, "expected": "gnome", "actual": "gnome"},
            {"item": "icon theme", "ok": False, "expected": "Yaru", "actual": "Adwaita"},
        ]
    )
    with pytest.raises(DesktopMismatch) as e:
        BerthProvider(client=bad, check_desktop=True)._check_desktop(sb)
    assert "icon theme: expected Yaru, found Adwaita" in str(e.value)
    assert [r["item"] for r in e.value.rows] == ["icon theme"]
    good = Answers([{"item": "session", "ok": True, "expected": "gnome", "actual": "gnome"}])
    BerthProvider(client=good, check_desktop=True)._check_desktop(sb)
    off = Answers(bad.rows)
    BerthProvider(client=off)._check_desktop(sb)
    assert (good.asked, off.asked) == (1, 0)
