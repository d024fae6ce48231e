#!/usr/bin/env python3
"""Present Debian's Chromium under Google Chrome's names, for OSWorld's harness.

Run at image build time inside the image root:  python3 brand-chrome.py /usr/lib/chromium

1. Locale paks (locales/*.pak): every UI string that names the product "Chromium" now says
   "Google Chrome". The window title comes from IDS_BROWSER_WINDOW_TITLE_FORMAT
   ("$1 - Chromium"), a string in these paks, so titles end in " - Google Chrome".
   "The Chromium Authors" (copyright lines) is not the product name and stays.
2. <dir>/chrome: a hard link to <dir>/chromium, so exec'ing it gives the browser the process
   name (comm) "chrome" that `pkill chrome` matches; its paks are found next to it.

Not reachable from here: the AT-SPI application name. views' AuraLinuxApplication takes it
from ChromeViewsDelegate::GetApplicationName() = version_info::GetProductName(), the
compile-time PRODUCT_NAME "Chromium" in the binary, so AT-SPI still says "Chromium" (rename
it where the tree is served, or wrap atk_object_get_name with an LD_PRELOAD library).

Invariants:
- Paks are rewritten whole (new file + rename), never in place: the tree may be a hard-linked
  copy (cp -al), and Chromium may be reading the old file. Entry count, order, ids and the
  alias table are kept; only the offsets after a changed resource move.
- Only UTF-8/UTF-16 string resources are touched; anything starting with gzip (1f 8b) or
  brotli (1e 9b) magic is compressed data and is left as is.
- Idempotent: the replacement contains no "Chromium", so a second run changes nothing, and an
  existing correct link is kept. An unknown pak version stops the script (exit 1) before any
  write to that file, rather than risk a pak Chromium cannot read.
"""

import glob
import os
import re
import struct
import sys

OLD, NEW = "Chromium", "Google Chrome"
# "Chromium" not inside a longer word ("$1Chromium" counts: $1 is a placeholder; inflected
# forms in other locales, Finnish "Chromiumin", stay), except in "The Chromium Authors" (the
# copyright holder, not the product).
PATTERN = re.compile(r"(?<![A-Za-z])Chromium(?![A-Za-z]| Authors)")
COMPRESSED = (b"\x1f\x8b", b"\x1e\x9b")  # gzip, brotli (Chromium's own header)
CODECS = {1: "utf-8", 2: "utf-16-le"}  # pak encoding byte; 0 = binary


def read_pak(data):
    """Returns (version, encoding, [(id, bytes)], alias bytes) of a pak, version 4 or 5."""
    version = struct.unpack_from("<I", data, 0)[0]
    if version == 5:
        encoding = data[4]
        count, alias_count = struct.unpack_from("<HH", data, 8)
        pos = 12
    elif version == 4:
        count, encoding = struct.unpack_from("<IB", data, 4)
        alias_count, pos = 0, 9
    else:
        raise ValueError(f"unknown pak version {version}")
    # count entries plus a sentinel whose offset is the end of the last resource.
    table = [struct.unpack_from("<HI", data, pos + 6 * i) for i in range(count + 1)]
    pos += 6 * (count + 1)
    aliases = data[pos:pos + 4 * alias_count]  # (id u16, entry index u16): unchanged
    if pos + 4 * alias_count != table[0][1]:
        raise ValueError("data does not start right after the tables")
    resources = [(table[i][0], data[table[i][1]:table[i + 1][1]]) for i in range(count)]
    return version, encoding, resources, aliases


def write_pak(version, encoding, resources, aliases):
    count, alias_count = len(resources), len(aliases) // 4
    if version == 5:
        header = struct.pack("<IB3xHH", 5, encoding, count, alias_count)
    else:
        header = struct.pack("<IIB", 4, count, encoding)
    offset = len(header) + 6 * (count + 1) + len(aliases)
    table, body = [], []
    for rid, blob in resources:
        table.append(struct.pack("<HI", rid, offset))
        body.append(blob)
        offset += len(blob)
    table.append(struct.pack("<HI", 0, offset))  # sentinel
    return header + b"".join(table) + aliases + b"".join(body)


def brand_pak(path):
    """Rewrites one pak; returns how many resources changed."""
    with open(path, "rb") as f:
        data = f.read()
    version, encoding, resources, aliases = read_pak(data)
    codec = CODECS.get(encoding)
    if codec is None:
        return 0
    changed = 0
    for i, (rid, blob) in enumerate(resources):
        if blob.startswith(COMPRESSED) or OLD.encode(codec) not in blob:
            continue
        try:
            text = blob.decode(codec)
        except UnicodeDecodeError:
            continue
        new = PATTERN.sub(NEW, text)
        if new != text:
            resources[i] = (rid, new.encode(codec))
            changed += 1
    if changed:
        out = write_pak(version, encoding, resources, aliases)
        assert read_pak(out)[2] == resources  # round-trips before it replaces anything
        tmp = path + ".brand-tmp"
        with open(tmp, "wb") as f:
            f.write(out)
        os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        os.replace(tmp, path)
    return changed


def link_chrome(root):
    """Makes root/chrome the same inode as root/chromium; returns what it did."""
    src, dst = os.path.join(root, "chromium"), os.path.join(root, "chrome")
    if os.path.exists(dst) and os.path.samefile(src, dst):
        return "kept"
    # Also replaces a stale chrome left by a chromium upgrade (dpkg gives chromium a new inode).
    tmp = dst + ".brand-tmp"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.link(src, tmp)
    os.replace(tmp, dst)
    return "linked"


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} /usr/lib/chromium")
    root = sys.argv[1]
    paks = sorted(glob.glob(os.path.join(root, "locales", "*.pak")))
    if not paks:
        sys.exit(f"brand-chrome: no locale paks under {root}/locales")
    total = 0
    try:
        for path in paks:
            n = brand_pak(path)
            total += n
            if n:
                print(f"brand-chrome: {os.path.relpath(path, root)}: {n} strings rebranded")
    except (ValueError, struct.error) as e:
        sys.exit(f"brand-chrome: {path}: {e}")
    print(f"brand-chrome: {total} strings in {len(paks)} locale paks; "
          f"chrome -> chromium {link_chrome(root)}")


if __name__ == "__main__":
    main()
