"""A Tk test window for berth's display tests.

    probe.py --out DIR [--title T] [--class C] [--geometry WxH+X+Y] [--opener [--busy-ms N]]

Writes DIR/ready once mapped, keeps DIR/text.txt equal to the content of its text field
(which has the focus and a blinking caret), and with --opener shows a button at the top left
that opens a 400x300 magenta window at +600+300 (after computing for N ms, drawing nothing, with
--busy-ms).
"""

import argparse
import os
import time
import tkinter as tk

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--title", default="Berth Probe")
p.add_argument("--class", dest="klass", default="berthprobe")
p.add_argument("--geometry", default="800x600+0+0")
p.add_argument("--opener", action="store_true")
p.add_argument("--busy-ms", type=int, default=0)
a = p.parse_args()

root = tk.Tk(className=a.klass)
root.title(a.title)
root.geometry(a.geometry)

if a.opener:
    def open_window():
        end = time.monotonic() + a.busy_ms / 1000
        while time.monotonic() < end:
            pass
        top = tk.Toplevel(root)
        top.title("Opened")
        top.geometry("400x300+600+300")
        tk.Frame(top, bg="#ff00ff", width=400, height=300).pack(fill="both", expand=True)

    tk.Button(root, text="Open", command=open_window, width=10, height=3).pack(anchor="nw")

text = tk.Text(root, insertofftime=300, insertontime=300)
text.pack(fill="both", expand=True)
text.focus_force()

last = [None]


def save():
    content = text.get("1.0", "end-1c")
    if content != last[0]:
        tmp = os.path.join(a.out, "text.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(content)
        os.replace(tmp, os.path.join(a.out, "text.txt"))
        last[0] = content
    root.after(50, save)


def ready():
    open(os.path.join(a.out, "ready"), "w").close()


root.after(50, save)
root.after(200, ready)
root.mainloop()
