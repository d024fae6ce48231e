"""Where an accessible object is on the screen, found in the AT-SPI tree the way an agent would:
`python3 locate.py APP ROLE NAME [INDEX]` prints `x y w h` in screen pixels for the INDEXth node
of APP with that role and name that is on screen. GTK 4 reports extents relative to the surface
the node is drawn on (its window, or a popover's own window): that window's place is added."""
import sys
import pyatspi
from Xlib import X, display

app_name, role, name = sys.argv[1:4]
index = int(sys.argv[4]) if len(sys.argv) > 4 else 0
d = display.Display()
root = d.screen().root


def windows_of(pid, cls):
    """(x, y, w, h, frame_left, frame_top) of the app's mapped top-level X windows."""
    out = []
    pid_atom = d.intern_atom("_NET_WM_PID")
    ext_atom = d.intern_atom("_GTK_FRAME_EXTENTS")
    for w in root.query_tree().children:
        try:
            if w.get_attributes().map_state != X.IsViewable:
                continue
            wc = w.get_wm_class()
            p = w.get_full_property(pid_atom, X.AnyPropertyType)
            if not ((p and p.value[0] == pid) or (wc and cls in wc)):
                continue
            g = w.get_geometry()
            e = w.get_full_property(ext_atom, X.AnyPropertyType)
            left, right, top, bottom = e.value if e else (0, 0, 0, 0)
            out.append((g.x, g.y, g.width, g.height, left, right, top, bottom))
        except Exception:
            pass
    return out


def gtk4_screen(app, node, x, y):
    wins = windows_of(app.get_process_id(), app.name)
    # A node on a popover: the popover's window is the one the size of its popover ancestor.
    a = node
    while a is not None and a.getRole() != pyatspi.ROLE_APPLICATION:
        if a is node and a.getRole() not in (pyatspi.ROLE_FRAME, pyatspi.ROLE_DIALOG):
            a = a.parent
            continue
        try:
            ax, ay, aw, ah = a.queryComponent().getExtents(pyatspi.DESKTOP_COORDS)
        except Exception:
            a = a.parent
            continue
        if a.getRole() in (pyatspi.ROLE_MENU, pyatspi.ROLE_WINDOW) or "Popover" in (a.name or ""):
            for wx, wy, ww, wh, *_ in wins:
                if (ww, wh) == (aw, ah):
                    return wx + x - ax, wy + y - ay
        if a.getRole() in (pyatspi.ROLE_FRAME, pyatspi.ROLE_DIALOG):
            break
        a = a.parent
    # Else the window its frame or dialog is: the one whose size inside its client-side
    # shadow is the frame's.
    fw, fh = a.queryComponent().getExtents(pyatspi.DESKTOP_COORDS)[2:] if a else (None, None)
    for wx, wy, ww, wh, l, r, t, b in wins:
        if fw is None or (abs(ww - l - r - fw) <= 1 and abs(wh - t - b - fh) <= 1):
            return wx + l + x, wy + t + y
    raise SystemExit(f"no window of {app.name} holds {node.getRoleName()} {node.name!r}")


found = []
gtk4 = False


def on_screen(n):
    s = n.getState()
    if not s.contains(pyatspi.STATE_VISIBLE):
        return False
    # GTK 4 sets no SHOWING state: VISIBLE (with a size) is what it says of a node in view.
    if not gtk4 and not s.contains(pyatspi.STATE_SHOWING):
        return False
    x, y, w, h = n.queryComponent().getExtents(pyatspi.DESKTOP_COORDS)
    return w > 0 and h > 0 and x > -10000 and y > -10000


def walk(n, depth):
    if depth > 60 or len(found) > index:
        return
    try:
        if n.getRoleName() == role and n.name == name and on_screen(n):
            found.append(n)
        for c in n:
            walk(c, depth + 1)
    except Exception:
        pass


for app in pyatspi.Registry.getDesktop(0):
    if app is not None and app.name == app_name:
        gtk4 = app.get_toolkit_name() == "GTK" and app.get_toolkit_version().startswith("4.")
        walk(app, 0)
        if len(found) > index:
            node = found[index]
            x, y, w, h = node.queryComponent().getExtents(pyatspi.DESKTOP_COORDS)
            if gtk4:
                x, y = gtk4_screen(app, node, x, y)
            print(x, y, w, h)
            sys.exit(0)
sys.exit(f"no {role} {name!r} of {app_name} on screen (found {len(found)})")
