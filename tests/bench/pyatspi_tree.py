"""The peer for berth's /accessibility: the whole desktop's AT-SPI tree read with pyatspi and
serialised with lxml the way OSWorld's server does it (one thread per application, a recursive
walk asking each node for its role, name, states, attributes, extents, text, value and actions).
Prints the seconds each of N runs took and the size of the last XML."""

import sys
import time
from concurrent.futures import ThreadPoolExecutor

import lxml.etree
import pyatspi

BASE = "https://accessibility.ubuntu.example.org/ns/"
NS = {p: BASE + s for p, s in [
    ("st", "state"), ("attr", "attributes"), ("cp", "component"), ("doc", "document"),
    ("docattr", "document/attributes"), ("txt", "text"), ("val", "value"), ("act", "action")]}


def walk(acc, depth):
    attrs = {"name": acc.name or ""}
    states = acc.getState().getStates()
    for s in states:
        attrs["{%s}%s" % (NS["st"], pyatspi.stateToString(s).replace("-", "_"))] = "true"
    try:
        for k, v in acc.get_attributes().items():
            attrs["{%s}%s" % (NS["attr"], k)] = v
    except Exception:
        pass
    names = {pyatspi.stateToString(s) for s in states}
    if "visible" in names and "showing" in names:
        try:
            c = acc.queryComponent()
            e = c.getExtents(pyatspi.XY_SCREEN)
            attrs["{%s}screencoord" % NS["cp"]] = str((e.x, e.y))
            attrs["{%s}size" % NS["cp"]] = str((e.width, e.height))
        except NotImplementedError:
            pass
    text = ""
    try:
        t = acc.queryText()
        text = t.getText(0, t.characterCount).replace("\ufffc", "").replace("\ufffd", "")
    except NotImplementedError:
        pass
    try:
        acc.queryImage()
        attrs["image"] = "true"
    except NotImplementedError:
        pass
    try:
        acc.querySelection()
        attrs["selection"] = "true"
    except NotImplementedError:
        pass
    try:
        v = acc.queryValue()
        attrs["{%s}value" % NS["val"]] = str(v.currentValue)
        attrs["{%s}min" % NS["val"]] = str(v.minimumValue)
        attrs["{%s}max" % NS["val"]] = str(v.maximumValue)
        attrs["{%s}step" % NS["val"]] = str(v.minimumIncrement)
    except NotImplementedError:
        pass
    try:
        a = acc.queryAction()
        for i in range(a.nActions):
            n = a.getName(i).replace(" ", "-")
            attrs["{%s}%s_desc" % (NS["act"], n)] = a.getDescription(i)
            attrs["{%s}%s_kb" % (NS["act"], n)] = a.getKeyBinding(i)
    except NotImplementedError:
        pass
    tag = (acc.getRoleName().strip() or "unknown").replace(" ", "-")
    node = lxml.etree.Element(tag, attrib=attrs, nsmap=NS)
    if text:
        node.text = "".join(ch for ch in text if ch in "\t\n\r" or ord(ch) >= 0x20)
    if depth < 50:
        try:
            for i, child in enumerate(acc):
                if i >= 1024:
                    break
                node.append(walk(child, depth + 1))
        except Exception:
            pass
    return node


def tree():
    root = lxml.etree.Element("desktop-frame", nsmap=NS)
    desktop = pyatspi.Registry.getDesktop(0)
    with ThreadPoolExecutor() as pool:
        for node in pool.map(lambda app: walk(app, 1), list(desktop)):
            root.append(node)
    return lxml.etree.tostring(root, encoding="unicode")


if __name__ == "__main__":
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    xml = ""
    for _ in range(runs):
        t0 = time.perf_counter()
        xml = tree()
        print("%.4f" % (time.perf_counter() - t0))
    print("xml_bytes %d" % len(xml))
