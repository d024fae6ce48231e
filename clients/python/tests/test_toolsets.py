"""Anthropic's computer toolset through the ``anthropic`` SDK (2.10, from PyPI) and
``berth.anthropic.ComputerToolset``, against a desktop sandbox behind the controller: the SDK's own
``tool_result()`` on hand-built ``tool_use`` blocks, every member read back from X by a probe window
in the sandbox (a Tk program logging the pointer, buttons, keysyms, wheel and its text field), the
agent's whole-turn route answering what the SDK renders, and bad inputs refused by field."""

from __future__ import annotations

import base64
import json
import time
import typing

import pytest

anthropic = pytest.importorskip("anthropic", minversion="2.10")

import berth  # noqa: E402
from toolset_helpers import png_size, texts, tool_use, wait_for  # noqa: E402
from anthropic.types.beta import BetaComputerMemberName  # noqa: E402
from berth.anthropic import ComputerToolset  # noqa: E402

PROBE = r"""
import json, sys, time, tkinter as tk
log = open("/tmp/probe.log", "a", buffering=1)
def note(kind, **kw):
    kw.update(kind=kind, t=time.monotonic())
    log.write(json.dumps(kw) + "\n")
root = tk.Tk()
root.title("berth-probe")
root.geometry("%dx%d+0+0" % (root.winfo_screenwidth(), root.winfo_screenheight()))
root.attributes("-fullscreen", True)
entry = tk.Entry(root, font=("DejaVu Sans", 20))
entry.place(x=100, y=100, width=800, height=60)
def key(e, kind):
    note(kind, keysym=e.keysym, state=e.state, text=entry.get())
def button(e, kind):
    note(kind, num=e.num, x=e.x_root, y=e.y_root, state=e.state)
root.bind_all("<KeyPress>", lambda e: key(e, "key"))
root.bind_all("<KeyRelease>", lambda e: key(e, "key_up"))
root.bind_all("<ButtonPress>", lambda e: button(e, "press"))
root.bind_all("<ButtonRelease>", lambda e: button(e, "release"))
def ready():
    root.focus_force(); entry.focus_set()
    note("ready", w=root.winfo_width(), h=root.winfo_height())
root.after(500, ready)
root.mainloop()
"""

ENTRY_AT = (500, 130)  # display pixels inside the probe's text field






@pytest.fixture(scope="module")
def desktop(berth_url):
    client = berth.Client(berth_url)
    sb = client.create_sandbox("desktop", labels={"suite": "python-toolsets"})
    try:
        yield client, sb
    finally:
        client.delete_sandbox(sb)
        client.session.close()


@pytest.fixture(scope="module")
def computer(desktop):
    client, sb = desktop
    return ComputerToolset(sb, client)


class Probe:
    """The probe window in the sandbox and what it logged."""

    def __init__(self, client: berth.Client, sb):
        self.client, self.sb = client, sb
        self.mark = 0
        client.write_file(sb, "/tmp/probe.py", PROBE)
        client.exec(sb, "rm -f /tmp/probe.log; pkill -f /tmp/probe.py; true")
        client.exec(sb, "exec python3 /tmp/probe.py", wait=False)
        wait_for("the probe window", lambda: self.events("ready"))

    def all(self):
        try:
            raw = self.client.read_file(self.sb, "/tmp/probe.log").decode()
        except berth.BerthError:
            return []
        return [json.loads(line) for line in raw.splitlines() if line.strip()]

    def events(self, *kinds):
        return [e for e in self.all()[self.mark :] if not kinds or e["kind"] in kinds]

    def since(self):
        """Events from here on."""
        self.mark = len(self.all())

    def pointer(self):
        out = self.client.exec(self.sb, ["xdotool", "getmouselocation", "--shell"]).stdout
        fields = dict(line.split("=", 1) for line in out.split())
        return int(fields["X"]), int(fields["Y"])

    def close(self):
        self.client.exec(self.sb, "pkill -f /tmp/probe.py; true")


@pytest.fixture(scope="module")
def probe(desktop):
    client, sb = desktop
    p = Probe(client, sb)
    yield p
    p.close()




def block(name: str, **input):
    return tool_use("computer", name, **input)


def call(computer: ComputerToolset, name: str, **input):
    return computer.tool_result(block(name, **input))




def to_shot(computer, p):
    info = computer.info()
    return (
        round(p[0] * info["screenshot_width_px"] / info["display_width_px"]),
        round(p[1] * info["screenshot_height_px"] / info["display_height_px"]),
    )


def test_the_tools_entry_is_the_sdks(computer: ComputerToolset):
    info = computer.info()
    # What the engine puts in tools[] is what the SDK's own driver sends.
    assert info["tool"] == computer.to_dict() == {"type": "computer_toolset_20260801"}, info
    assert info["members"] == list(typing.get_args(BetaComputerMemberName)), info
    assert (info["display_width_px"], info["display_height_px"]) == (1920, 1080), info
    # The screenshot fits the model's image limits (1568 px, 1.15 MP), so no coordinate moves.
    w, h = info["screenshot_width_px"], info["screenshot_height_px"]
    assert (w, h) == (1429, 804), info
    assert max(w, h) <= 1568 and w * h <= 1_150_000


def test_every_computer_member_read_back_from_x(computer: ComputerToolset, probe: Probe):
    info = computer.info()
    entry = to_shot(computer, ENTRY_AT)

    # screenshot: one image block, at the toolset's size
    r = call(computer, "screenshot")
    assert "is_error" not in r and r["toolset_name"] == "computer", r
    (image,) = r["content"]
    assert image["type"] == "image" and image["source"]["media_type"] == "image/png"
    assert png_size(base64.b64decode(image["source"]["data"])) == (1429, 804)

    # mouse_move and cursor_position, in screenshot pixels; X's pointer in display pixels
    r = call(computer, "mouse_move", coordinate=[714, 402])
    assert texts(r) == ["Moved the mouse."], r
    assert probe.pointer() == (959, 540)
    assert texts(call(computer, "cursor_position")) == ["X=714,Y=402"]

    # left_click into the text field, then type into it
    probe.since()
    assert texts(call(computer, "left_click", coordinate=list(entry))) == ["Clicked."]
    presses = wait_for("the click", lambda: probe.events("press", "release"))
    assert [(e["kind"], e["num"]) for e in presses] == [("press", 1), ("release", 1)], presses
    assert abs(presses[0]["x"] - ENTRY_AT[0]) <= 2 and abs(presses[0]["y"] - ENTRY_AT[1]) <= 2, presses
    assert texts(call(computer, "type", text="héllo wörld")) == ["Typed."]
    wait_for("the typed text", lambda: any(e.get("text") == "héllo wörld" for e in probe.events("key_up")))

    # key: a chord, then a key repeated
    probe.since()
    assert texts(call(computer, "key", text="ctrl+a")) == ["Pressed ctrl+a."]
    keys = wait_for("ctrl+a", lambda: [e for e in probe.events("key") if e["keysym"] == "a"])
    assert keys[0]["state"] & 4, keys  # Control held
    # Keys separated by spaces press in turn: to the end, one character deleted.
    assert texts(call(computer, "key", text="End BackSpace")) == ["Pressed End BackSpace."]
    wait_for("one character deleted", lambda: any(e["text"] == "héllo wörl" for e in probe.events("key_up")))
    call(computer, "type", text="abc")
    probe.since()
    assert texts(call(computer, "key", text="Left", repeat=3)) == ["Pressed Left."]
    lefts = wait_for("three Lefts", lambda: len([e for e in probe.events("key") if e["keysym"] == "Left"]) == 3)
    assert lefts

    # the other buttons and click counts, with a modifier held
    probe.since()
    call(computer, "right_click", coordinate=list(entry))
    call(computer, "middle_click", coordinate=list(entry))
    call(computer, "double_click", coordinate=list(entry))
    assert texts(call(computer, "triple_click", coordinate=list(entry), text="shift")) == ["Triple-clicked."]
    presses = wait_for("the clicks", lambda: [e for e in probe.events("press")] if len(probe.events("press")) >= 7 else None)
    assert [e["num"] for e in presses] == [3, 2, 1, 1, 1, 1, 1], presses
    assert all(e["state"] & 1 for e in presses[4:]) and not any(e["state"] & 1 for e in presses[:4]), presses

    # scroll: wheel clicks by direction (X buttons 4 up, 5 down, 6 left, 7 right)
    probe.since()
    assert texts(call(computer, "scroll", coordinate=list(entry), scroll_direction="down", scroll_amount=3)) == [
        "Scrolled down."
    ]
    call(computer, "scroll", scroll_direction="left", scroll_amount=2)
    wheel = wait_for("the wheel", lambda: probe.events("press") if len(probe.events("press")) >= 5 else None)
    # Tk 8.6 reports X's horizontal wheel (buttons 6, 7) as Shift with buttons 4, 5.
    assert [(e["num"], bool(e["state"] & 1)) for e in wheel] == [(5, False)] * 3 + [(4, True)] * 2, wheel

    # left_mouse_down / up: the button held between them
    probe.since()
    call(computer, "mouse_move", coordinate=list(entry))
    assert texts(call(computer, "left_mouse_down")) == ["Left mouse button pressed."]
    wait_for("the press", lambda: probe.events("press"))
    assert probe.events("release") == []
    assert texts(call(computer, "left_mouse_up")) == ["Left mouse button released."]
    wait_for("the release", lambda: probe.events("release"))

    # left_click_drag: pressed at the start, released at the end
    probe.since()
    start, end = to_shot(computer, (300, 600)), to_shot(computer, (900, 700))
    assert texts(call(computer, "left_click_drag", start_coordinate=list(start), coordinate=list(end))) == ["Dragged."]
    drag = wait_for("the drag", lambda: probe.events("press", "release") if len(probe.events("press", "release")) >= 2 else None)
    assert abs(drag[0]["x"] - 300) <= 2 and abs(drag[0]["y"] - 600) <= 2, drag
    assert abs(drag[-1]["x"] - 900) <= 2 and abs(drag[-1]["y"] - 700) <= 2, drag

    # hold_key: down for the duration
    probe.since()
    assert texts(call(computer, "hold_key", text="shift", duration=1)) == ["Held shift for 1s."]
    down = wait_for("shift down", lambda: [e for e in probe.events("key") if e["keysym"].startswith("Shift")])
    up = wait_for("shift up", lambda: [e for e in probe.events("key_up") if e["keysym"].startswith("Shift")])
    assert up[-1]["t"] - down[0]["t"] >= 0.9, (down, up)

    # wait
    started = time.monotonic()
    assert texts(call(computer, "wait", duration=1)) == ["Waited 1s."]
    assert time.monotonic() - started >= 1.0

    # zoom: a region at display resolution, scaled up to fill the image budget
    r = call(computer, "zoom", region=[0, 0, 200, 100])
    (image,) = r["content"]
    w, h = png_size(base64.b64decode(image["source"]["data"]))
    # 200x100 screenshot pixels are 269x134 of the display: scaled up to fill 1.15 MP.
    assert 1_140_000 <= w * h <= 1_150_000 and max(w, h) <= 1568 and abs(w / h - 269 / 134) < 0.01, (w, h)
    assert info["screenshot_width_px"] < w


def test_bad_inputs_are_errors_naming_the_field(computer: ComputerToolset):
    r = call(computer, "left_click", coordinate=[5000, 10])
    assert r["is_error"] is True
    assert texts(r) == [
        "invalid input for computer member 'left_click': coordinate: (5000, 10) is outside the 1429x804 screenshot"
    ], r
    r = call(computer, "scroll", scroll_direction="down", scroll_amount=0)
    assert texts(r) == ["invalid input for computer member 'scroll': scroll_amount: must be 1 to 100"], r
    r = call(computer, "wait", duration=120)
    assert texts(r) == ["invalid input for computer member 'wait': duration: must be 0 to 60 seconds"], r
    r = call(computer, "key", text="ctrl+a", repeat=-1)
    assert texts(r) == ["invalid input for computer member 'key': repeat: must be 1 to 100"], r
    # The SDK refuses what its own types refuse before the sandbox is asked.
    r = call(computer, "left_click", coordinate=[1, 2, 3])
    assert r["is_error"] is True and "coordinate" in texts(r)[0], r


def test_a_whole_turn_answers_what_the_sdk_renders_and_stops_at_the_first_failure(
    computer: ComputerToolset, probe: Probe
):
    entry = to_shot(computer, ENTRY_AT)
    calls = [
        block("left_click", coordinate=list(entry)),
        block("key", text="ctrl+a"),
        block("type", text="turn-1"),
        block("wait", duration=0),
        block("scroll", scroll_direction="up", scroll_amount=1, coordinate=list(entry)),
        block("mouse_move", coordinate=[10, 10]),
        block("cursor_position"),
    ]
    content = [{"type": "text", "text": "Typing now."}] + [c.model_dump() for c in calls]
    answered = computer.turn(content)
    # One result per tool_use, each the one the SDK builds when it runs the member itself.
    assert len(answered) == len(calls), answered
    for c, got in zip(calls, answered):
        assert got == computer.tool_result(c), (c, got)
    assert texts(answered[-1]) == ["X=10,Y=10"]

    # A turn that fails at its second action runs nothing after it.
    probe.since()
    answered = computer.turn(
        [
            block("left_click", coordinate=list(entry)).model_dump(),
            block("left_click", coordinate=[-1, 5]).model_dump(),
            block("type", text="never").model_dump(),
            block("fly").model_dump(),
        ]
    )
    assert [r.get("is_error", False) for r in answered] == [False, True, True, True], answered
    assert answered[2]["content"] == answered[3]["content"] == "Not executed: an earlier computer action in this turn failed."
    wait_for("the click", lambda: probe.events("release"))
    assert not any("never" in e.get("text", "") for e in probe.events("key", "key_up")), probe.events()
    # An unknown member is the SDK's refusal.
    (r,) = computer.turn([block("fly").model_dump()])
    assert r["is_error"] and texts(r) == ["Error: unknown computer toolset member 'fly'"], r
