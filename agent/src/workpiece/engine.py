"""berth workpiece engine: inspect, create, read, apply edits to and render office files and PDFs.

Run as `/usr/bin/python3 -I -c <this text>` with one JSON request on stdin; prints exactly one JSON
object on stdout and exits 0, also for refused requests. Office formats go through one persistent
headless LibreOffice per user (UNO over a named pipe); PDFs go through PyMuPDF (fitz).
Only the standard library, `uno` (python3-uno) and `fitz` (python3-fitz) are used.
"""

import base64
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import zipfile

# ---------------------------------------------------------------------------------------------
# Limits and fixed names
# ---------------------------------------------------------------------------------------------

MAX_FILE_BYTES = 50 * 1024 * 1024
MAX_OPS = 500
MAX_SET_CELLS = 10_000
MAX_TEXT_BYTES = 64 * 1024

READ_SLIDES_PER_PAGE = 20
READ_ROWS_PER_PAGE = 200
READ_MAX_COLUMNS = 100
READ_BLOCKS_PER_PAGE = 200
READ_TABLE_MAX_ROWS = 200
READ_PDF_PAGES_PER_PAGE = 10
READ_TEXT_CUT = 4000
READ_PDF_PAGE_TEXT_CUT = 20000

RENDER_MAX_PAGES = 20
RENDER_DEFAULT_PAGES = 5
RENDER_DPI_MIN = 30
RENDER_DPI_MAX = 150
RENDER_DPI_DEFAULT = 60

SOFFICE_CONNECT_SECONDS = 45   # a new soffice must answer on its pipe within this
SOFFICE_ANSWER_SECONDS = 15    # a running soffice that does not answer within this is killed
# The agent stops an engine run after 180 s; the engine gives up (and answers) before that.
ENGINE_BUDGET_SECONDS = 165

KIND_FORMATS = {
    "deck": ("pptx", "odp"),
    "sheet": ("xlsx", "ods"),
    "document": ("docx", "odt"),
    "pdf": ("pdf",),
}
KIND_NAMES = {"deck": "deck", "sheet": "sheet", "document": "document", "pdf": "PDF"}
STORE_FILTERS = {
    "xlsx": "Calc MS Excel 2007 XML",
    "ods": "calc8",
    "docx": "MS Word 2007 XML",
    "odt": "writer8",
    "pptx": "Impress MS PowerPoint 2007 XML",
    "odp": "impress8",
}
PDF_EXPORT_FILTERS = {
    "sheet": "calc_pdf_Export",
    "document": "writer_pdf_Export",
    "deck": "impress_pdf_Export",
}
NEW_DOCUMENT_URLS = {
    "sheet": "private:factory/scalc",
    "document": "private:factory/swriter",
    "deck": "private:factory/simpress",
}
UNO_DOCUMENT_SERVICES = {
    "sheet": "com.sun.star.sheet.SpreadsheetDocument",
    "document": "com.sun.star.text.TextDocument",
    "deck": "com.sun.star.presentation.PresentationDocument",
}
ODF_MIMETYPES = {
    "application/vnd.oasis.opendocument.presentation": ("deck", "odp"),
    "application/vnd.oasis.opendocument.spreadsheet": ("sheet", "ods"),
    "application/vnd.oasis.opendocument.text": ("document", "odt"),
}
OOXML_PARTS = (("word/", "document", "docx"), ("xl/", "sheet", "xlsx"), ("ppt/", "deck", "pptx"))
LOOKS_LIKE = {
    "pdf": "a PDF document",
    "docx": "a Word document (.docx)",
    "xlsx": "an Excel workbook (.xlsx)",
    "pptx": "a PowerPoint deck (.pptx)",
    "odt": "an OpenDocument text (.odt)",
    "ods": "an OpenDocument spreadsheet (.ods)",
    "odp": "an OpenDocument presentation (.odp)",
}

PDF_TITLE_FONTS = (
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
)


# ---------------------------------------------------------------------------------------------
# Refusals and request fields
# ---------------------------------------------------------------------------------------------

class Refusal(Exception):
    """A request the engine answers with {"ok": false, ...}."""

    def __init__(self, status, code, message):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.index = None
        self.operation = None

    def answer(self):
        out = {"ok": False, "status": self.status, "code": self.code, "message": self.message}
        if self.index is not None:
            out["index"] = self.index
            out["operation"] = self.operation
        return out


def bad_request(msg):
    return Refusal(400, "bad_request", msg)


def bad_operation(msg):
    return Refusal(400, "bad_operation", msg)


def wrong_kind(msg):
    return Refusal(400, "wrong_kind", msg)


def not_found(msg):
    return Refusal(404, "not_found", msg)


def forbidden(msg):
    return Refusal(403, "forbidden", msg)


def too_large(msg):
    return Refusal(413, "too_large", msg)


def engine_failure(msg):
    return Refusal(500, "engine", msg)


_MISSING = object()


def get_field(obj, name, kind, default=_MISSING):
    """Field `name` of dict `obj`, checked to be of `kind`: str, int, number, bool, list, dict, any."""
    if name not in obj or obj[name] is None:
        if default is _MISSING:
            raise bad_request(f"field '{name}' is missing")
        return default
    value = obj[name]
    ok = {
        "str": isinstance(value, str),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool)
        and math.isfinite(value),
        "bool": isinstance(value, bool),
        "list": isinstance(value, list),
        "dict": isinstance(value, dict),
        "any": True,
    }[kind]
    if not ok:
        article = {"int": "an integer", "list": "a list", "dict": "an object", "any": "a value"}
        raise bad_request(f"field '{name}' must be {article.get(kind, 'a ' + kind)}")
    if kind == "str":
        check_text_size(name, value)
    return value


def get_index(obj, name, default=_MISSING):
    value = get_field(obj, name, "int", default)
    if value is not None and value < 0:
        raise bad_request(f"field '{name}' must be 0 or more (indexes are 0-based)")
    return value


def check_text_size(name, text):
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_TEXT_BYTES:
        raise too_large(f"field '{name}' holds {size} bytes; the limit is {MAX_TEXT_BYTES}")


def cut_text(text, limit=READ_TEXT_CUT):
    """(text cut to limit characters, whether it was cut)."""
    if len(text) > limit:
        return text[:limit], True
    return text, False


def page_window(total, per_page, page, what):
    """(first, end) of read page `page` over `total` items; refuses pages past the end."""
    pages = max(1, math.ceil(total / per_page))
    if page >= pages:
        raise bad_request(f"page {page} does not exist: the {what} fill {pages} page(s) of "
                          f"{per_page}, numbered from 0")
    first = page * per_page
    return first, min(total, first + per_page), pages


# ---------------------------------------------------------------------------------------------
# Files: paths, kind sniffing, hashing, atomic output
# ---------------------------------------------------------------------------------------------

def request_path(req, name="path"):
    path = get_field(req, name, "str")
    if not path or "\0" in path:
        raise bad_request(f"field '{name}' must be a non-empty path")
    return os.path.abspath(path)


def extension_of(path):
    return os.path.splitext(path)[1].lower().lstrip(".")


def formats_text(kind):
    return " or ".join("." + f for f in KIND_FORMATS[kind])


def check_extension(path, kind):
    ext = extension_of(path)
    if ext not in KIND_FORMATS[kind]:
        shown = f"extension '.{ext}'" if ext else "no extension"
        raise wrong_kind(f"'{path}' has {shown}; a {KIND_NAMES[kind]} must be {formats_text(kind)}")
    return ext


def sniff(path):
    """(kind or None, format or None, what the content looks like)."""
    with open(path, "rb") as f:
        head = f.read(8)
        text_head = head + f.read(4088)
    if head.startswith(b"%PDF-"):
        return "pdf", "pdf", LOOKS_LIKE["pdf"]
    if not head:
        return None, None, "an empty file"
    if head.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(path) as zf:
                names = zf.namelist()
                if "mimetype" in names:
                    with zf.open("mimetype") as m:
                        mime = m.read(200).decode("ascii", "replace").strip()
                    if mime in ODF_MIMETYPES:
                        kind, fmt = ODF_MIMETYPES[mime]
                        return kind, fmt, LOOKS_LIKE[fmt]
                    return None, None, f"an OpenDocument file of type '{mime}'"
                if "[Content_Types].xml" in names:
                    for prefix, kind, fmt in OOXML_PARTS:
                        if any(n.startswith(prefix) for n in names):
                            return kind, fmt, LOOKS_LIKE[fmt]
                    return None, None, "an Office Open XML package without Word, Excel or PowerPoint parts"
        except (zipfile.BadZipFile, OSError, EOFError):
            return None, None, "a damaged zip archive"
        return None, None, "a zip archive"
    if head.startswith(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"):
        return None, None, "a legacy binary Office file (.doc/.xls/.ppt)"
    if head.startswith(b"\x89PNG"):
        return None, None, "a PNG image"
    if head.startswith(b"\xff\xd8\xff"):
        return None, None, "a JPEG image"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return None, None, "a GIF image"
    try:
        text_head.decode("utf-8")
        return None, None, "a plain text file"
    except UnicodeDecodeError:
        if b"\0" not in text_head:
            return None, None, "a text file"
    return None, None, "binary data of an unknown type"


def check_source(path, kind):
    """Checks that `path` is a readable file of `kind`; returns (size, format from the content)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise not_found(f"'{path}' does not exist")
    except NotADirectoryError:
        raise not_found(f"'{path}' does not exist (a parent is not a directory)")
    except PermissionError:
        raise forbidden(f"'{path}' cannot be reached: permission denied")
    if os.path.isdir(path):
        raise wrong_kind(f"'{path}' is a directory, not a {KIND_NAMES[kind]}")
    if not stat.S_ISREG(st.st_mode):
        raise wrong_kind(f"'{path}' is not a regular file, so not a {KIND_NAMES[kind]}")
    if st.st_size > MAX_FILE_BYTES:
        raise too_large(f"'{path}' is {st.st_size} bytes; the limit is {MAX_FILE_BYTES}")
    try:
        found_kind, fmt, looks = sniff(path)
    except PermissionError:
        raise forbidden(f"'{path}' cannot be read: permission denied")
    except IsADirectoryError:
        raise wrong_kind(f"'{path}' is a directory, not a {KIND_NAMES[kind]}")
    if found_kind != kind:
        raise wrong_kind(f"'{path}' is not a {KIND_NAMES[kind]} ({formats_text(kind)}): "
                         f"its content looks like {looks}")
    check_extension(path, kind)
    return st.st_size, fmt


def file_digest(path):
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def check_new_file_dir(path, what):
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise not_found(f"the directory of {what} '{path}' does not exist")
    if os.path.isdir(path):
        raise bad_request(f"{what} '{path}' is a directory")


def reserve_temp_beside(path):
    """A new empty temp file in the directory of `path` (for an atomic replace)."""
    parent, name = os.path.split(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".berth-tmp", dir=parent)
    except PermissionError:
        raise forbidden(f"cannot write in '{parent}': permission denied")
    except OSError as e:
        raise forbidden(f"cannot write in '{parent}': {e.strerror}")
    os.close(fd)
    return tmp


def commit_temp(tmp, path):
    """fsync `tmp`, move it onto `path`, fsync the directory."""
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:
        dfd = os.open(os.path.dirname(path), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def remove_quietly(path):
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


def written_answer(path, kind, extra=None):
    size, digest = file_digest(path)
    out = {"ok": True, "kind": kind, "format": extension_of(path), "size": size, "sha256": digest}
    if extra:
        out.update(extra)
    return out


# ---------------------------------------------------------------------------------------------
# LibreOffice: one persistent headless soffice per user, serialised with flock
# ---------------------------------------------------------------------------------------------

class Office:
    def __init__(self):
        home = os.environ.get("HOME") or os.path.expanduser("~")
        self.base = os.path.join(home, ".cache", "berth")
        self.profile = os.path.join(self.base, "workpiece-lo")
        self.lock_path = os.path.join(self.base, "workpiece.lock")
        self.pipe = f"berth-workpiece-{os.getuid()}"
        self.lock_fd = None
        self.ctx = None
        self.desktop = None
        self.timed_out = False

    # -- serialisation ------------------------------------------------------------------------
    def lock(self):
        try:
            os.makedirs(self.base, mode=0o700, exist_ok=True)
            self.lock_fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise engine_failure(f"LibreOffice cannot be used: cannot create {self.lock_path}: "
                                 f"{e.strerror}")
        waited = time.monotonic()
        while True:
            try:
                fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time_left() < SOFFICE_CONNECT_SECONDS:
                    raise engine_failure(f"LibreOffice stayed busy with another request for "
                                         f"{time.monotonic() - waited:.0f} s")
                time.sleep(0.1)

    def unlock(self):
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None

    # -- processes ----------------------------------------------------------------------------
    def our_processes(self):
        """Pids of this user's processes started with our --accept pipe (oosplash, soffice.bin)."""
        marker = f"--accept=pipe,name={self.pipe};".encode()
        uid = os.getuid()
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.stat(f"/proc/{entry}").st_uid != uid:
                    continue
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker in f.read():
                        pids.append(int(entry))
            except OSError:
                continue
        return pids

    def kill(self):
        """SIGKILL our soffice processes (by pid) and wait until they are gone."""
        pids = self.our_processes()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        deadline = time.monotonic() + 10
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if os.path.exists(f"/proc/{p}") and not _is_zombie(p)]
            time.sleep(0.05)

    def start(self):
        self.kill()
        # A soffice that died leaves its profile lock behind; nobody else may use this profile
        # while we hold the flock, so it is stale by construction.
        remove_quietly(os.path.join(self.profile, ".lock"))
        args = [soffice_binary(), "--headless", "--invisible", "--nologo", "--norestore", "--nodefault",
                "--nolockcheck", "-env:UserInstallation=file://" + _url_quote(self.profile),
                f"--accept=pipe,name={self.pipe};urp;"]
        try:
            return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True,
                                    close_fds=True, cwd="/")
        except OSError as e:
            raise engine_failure(f"LibreOffice failed to start: cannot run soffice ({e.strerror})")

    # -- connection ---------------------------------------------------------------------------
    def _resolve(self):
        import uno
        local = uno.getComponentContext()
        resolver = local.ServiceManager.createInstanceWithContext(
            "com.sun.star.bridge.UnoUrlResolver", local)
        return resolver.resolve(f"uno:pipe,name={self.pipe};urp;StarOffice.ComponentContext")

    def connect(self):
        """Connects to this user's soffice: the running one if it answers within
        SOFFICE_ANSWER_SECONDS, else a new one (a dead or hung one is killed first)."""
        try:
            import uno  # noqa: F401
        except ImportError:
            raise engine_failure("LibreOffice cannot be used: the python3-uno module is missing")
        self.ctx = self.desktop = None
        if self.our_processes():
            hung = threading.Timer(SOFFICE_ANSWER_SECONDS, self.kill)
            hung.daemon = True
            hung.start()
            try:
                self.attach(self._resolve())
                return
            except Exception:
                self.ctx = self.desktop = None
            finally:
                hung.cancel()
        proc = self.start()
        deadline = time.monotonic() + SOFFICE_CONNECT_SECONDS
        restarted = False
        while True:
            time.sleep(0.1)
            try:
                ctx = self._resolve()
                break
            except Exception:
                pass
            if proc.poll() is not None:
                if restarted:
                    raise engine_failure(f"LibreOffice failed to start: soffice exited with "
                                         f"code {proc.returncode}")
                restarted = True
                proc = self.start()
            if time.monotonic() > deadline:
                self.kill()
                raise engine_failure(f"LibreOffice failed to start: no answer on its pipe "
                                     f"within {SOFFICE_CONNECT_SECONDS} s")
        self.attach(ctx)

    def attach(self, ctx):
        desktop = ctx.ServiceManager.createInstanceWithContext("com.sun.star.frame.Desktop", ctx)
        # Close documents an earlier engine run that was killed may have left open: nobody else
        # uses this soffice while we hold the flock.
        components = desktop.getComponents().createEnumeration()
        while components.hasMoreElements():
            close_document(components.nextElement())
        self.ctx, self.desktop = ctx, desktop

    def run(self, work):
        """Runs work(self) against a connected soffice; restarts soffice and retries once when the
        bridge dies mid-call; a watchdog kills a soffice that hangs."""
        global OFFICE
        OFFICE = self
        self.lock()
        try:
            for attempt in (1, 2):
                self.timed_out = False
                watchdog = threading.Timer(max(1.0, time_left()), self._on_timeout)
                watchdog.daemon = True
                watchdog.start()
                try:
                    if self.desktop is None:
                        self.connect()
                    return work(self)
                except Refusal:
                    raise
                except Exception as e:
                    if self.timed_out:
                        raise engine_failure(f"LibreOffice did not finish within "
                                             f"{ENGINE_BUDGET_SECONDS} s and was stopped")
                    if office_down(e) and attempt == 1:
                        self.kill()
                        self.ctx = self.desktop = None
                        continue
                    if _is_uno_exception(e):
                        raise engine_failure(f"LibreOffice failed: {_uno_message(e)}")
                    raise
                finally:
                    watchdog.cancel()
        finally:
            self.unlock()

    def alive(self):
        """Whether our soffice runs and answers a call."""
        if self.desktop is None or not self.our_processes():
            return False
        try:
            self.desktop.getComponents()
            return True
        except Exception:
            return False

    def _on_timeout(self):
        self.timed_out = True
        self.kill()


_STARTED = time.monotonic()
OFFICE = None  # the Office of this run, once it is used


def time_left():
    """Seconds left of this run's budget."""
    return ENGINE_BUDGET_SECONDS - (time.monotonic() - _STARTED)


def soffice_binary():
    for candidate in ("/usr/bin/soffice", shutil.which("soffice"),
                      "/usr/lib/libreoffice/program/soffice"):
        if candidate and os.path.exists(candidate):
            return candidate
    raise engine_failure("LibreOffice failed to start: soffice is not installed")


def _is_zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _url_quote(path):
    from urllib.parse import quote
    return quote(path)


def _is_uno_exception(e):
    return hasattr(e, "typeName")


def _uno_message(e):
    msg = (getattr(e, "Message", None) or str(e) or "").strip()
    return msg.splitlines()[0] if msg else getattr(e, "typeName", type(e).__name__)


def office_down(e):
    """Whether exception `e` means the connection to soffice is gone (then the request is retried
    once with a new soffice) rather than a failure of the call itself."""
    name = getattr(e, "typeName", "") or type(e).__name__
    text = (getattr(e, "Message", "") or str(e)).lower()
    if "DisposedException" in name or "bridge" in text or "broken pipe" in text:
        return True
    return OFFICE is not None and not OFFICE.alive()


# -- UNO helpers ------------------------------------------------------------------------------

def props(**kw):
    from com.sun.star.beans import PropertyValue
    out = []
    for key, value in kw.items():
        p = PropertyValue()
        p.Name = key
        p.Value = value
        out.append(p)
    return tuple(out)


def uno_const(name):
    import uno
    return uno.getConstantByName(name)


def file_url(path):
    import uno
    return uno.systemPathToFileUrl(path)


def load_document(office, path, kind, read_only, hidden=True):
    load_props = props(Hidden=hidden, ReadOnly=read_only, MacroExecutionMode=0, UpdateDocMode=0)
    try:
        doc = office.desktop.loadComponentFromURL(file_url(path), "_blank", 0, load_props)
    except Exception as e:
        if office_down(e):
            raise
        raise engine_failure(f"LibreOffice failed to load '{path}': {_uno_message(e)}")
    if doc is None:
        raise engine_failure(f"LibreOffice failed to load '{path}'")
    service = UNO_DOCUMENT_SERVICES[kind]
    if not doc.supportsService(service):
        close_document(doc)
        raise wrong_kind(f"'{path}' is not a {KIND_NAMES[kind]}: LibreOffice opened it as another "
                         "kind of document")
    return doc


def new_document(office, kind):
    doc = office.desktop.loadComponentFromURL(NEW_DOCUMENT_URLS[kind], "_blank", 0,
                                              props(Hidden=True))
    if doc is None:
        raise engine_failure(f"LibreOffice failed to create a new {KIND_NAMES[kind]}")
    return doc


def store_document(doc, path, fmt):
    doc.storeToURL(file_url(path), props(FilterName=STORE_FILTERS[fmt], Overwrite=True))


def export_pdf(doc, kind, path, max_pages):
    import uno
    from com.sun.star.beans import PropertyValue
    page_range = PropertyValue()
    page_range.Name = "PageRange"
    page_range.Value = f"1-{max_pages}"
    filter_data = uno.Any("[]com.sun.star.beans.PropertyValue", (page_range,))
    doc.storeToURL(file_url(path), props(FilterName=PDF_EXPORT_FILTERS[kind],
                                          FilterData=filter_data, Overwrite=True))


def close_document(doc):
    if doc is None:
        return
    try:
        doc.close(True)
    except Exception:
        try:
            doc.dispose()
        except Exception:
            pass


def set_title_metadata(doc, title):
    if title is not None:
        doc.getDocumentProperties().Title = title


# ---------------------------------------------------------------------------------------------
# Sheets (Calc)
# ---------------------------------------------------------------------------------------------

SHEET_NAME_FORBIDDEN = set("[]*?:/\\")
# LibreOffice error codes that depend on the data rather than on the formula text: such formulas
# are kept and reported as warnings. Every other error marks a bad formula.
FORMULA_DATA_ERRORS = {502: "#NUM!", 503: "#NUM!", 519: "#VALUE!", 523: "#NUM!",
                       532: "#DIV/0!", 32767: "#N/A"}
# How Excel shows LibreOffice's error codes (others are shown as LibreOffice shows them).
EXCEL_ERROR_VALUES = {**FORMULA_DATA_ERRORS, 521: "#NULL!", 524: "#REF!", 525: "#NAME?"}
FORMULA_ERROR_NAMES = {
    501: "invalid character", 504: "error in the parameter list", 507: "missing pair",
    508: "missing bracket", 509: "missing operator", 510: "missing variable",
    511: "missing variable", 512: "formula overflow", 513: "string overflow",
    514: "internal overflow", 516: "internal syntax error", 517: "internal syntax error",
    518: "internal syntax error", 520: "internal syntax error", 521: "no result",
    522: "circular reference", 524: "invalid reference", 525: "unknown name or function",
    526: "internal syntax error", 527: "internal overflow", 533: "nested arrays not supported",
    538: "error: array or matrix size", 539: "unsupported inline array content",
    540: "external content disabled",
}


def col_letters(col):
    out = ""
    col += 1
    while col:
        col, rem = divmod(col - 1, 26)
        out = chr(65 + rem) + out
    return out


def cell_ref(col, row):
    return f"{col_letters(col)}{row + 1}"


_REF_RE = re.compile(r"^\$?([A-Za-z]{1,3})\$?([0-9]{1,7})$")


def parse_cell_ref(text):
    m = _REF_RE.match(text.strip())
    if not m:
        return None
    col = 0
    for ch in m.group(1).upper():
        col = col * 26 + (ord(ch) - 64)
    row = int(m.group(2))
    if row < 1:
        return None
    return col - 1, row - 1


def parse_range(text):
    """(col0, row0, col1, row1) from "A1" or "A1:B2"; None when it is not such a range."""
    parts = text.split(":")
    if len(parts) > 2:
        return None
    ends = [parse_cell_ref(p) for p in parts]
    if None in ends:
        return None
    (c0, r0), (c1, r1) = ends[0], ends[-1]
    return min(c0, c1), min(r0, r1), max(c0, c1), max(r0, r1)


def sheet_by_name(doc, name):
    sheets = doc.getSheets()
    if not sheets.hasByName(name):
        raise bad_operation(f"sheet '{name}' does not exist; sheets: "
                            + ", ".join(f"'{n}'" for n in sheets.getElementNames()))
    return sheets.getByName(name)


def used_area(sheet):
    """(col0, row0, col1, row1) of the used area, or None for an empty sheet."""
    cursor = sheet.createCursor()
    cursor.gotoStartOfUsedArea(False)
    cursor.gotoEndOfUsedArea(True)
    a = cursor.getRangeAddress()
    if a.StartColumn == a.EndColumn and a.StartRow == a.EndRow:
        cell = sheet.getCellByPosition(a.StartColumn, a.StartRow)
        if cell.getType().value == "EMPTY":
            return None
    return a.StartColumn, a.StartRow, a.EndColumn, a.EndRow


def range_text(area):
    if area is None:
        return None
    c0, r0, c1, r1 = area
    return f"{cell_ref(c0, r0)}:{cell_ref(c1, r1)}"


def excel_formula_parser(doc):
    """A FormulaParser speaking Excel A1 syntax with English names and ',' separators."""
    mapper = doc.createInstance("com.sun.star.sheet.FormulaOpCodeMapper")
    lang = uno_const("com.sun.star.sheet.FormulaLanguage.XL_ENGLISH")
    parser = doc.createInstance("com.sun.star.sheet.FormulaParser")
    parser.CompileEnglish = True
    parser.FormulaConvention = uno_const("com.sun.star.sheet.AddressConvention.XL_A1")
    parser.OpCodeMap = (
        mapper.getAvailableMappings(lang, uno_const("com.sun.star.sheet.FormulaMapGroup.SPECIAL"))
        + mapper.getAvailableMappings(
            lang, uno_const("com.sun.star.sheet.FormulaMapGroup.ALL_EXCEPT_SPECIAL")))
    return parser


def cell_address(sheet_index, col, row):
    from com.sun.star.table import CellAddress
    a = CellAddress()
    a.Sheet, a.Column, a.Row = sheet_index, col, row
    return a


def formula_text_problem(formula):
    """A sentence naming an unbalanced bracket or quote, which LibreOffice would silently fix."""
    depth = {"(": 0, "{": 0}
    closing = {")": "(", "}": "{"}
    quote = None
    for ch in formula:
        if quote:
            if ch == quote:
                quote = None
            continue
        if ch in "\"'":
            quote = ch
        elif ch in depth:
            depth[ch] += 1
        elif ch in closing:
            depth[closing[ch]] -= 1
            if depth[closing[ch]] < 0:
                return f"an unmatched '{ch}'"
    if quote:
        return "an unterminated " + ("string" if quote == '"' else "quoted sheet name")
    for opener, count in depth.items():
        if count:
            return f"a missing closing '{')' if opener == '(' else '}'}'"
    if formula.strip() == "=":
        return "nothing after '='"
    return None


def cell_kinds(doc, rng):
    """{(col, row): "bool" | "date"} for cells in rng whose number format is boolean or a date."""
    logical = uno_const("com.sun.star.util.NumberFormat.LOGICAL")
    datelike = (uno_const("com.sun.star.util.NumberFormat.DATE")
                | uno_const("com.sun.star.util.NumberFormat.TIME"))
    formats = doc.getNumberFormats()
    kinds = {}
    unique = rng.getUniqueCellFormatRanges()
    for i in range(unique.getCount()):
        ranges = unique.getByIndex(i)
        try:
            ftype = formats.getByKey(ranges.NumberFormat).Type
        except Exception:
            continue
        kind = "bool" if ftype & logical else "date" if ftype & datelike else None
        if kind is None:
            continue
        for a in ranges.getRangeAddresses():
            for row in range(a.StartRow, a.EndRow + 1):
                for col in range(a.StartColumn, a.EndColumn + 1):
                    kinds[(col, row)] = kind
    return kinds


def cells_of(ranges):
    out = set()
    for a in ranges.getRangeAddresses():
        for row in range(a.StartRow, a.EndRow + 1):
            for col in range(a.StartColumn, a.EndColumn + 1):
                out.add((col, row))
    return out


def json_number(x):
    if isinstance(x, float) and x.is_integer() and abs(x) < 2 ** 53:
        return int(x)
    return x


def read_sheet(doc, req, page):
    sheets = doc.getSheets()
    names = list(sheets.getElementNames())
    listing = []
    for i, name in enumerate(names):
        listing.append({"name": name, "index": i,
                        "used_range": range_text(used_area(sheets.getByIndex(i)))})
    selected = get_field(req, "sheet", "str", names[0])
    if selected not in names:
        raise bad_request(f"sheet '{selected}' does not exist; sheets: "
                          + ", ".join(f"'{n}'" for n in names))
    sheet = sheets.getByName(selected)
    area = used_area(sheet)
    answer = {"sheets": listing, "sheet": selected, "rows": []}
    if area is None:
        page_window(0, READ_ROWS_PER_PAGE, page, f"rows of sheet '{selected}'")
        answer["pages"] = 1
        return answer
    c0, r0, c1, r1 = area
    first, end, pages = page_window(r1 - r0 + 1, READ_ROWS_PER_PAGE, page,
                                    f"rows of sheet '{selected}'")
    answer["pages"] = pages
    if c1 - c0 + 1 > READ_MAX_COLUMNS:
        c1 = c0 + READ_MAX_COLUMNS - 1
        answer["columns_cut"] = True
    top, bottom = r0 + first, r0 + end - 1
    rng = sheet.getCellRangeByPosition(c0, top, c1, bottom)
    values = rng.getDataArray()
    formulas = rng.getFormulaArray()
    formula_cells = cells_of(rng.queryContentCells(
        uno_const("com.sun.star.sheet.CellFlags.FORMULA")))
    error_cells = cells_of(rng.queryFormulaCells(
        uno_const("com.sun.star.sheet.FormulaResult.ERROR")))
    kinds = cell_kinds(doc, rng)
    parser = excel_formula_parser(doc) if formula_cells else None
    sheet_index = rng.getRangeAddress().Sheet
    for dr, row_values in enumerate(values):
        row = top + dr
        cells = []
        for dc, value in enumerate(row_values):
            col = c0 + dc
            if formulas[dr][dc] == "" and (col, row) not in formula_cells:
                continue
            cell = {"ref": cell_ref(col, row)}
            if (col, row) in error_cells:
                error_cell = sheet.getCellByPosition(col, row)
                value = EXCEL_ERROR_VALUES.get(error_cell.getError()) or error_cell.getString()
                cell["error"] = True
            elif isinstance(value, float):
                kind = kinds.get((col, row))
                if kind == "bool" and (col, row) not in formula_cells:
                    value = bool(value)
                else:
                    value = json_number(value)
                    if kind == "date":
                        cell["text"] = sheet.getCellByPosition(col, row).getString()
            elif isinstance(value, str):
                value, cut = cut_text(value)
                if cut:
                    cell["truncated"] = True
            cell["value"] = value
            if (col, row) in formula_cells:
                c = sheet.getCellByPosition(col, row)
                formula = "=" + parser.printFormula(c.getTokens(),
                                                    cell_address(sheet_index, col, row))
                if formula in ("=TRUE()", "=FALSE()"):
                    # LibreOffice imports an .xlsx boolean cell as this formula
                    cell["value"] = formula == "=TRUE()"
                else:
                    cell["formula"] = formula
            cells.append(cell)
        if cells:
            answer["rows"].append({"row": row + 1, "cells": cells})
    return answer


class SheetEdit:
    """State for one apply on a spreadsheet."""

    def __init__(self, doc, out_format):
        self.doc = doc
        self.out_format = out_format
        self.parser = None
        self.formulas = []  # (op index, sheet, {(col, row): formula text})
        self.op_index = None
        self.warnings = []

    def formula_parser(self):
        if self.parser is None:
            self.parser = excel_formula_parser(self.doc)
        return self.parser

    def check_sheet_name(self, name):
        if not name.strip():
            raise bad_operation("a sheet name must not be empty")
        bad = sorted(set(name) & SHEET_NAME_FORBIDDEN)
        if bad:
            raise bad_operation(f"sheet name '{name}' holds {' '.join(bad)}, which sheet names "
                                "may not contain")
        if self.out_format == "xlsx" and len(name) > 31:
            raise bad_operation(f"sheet name '{name}' is longer than the 31 characters an .xlsx "
                                "sheet name may have")
        if self.doc.getSheets().hasByName(name):
            raise bad_operation(f"sheet '{name}' already exists")

    def set_cells(self, op):
        name = get_field(op, "sheet", "str")
        sheet = sheet_by_name(self.doc, name)
        range_name = get_field(op, "range", "str")
        values = get_field(op, "values", "list")
        bounds = parse_range(range_name)
        if bounds is None:
            raise bad_operation(f"range '{range_name}' is not an A1 reference like 'C3' or "
                                "'A1:B2'")
        c0, r0, c1, r1 = bounds
        rows, cols = r1 - r0 + 1, c1 - c0 + 1
        if rows * cols > MAX_SET_CELLS:
            raise too_large(f"range '{range_name}' has {rows * cols} cells; set_cells takes at "
                            f"most {MAX_SET_CELLS}")
        max_cols, max_rows = sheet.getColumns().getCount(), sheet.getRows().getCount()
        if c1 >= max_cols or r1 >= max_rows:
            raise bad_operation(f"range '{range_name}' lies outside the sheet "
                                f"({cell_ref(max_cols - 1, max_rows - 1)} is its last cell)")
        if len(values) != rows or any(not isinstance(r, list) or len(r) != cols for r in values):
            shape = f"{len(values)} row(s)"
            if values and all(isinstance(r, list) for r in values):
                shape += " of " + "/".join(sorted({str(len(r)) for r in values})) + " value(s)"
            raise bad_operation(f"range '{range_name}' is {rows} row(s) x {cols} column(s) but "
                                f"values has {shape}; give a list of rows of values")
        rng = sheet.getCellRangeByPosition(c0, r0, c1, r1)
        sheet_index = rng.getRangeAddress().Sheet
        was_bool = {cell for cell, kind in cell_kinds(self.doc, rng).items() if kind == "bool"}
        data, bools, unformat, formulas = [], [], [], {}
        for dr, row_values in enumerate(values):
            row_data = []
            for dc, value in enumerate(row_values):
                col, row = c0 + dc, r0 + dr
                if isinstance(value, bool):
                    row_data.append(1.0 if value else 0.0)
                    bools.append((col, row))
                    continue
                if value is None:
                    row_data.append("")
                elif isinstance(value, (int, float)):
                    if not math.isfinite(value):
                        raise bad_operation(f"value for {cell_ref(col, row)} is not a finite number")
                    row_data.append(float(value))
                elif isinstance(value, str):
                    check_text_size(f"values[{dr}][{dc}]", value)
                    if value.startswith("="):
                        problem = formula_text_problem(value)
                        if problem:
                            raise Refusal(400, "bad_formula", f"formula '{value}' for "
                                          f"{name}!{cell_ref(col, row)} has {problem}")
                        formulas[(col, row)] = value
                    row_data.append("" if value.startswith("=") else value)
                else:
                    raise bad_operation(f"value for {cell_ref(col, row)} must be a number, "
                                        "string, boolean or null")
                if (col, row) in was_bool:
                    unformat.append((col, row))
            data.append(tuple(row_data))
        # Plain values in one call; booleans are 1/0 with a boolean number format; formulas are
        # parsed in Excel syntax and set as tokens cell by cell.
        rng.setDataArray(tuple(data))
        logical = self.doc.getNumberFormats().getStandardFormat(
            uno_const("com.sun.star.util.NumberFormat.LOGICAL"), _locale())
        self.set_number_format(sheet_index, bools, logical)
        self.set_number_format(sheet_index, unformat, 0)
        parser = self.formula_parser() if formulas else None
        for (col, row), text in formulas.items():
            try:
                tokens = parser.parseFormula(text, cell_address(sheet_index, col, row))
                sheet.getCellByPosition(col, row).setTokens(tokens)
            except Exception as e:
                if office_down(e):
                    raise
                raise Refusal(400, "bad_formula", f"formula '{text}' for {name}!{cell_ref(col, row)} "
                              f"cannot be parsed: {_uno_message(e)}")
        if formulas:
            self.formulas.append((self.op_index, sheet, formulas))

    def set_number_format(self, sheet_index, cells, number_format):
        """Sets one number format on many cells with one property write."""
        if not cells:
            return
        from com.sun.star.table import CellRangeAddress
        ranges = self.doc.createInstance("com.sun.star.sheet.SheetCellRanges")
        addresses = []
        for col, row in cells:
            a = CellRangeAddress()
            a.Sheet, a.StartColumn, a.StartRow, a.EndColumn, a.EndRow = (
                sheet_index, col, row, col, row)
            addresses.append(a)
        ranges.addRangeAddresses(tuple(addresses), True)
        ranges.NumberFormat = number_format

    def add_sheet(self, op):
        name = get_field(op, "name", "str")
        sheets = self.doc.getSheets()
        count = sheets.getCount()
        index = get_index(op, "index", count)
        if index > count:
            raise bad_operation(f"index {index} is past the end: the workbook has {count} "
                                f"sheet(s), so the index can be 0..{count}")
        self.check_sheet_name(name)
        sheets.insertNewByName(name, index)

    def rename_sheet(self, op):
        sheet = sheet_by_name(self.doc, get_field(op, "sheet", "str"))
        name = get_field(op, "name", "str")
        if name == sheet.getName():
            return
        self.check_sheet_name(name)
        sheet.setName(name)

    def delete_sheet(self, op):
        name = get_field(op, "sheet", "str")
        sheet_by_name(self.doc, name)
        sheets = self.doc.getSheets()
        if sheets.getCount() == 1:
            raise bad_operation(f"sheet '{name}' is the only sheet; a workbook needs one")
        sheets.removeByName(name)

    def finish(self):
        """Checks every formula this request set, now that all values are in place: one query for
        error cells per sheet, then a look at those cells only."""
        self.doc.calculateAll()
        latest = {}  # (sheet name, col, row) -> (op index, formula text, sheet)
        for op_index, sheet, formulas in self.formulas:
            try:
                sheet_name = sheet.getName()
            except Exception:
                continue  # its sheet was deleted by a later operation
            for (col, row), text in formulas.items():
                latest[(sheet_name, col, row)] = (op_index, text, sheet)
        error_flag = uno_const("com.sun.star.sheet.FormulaResult.ERROR")
        errors_by_sheet = {}
        for (sheet_name, col, row), (op_index, text, sheet) in sorted(
                latest.items(), key=lambda item: item[1][0]):
            if sheet_name not in errors_by_sheet:
                errors_by_sheet[sheet_name] = cells_of(sheet.queryFormulaCells(error_flag))
            if (col, row) not in errors_by_sheet[sheet_name]:
                continue
            cell = sheet.getCellByPosition(col, row)
            code = cell.getError()
            ref = cell_ref(col, row)
            if code == 0:
                continue
            if code in FORMULA_DATA_ERRORS:
                self.warnings.append(f"{sheet_name}!{ref}: '{text}' currently gives "
                                     f"{FORMULA_DATA_ERRORS[code]}")
                continue
            what = FORMULA_ERROR_NAMES.get(code, "error")
            err = Refusal(400, "bad_formula", f"formula '{text}' in {sheet_name}!{ref} is an error "
                          f"in LibreOffice: {cell.getString()} ({what}, code {code})")
            err.index = op_index
            err.operation = "set_cells"
            raise err


def _locale():
    from com.sun.star.lang import Locale
    return Locale()


# ---------------------------------------------------------------------------------------------
# Documents (Writer)
# ---------------------------------------------------------------------------------------------

def body_elements(doc):
    """Top-level body elements in order: ("paragraph", obj) or ("table", obj)."""
    out = []
    enum = doc.getText().createEnumeration()
    while enum.hasMoreElements():
        element = enum.nextElement()
        if element.supportsService("com.sun.star.text.TextTable"):
            out.append(("table", element))
        else:
            out.append(("paragraph", element))
    return out


def table_rows(table):
    """Cell texts row by row (works for tables with merged or split cells too)."""
    rows = {}
    for name in table.getCellNames():
        m = re.match(r"^([A-Za-z]+)([0-9]+)", name)
        if not m:
            continue
        col = 0
        for ch in m.group(1):
            col = col * 52 + (ord(ch) - (65 if ch.isupper() else 71)) + 1
        rows.setdefault(int(m.group(2)), []).append((col, name))
    out = []
    for row_number in sorted(rows)[:READ_TABLE_MAX_ROWS]:
        cells = []
        for _, name in sorted(rows[row_number]):
            text, _cut = cut_text(table.getCellByName(name).getString())
            cells.append(text)
        out.append(cells)
    return out, len(rows) > READ_TABLE_MAX_ROWS


def read_document(doc, page):
    elements = body_elements(doc)
    first, end, pages = page_window(len(elements), READ_BLOCKS_PER_PAGE, page, "blocks")
    blocks = []
    paragraph_index = 0
    table_index = 0
    for position, (what, element) in enumerate(elements):
        shown = first <= position < end
        if what == "paragraph":
            if shown:
                text, cut = cut_text(element.getString())
                block = {"index": paragraph_index, "type": "paragraph",
                         "style": element.ParaStyleName, "text": text}
                if cut:
                    block["truncated"] = True
                blocks.append(block)
            paragraph_index += 1
        else:
            if shown:
                rows, cut = table_rows(element)
                block = {"index": table_index, "type": "table", "table_index": table_index,
                         "after_paragraph": paragraph_index - 1 if paragraph_index else None,
                         "rows": rows}
                if cut:
                    block["truncated"] = True
                blocks.append(block)
            table_index += 1
    return {"pages": pages, "blocks": blocks, "paragraph_count": paragraph_index,
            "table_count": table_index}


class DocumentEdit:
    """State for one apply on a text document; keeps the paragraph list in step with the edits."""

    def __init__(self, doc):
        self.doc = doc
        self.text = doc.getText()
        self.paragraphs = [e for what, e in body_elements(doc) if what == "paragraph"]
        self.styles = doc.getStyleFamilies().getByName("ParagraphStyles")

    def paragraph(self, op, name="index"):
        index = get_index(op, name)
        count = len(self.paragraphs)
        if index >= count:
            raise bad_operation(f"paragraph {index} does not exist (the document has {count} "
                                f"paragraph(s), numbered from 0)")
        return index, self.paragraphs[index]

    def insert_position(self, op):
        index = get_index(op, "index")
        count = len(self.paragraphs)
        if not count:
            raise bad_operation("the document has no paragraph to insert next to")
        if index > count:
            raise bad_operation(f"index {index} is past the end: the document has {count} "
                                f"paragraph(s), so the index can be 0..{count} ({count} appends)")
        return index

    def style_name(self, style):
        if self.styles.hasByName(style):
            return style
        for name in self.styles.getElementNames():
            if self.styles.getByName(name).DisplayName.lower() == style.lower() or \
                    name.lower() == style.lower():
                return name
        common = [n for n in self.styles.getElementNames()
                  if self.styles.getByName(n).isInUse() or n in (
                      "Standard", "Title", "Subtitle", "Heading 1", "Heading 2", "Heading 3",
                      "Text body", "List Bullet", "Quotations")]
        raise bad_operation(f"paragraph style '{style}' does not exist in this document; "
                            f"styles include: {', '.join(common[:40])}")

    def new_paragraph_before(self, index):
        """Inserts an empty paragraph so that it gets paragraph index `index`; returns it."""
        break_char = uno_const("com.sun.star.text.ControlCharacter.PARAGRAPH_BREAK")
        if index < len(self.paragraphs):
            cursor = self.text.createTextCursorByRange(self.paragraphs[index].getStart())
            self.text.insertControlCharacter(cursor, break_char, False)
            cursor.gotoPreviousParagraph(False)
        else:
            cursor = self.text.createTextCursorByRange(self.paragraphs[-1].getEnd())
            self.text.insertControlCharacter(cursor, break_char, False)
        paragraph = cursor.createEnumeration().nextElement()
        self.paragraphs.insert(index, paragraph)
        return paragraph

    def replace_text(self, op):
        find = get_field(op, "find", "str")
        replace = get_field(op, "replace", "str")
        replace_all = get_field(op, "all", "bool", True)
        if not find:
            raise bad_operation("'find' must not be empty")
        desc = self.doc.createReplaceDescriptor()
        desc.SearchString = find
        desc.ReplaceString = replace
        desc.SearchCaseSensitive = True
        desc.SearchRegularExpression = False
        if replace_all:
            if self.doc.replaceAll(desc) == 0:
                raise bad_operation(f"text '{cut_text(find, 200)[0]}' was not found")
        else:
            found = self.doc.findFirst(desc)
            if found is None:
                raise bad_operation(f"text '{cut_text(find, 200)[0]}' was not found")
            found.setString(replace)

    def insert_paragraph(self, op):
        index = self.insert_position(op)
        text = get_field(op, "text", "str")
        style = self.style_name(get_field(op, "style", "str", "Standard"))
        paragraph = self.new_paragraph_before(index)
        paragraph.ParaStyleName = style
        paragraph.setString(text)

    def delete_paragraph(self, op):
        index, paragraph = self.paragraph(op)
        if len(self.paragraphs) == 1:
            raise bad_operation(f"paragraph {index} is the only paragraph; a document needs one")
        if index == len(self.paragraphs) - 1 and [
                what for what, _ in body_elements(self.doc)][-2:-1] == ["table"]:
            raise bad_operation(f"paragraph {index} is the last paragraph and follows a table; a "
                                "document must end with a paragraph")
        paragraph.dispose()
        del self.paragraphs[index]

    def set_paragraph_style(self, op):
        _, paragraph = self.paragraph(op)
        paragraph.ParaStyleName = self.style_name(get_field(op, "style", "str"))

    def insert_table(self, op):
        index = self.insert_position(op)
        rows = get_field(op, "rows", "list")
        if not rows or any(not isinstance(r, list) or not r for r in rows):
            raise bad_operation("'rows' must be a non-empty list of non-empty rows of strings")
        width = max(len(r) for r in rows)
        for r, row in enumerate(rows):
            for c, value in enumerate(row):
                if not isinstance(value, str):
                    raise bad_operation(f"rows[{r}][{c}] must be a string")
                check_text_size(f"rows[{r}][{c}]", value)
        if index == len(self.paragraphs):
            last = self.paragraphs[-1]
            # A table needs a paragraph after it: reuse an empty last paragraph, else add one.
            anchor = last if last.getString() == "" else self.new_paragraph_before(index)
            if anchor is not last:
                anchor.ParaStyleName = "Standard"
        else:
            anchor = self.paragraphs[index]
        table = self.doc.createInstance("com.sun.star.text.TextTable")
        table.initialize(len(rows), width)
        self.text.insertTextContent(anchor.getStart(), table, False)
        for r, row in enumerate(rows):
            for c, value in enumerate(row):
                table.getCellByPosition(c, r).setString(value)


# ---------------------------------------------------------------------------------------------
# Decks (Impress)
# ---------------------------------------------------------------------------------------------

SHAPE_ROLES = {
    "com.sun.star.presentation.TitleTextShape": "title",
    "com.sun.star.presentation.SubtitleShape": "subtitle",
    "com.sun.star.presentation.OutlinerShape": "body",
}
OTHER_PLACEHOLDERS = {
    "com.sun.star.presentation.NotesShape", "com.sun.star.presentation.HeaderShape",
    "com.sun.star.presentation.FooterShape", "com.sun.star.presentation.DateTimeShape",
    "com.sun.star.presentation.SlideNumberShape", "com.sun.star.presentation.PageShape",
    "com.sun.star.presentation.HandoutShape",
}
LAYOUT_TITLE_CONTENT = 1


def shape_role(shape):
    kind = shape.getShapeType()
    if kind in SHAPE_ROLES:
        return SHAPE_ROLES[kind]
    if kind in OTHER_PLACEHOLDERS:
        return "other"
    if kind in ("com.sun.star.drawing.TextShape", "com.sun.star.drawing.CustomShape",
                "com.sun.star.drawing.RectangleShape", "com.sun.star.drawing.EllipseShape"):
        return "text"
    return "other"


def has_text(shape):
    return hasattr(shape, "getString") and shape.supportsService("com.sun.star.drawing.Text")


def slide_shapes(page):
    """[(shape index, shape, role)] of the shapes that hold text."""
    out = []
    for i in range(page.getCount()):
        shape = page.getByIndex(i)
        try:
            if has_text(shape):
                out.append((i, shape, shape_role(shape)))
        except Exception:
            continue
    return out


def notes_shape(page):
    """The speaker notes text shape of a slide, or None."""
    notes = page.getNotesPage()
    for i in range(notes.getCount()):
        shape = notes.getByIndex(i)
        if shape.getShapeType() == "com.sun.star.presentation.NotesShape":
            return shape
    return None


def read_deck(doc, page_number):
    pages = doc.getDrawPages()
    count = pages.getCount()
    first, end, read_pages = page_window(count, READ_SLIDES_PER_PAGE, page_number, "slides")
    slides = []
    for index in range(first, end):
        page = pages.getByIndex(index)
        slide = {"index": index, "title": "", "shapes": [], "notes": ""}
        title_found = False
        for shape_index, shape, role in slide_shapes(page):
            text = shape.getString()
            if role not in ("title", "subtitle", "body") and not text:
                continue
            shown, cut = cut_text(text)
            entry = {"index": shape_index, "name": shape.getName(), "role": role, "text": shown}
            if cut:
                entry["truncated"] = True
            slide["shapes"].append(entry)
            if role == "title" and not title_found:
                title_found = True
                slide["title"], title_cut = cut_text(text)
                if title_cut:
                    slide["truncated"] = True
        notes = notes_shape(page)
        if notes is not None:
            slide["notes"], notes_cut = cut_text(notes.getString())
            if notes_cut:
                slide["truncated"] = True
        slides.append(slide)
    return {"pages": read_pages, "slide_count": count, "slides": slides}


class DeckEdit:
    """State for one apply on a deck. Impress has no API to move a slide; the .uno:MovePage*
    commands do it, but they act on the slide sorter, which only a document loaded without
    Hidden has (under --headless nothing is shown either way): see `needs_view`."""

    def __init__(self, doc, ctx):
        self.doc = doc
        self.ctx = ctx
        self.pages = doc.getDrawPages()
        self._dispatcher = None

    @staticmethod
    def needs_view(ops):
        return any(isinstance(op, dict) and (op.get("op") == "move_slide" or (
            op.get("op") == "add_slide" and op.get("index") == 0)) for op in ops)

    def slide(self, op, name):
        index = get_index(op, name)
        count = self.pages.getCount()
        if index >= count:
            raise bad_operation(f"slide {index} does not exist (the deck has {count})")
        return index, self.pages.getByIndex(index)

    def move_page(self, page, to):
        """Moves `page` to position `to` through the slide sorter's move commands."""
        count = self.pages.getCount()
        controller = self.doc.getCurrentController()
        if controller is None or controller.getFrame() is None:
            raise engine_failure("LibreOffice cannot move slides: the deck has no view")
        if self._dispatcher is None:
            self._dispatcher = self.ctx.ServiceManager.createInstanceWithContext(
                "com.sun.star.frame.DispatchHelper", self.ctx)
        frame = controller.getFrame()

        def command(name):
            controller.setCurrentPage(page)
            self._dispatcher.executeDispatch(frame, ".uno:" + name, "", 0, ())

        here = page.Number - 1
        steps = abs(to - here)
        if to < here and to + 1 < steps:
            command("MovePageFirst")
        elif to > here and (count - 1 - to) + 1 < steps:
            command("MovePageLast")
        for _ in range(count + 1):
            here = page.Number - 1
            if here == to:
                return
            command("MovePageUp" if here > to else "MovePageDown")
        raise engine_failure(f"LibreOffice did not move the slide to position {to}")

    def add_slide(self, op):
        count = self.pages.getCount()
        index = get_index(op, "index", count)
        if index > count:
            raise bad_operation(f"index {index} is past the end: the deck has {count} slide(s), "
                                f"so the index can be 0..{count}")
        title = get_field(op, "title", "str", None)
        body = get_field(op, "body", "str", None)
        page = self.pages.insertNewByIndex(max(0, index - 1))
        page.Layout = LAYOUT_TITLE_CONTENT
        if index == 0:
            self.move_page(page, 0)
        for _, shape, role in slide_shapes(page):
            if role == "title" and title is not None:
                shape.setString(title)
            elif role == "body" and body is not None:
                shape.setString(body)

    def delete_slide(self, op):
        index, page = self.slide(op, "index")
        if self.pages.getCount() == 1:
            raise bad_operation(f"slide {index} is the only slide; a deck needs one")
        self.pages.remove(page)

    def move_slide(self, op):
        start, page = self.slide(op, "from")
        to = get_index(op, "to")
        count = self.pages.getCount()
        if to >= count:
            raise bad_operation(f"slide position {to} does not exist (the deck has {count})")
        if start != to:
            self.move_page(page, to)

    def set_text(self, op):
        index, page = self.slide(op, "slide")
        target = get_field(op, "shape", "any")
        text = get_field(op, "text", "str")
        shapes = slide_shapes(page)
        chosen = None
        if isinstance(target, bool) or not isinstance(target, (str, int)):
            raise bad_request("field 'shape' must be a shape name, 'title', 'subtitle', 'body' "
                              "or a shape index")
        if isinstance(target, int):
            if not 0 <= target < page.getCount():
                raise bad_operation(f"shape {target} does not exist on slide {index} (it has "
                                    f"{page.getCount()} shape(s))")
            chosen = next((s for i, s, _ in shapes if i == target), None)
            if chosen is None:
                raise bad_operation(f"shape {target} on slide {index} holds no text")
        elif target in ("title", "subtitle", "body"):
            chosen = next((s for _, s, role in shapes if role == target), None)
        else:
            chosen = next((s for _, s, _ in shapes if s.getName() == target), None)
        if chosen is None:
            listing = ", ".join(f"{i}: {role} '{s.getName()}'" for i, s, role in shapes) or "none"
            raise bad_operation(f"slide {index} has no shape {target!r}; its text shapes: "
                                f"{listing}")
        chosen.setString(text)

    def set_notes(self, op):
        _, page = self.slide(op, "slide")
        text = get_field(op, "text", "str")
        shape = notes_shape(page)
        if shape is None:
            notes_page = page.getNotesPage()
            shape = self.doc.createInstance("com.sun.star.presentation.NotesShape")
            notes_page.add(shape)
        shape.setString(text)


# ---------------------------------------------------------------------------------------------
# PDF (PyMuPDF)
# ---------------------------------------------------------------------------------------------

def import_fitz():
    try:
        import fitz
    except ImportError:
        raise engine_failure("PDF support is missing: the python3-fitz (PyMuPDF) module is not "
                             "installed")
    try:
        fitz.TOOLS.mupdf_display_errors(False)
        fitz.TOOLS.mupdf_display_warnings(False)
    except Exception:
        pass
    return fitz


def open_pdf(path):
    fitz = import_fitz()
    try:
        doc = fitz.open(path, filetype="pdf")
    except Exception as e:
        raise wrong_kind(f"'{path}' starts like a PDF but cannot be opened: {e}")
    if doc.needs_pass:
        doc.close()
        raise forbidden(f"'{path}' is an encrypted PDF that needs a password")
    return doc


def pdf_fields(doc):
    fields = []
    for page in doc:
        for widget in page.widgets() or []:
            value = widget.field_value
            if not isinstance(value, (str, bool, int, float)) and value is not None:
                value = str(value)
            fields.append({"name": widget.field_name, "type": widget.field_type_string,
                           "value": value, "page": page.number})
    return fields


def read_pdf(path, page_number):
    doc = open_pdf(path)
    try:
        count = doc.page_count
        first, end, pages = page_window(count, READ_PDF_PAGES_PER_PAGE, page_number, "PDF pages")
        out_pages = []
        for index in range(first, end):
            page = doc[index]
            text, cut = cut_text(page.get_text("text"), READ_PDF_PAGE_TEXT_CUT)
            entry = {"index": index, "width": round(page.rect.width, 2),
                     "height": round(page.rect.height, 2), "rotation": page.rotation,
                     "text": text, "annotations": []}
            if cut:
                entry["truncated"] = True
            for annot in page.annots() or []:
                content, _ = cut_text(annot.info.get("content", "") or "")
                entry["annotations"].append({"type": annot.type[1], "content": content,
                                             "rect": [round(v, 2) for v in annot.rect]})
            out_pages.append(entry)
        # "pages" is both the count of read pages and the list of PDF pages in the contract: the
        # list keeps the name, the count is "read_pages".
        return {"ok": True, "kind": "pdf", "page": page_number, "read_pages": pages,
                "page_count": count, "pages": out_pages, "fields": pdf_fields(doc)}
    finally:
        doc.close()


def on_state(widget):
    """The 'on' appearance state name of a check box or radio button (usually 'Yes')."""
    try:
        states = widget.button_states() or {}
        for name in (states.get("normal") or []) + (states.get("down") or []):
            if name != "Off":
                return name
    except Exception:
        pass
    return "Yes"


class PdfEdit:
    def __init__(self, doc):
        self.doc = doc
        self.fitz = import_fitz()

    def page(self, op, name="page"):
        index = get_index(op, name)
        count = self.doc.page_count
        if index >= count:
            raise bad_operation(f"page {index} does not exist (the PDF has {count})")
        return self.doc[index]

    def add_note(self, op):
        page = self.page(op)
        x, y = get_field(op, "x", "number"), get_field(op, "y", "number")
        text = get_field(op, "text", "str")
        rect = page.rect
        if not (0 <= x <= rect.width and 0 <= y <= rect.height):
            raise bad_operation(f"point ({x}, {y}) lies outside page {page.number} (0..{rect.width:g} "
                                f"x 0..{rect.height:g} points, origin top left)")
        page.add_text_annot(self.fitz.Point(x, y), text)

    def highlight(self, op):
        page = self.page(op)
        if "rect" in op and op["rect"] is not None:
            rect = get_field(op, "rect", "list")
            if len(rect) != 4 or any(isinstance(v, bool) or not isinstance(v, (int, float))
                                     for v in rect):
                raise bad_request("field 'rect' must be [x0, y0, x1, y1] in points")
            r = self.fitz.Rect(*rect)
            if r.is_empty or not r.intersects(page.rect):
                raise bad_operation(f"rect {rect} is empty or lies outside page {page.number}")
            page.add_highlight_annot(r)
            return
        text = get_field(op, "text", "str")
        if not text.strip():
            raise bad_operation("'text' must not be empty")
        quads = page.search_for(text, quads=True)
        if not quads:
            raise bad_operation(f"text '{cut_text(text, 200)[0]}' was not found on page "
                                f"{page.number}")
        page.add_highlight_annot(quads)

    def fill_field(self, op):
        name = get_field(op, "name", "str")
        value = get_field(op, "value", "any")
        pages = list(self.doc)  # widgets refer weakly to their page: keep the pages alive
        widgets = [w for page in pages for w in (page.widgets() or []) if w.field_name == name]
        if not widgets:
            names = sorted({f["name"] for f in pdf_fields(self.doc)})
            listing = ", ".join(f"'{n}'" for n in names[:50]) or "it has none"
            raise bad_operation(f"form field '{name}' does not exist; fields: {listing}")
        kind = widgets[0].field_type_string
        if kind in ("Button", "Signature"):
            raise bad_operation(f"form field '{name}' is a {kind.lower()} and cannot be filled")
        if kind == "CheckBox":
            if isinstance(value, str):
                checked = value not in ("", "Off", "off", "false", "False", "no", "No")
            elif isinstance(value, bool):
                checked = value
            else:
                raise bad_request("a check box takes true/false or its on-state name")
            for w in widgets:
                w.field_value = checked  # PyMuPDF maps True to the box's on-state
                w.update()
                self.set_name_value(w, on_state(w) if checked else "Off")
        elif kind == "RadioButton":
            if not isinstance(value, str):
                raise bad_request("a radio button group takes the name of the button to select")
            states = [on_state(w) for w in widgets]
            if value not in states and value != "Off":
                raise bad_operation(f"radio group '{name}' has no button '{value}'; buttons: "
                                    + ", ".join(states))
            for w, state in zip(widgets, states):
                w.field_value = state == value
                w.update()
            for w in widgets:
                self.set_name_value(w, value)
        else:
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise bad_request(f"form field '{name}' takes a string value")
            value = str(value)
            check_text_size("value", value)
            if kind in ("ComboBox", "ListBox"):
                choices = []
                for choice in widgets[0].choice_values or []:
                    choices.extend(choice if isinstance(choice, (list, tuple)) else [choice])
                if choices and value not in choices:
                    raise bad_operation(f"'{value}' is not a choice of form field '{name}'; "
                                        "choices: " + ", ".join(str(c) for c in choices[:50]))
            for w in widgets:
                w.field_value = value
                w.update()

    def set_name_value(self, widget, state):
        """Writes a button field's /V as a PDF name (PyMuPDF 1.21 writes a string, which readers
        such as pypdf and Acrobat do not take for a state), on the field's parent if it has one."""
        parent = self.doc.xref_get_key(widget.xref, "Parent")
        target = int(parent[1].split()[0]) if parent[0] == "xref" else widget.xref
        self.doc.xref_set_key(target, "V", "/" + state)

    def delete_page(self, op):
        page = self.page(op)
        if self.doc.page_count == 1:
            raise bad_operation(f"page {page.number} is the only page; a PDF needs one")
        self.doc.delete_page(page.number)

    def rotate_page(self, op):
        page = self.page(op)
        degrees = get_field(op, "degrees", "int")
        if degrees % 90:
            raise bad_operation(f"degrees must be a multiple of 90, not {degrees}")
        page.set_rotation((page.rotation + degrees) % 360)

    def reorder_pages(self, op):
        order = get_field(op, "order", "list")
        count = self.doc.page_count
        if sorted(order) != list(range(count)) or any(
                isinstance(i, bool) or not isinstance(i, int) for i in order):
            raise bad_operation(f"order must list every page index 0..{count - 1} exactly once")
        # Page by page with move_page: Document.select() would drop the form (/AcroForm).
        current = list(range(count))
        for position, wanted in enumerate(order):
            found = current.index(wanted)
            if found != position:
                self.doc.move_page(found, position)
                current.insert(position, current.pop(found))


# ---------------------------------------------------------------------------------------------
# Operation tables
# ---------------------------------------------------------------------------------------------

OPERATIONS = {
    "sheet": {"set_cells": SheetEdit.set_cells, "add_sheet": SheetEdit.add_sheet,
              "rename_sheet": SheetEdit.rename_sheet, "delete_sheet": SheetEdit.delete_sheet},
    "document": {"replace_text": DocumentEdit.replace_text,
                 "insert_paragraph": DocumentEdit.insert_paragraph,
                 "delete_paragraph": DocumentEdit.delete_paragraph,
                 "set_paragraph_style": DocumentEdit.set_paragraph_style,
                 "insert_table": DocumentEdit.insert_table},
    "deck": {"add_slide": DeckEdit.add_slide, "delete_slide": DeckEdit.delete_slide,
             "move_slide": DeckEdit.move_slide, "set_text": DeckEdit.set_text,
             "set_notes": DeckEdit.set_notes},
    "pdf": {"add_note": PdfEdit.add_note, "highlight": PdfEdit.highlight,
            "fill_field": PdfEdit.fill_field, "delete_page": PdfEdit.delete_page,
            "rotate_page": PdfEdit.rotate_page, "reorder_pages": PdfEdit.reorder_pages},
}


def check_ops(kind, ops):
    """Structure and operation names, before any file is opened."""
    if len(ops) > MAX_OPS:
        raise too_large(f"{len(ops)} operations; a request takes at most {MAX_OPS}")
    if not ops:
        raise bad_request("field 'ops' must list at least one operation")
    known = OPERATIONS[kind]
    for i, op in enumerate(ops):
        name = op.get("op") if isinstance(op, dict) else None
        if name not in known:
            if not isinstance(op, dict):
                err = bad_request("each operation must be an object with an 'op' field")
            else:
                err = bad_operation(f"unknown operation '{name}' for a {KIND_NAMES[kind]}; "
                                    f"operations: {', '.join(known)}")
            err.index, err.operation = i, str(name) if name is not None else ""
            raise err


def run_ops(kind, editor, ops):
    for i, op in enumerate(ops):
        if hasattr(editor, "op_index"):
            editor.op_index = i
        try:
            OPERATIONS[kind][op["op"]](editor, op)
        except Refusal as err:
            if err.index is None:
                err.index, err.operation = i, op["op"]
            raise


# ---------------------------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------------------------

def request_kind(req):
    kind = get_field(req, "kind", "str")
    if kind not in KIND_FORMATS:
        raise bad_request(f"kind '{kind}' is not one of: {', '.join(KIND_FORMATS)}")
    return kind


def do_inspect(req, office):
    path, kind = request_path(req), request_kind(req)
    _size, fmt = check_source(path, kind)
    size, digest = file_digest(path)
    return {"ok": True, "kind": kind, "format": fmt, "size": size, "sha256": digest}


def do_create(req, office):
    path, kind = request_path(req), request_kind(req)
    title = get_field(req, "title", "str", None)
    template = get_field(req, "template", "str", "titled" if title is not None else "empty")
    if template not in ("empty", "titled"):
        raise bad_request(f"template '{template}' is not one of: empty, titled")
    if template == "titled" and title is None:
        raise bad_request("template 'titled' needs a 'title'")
    fmt = check_extension(path, kind)
    if os.path.lexists(path):
        raise Refusal(409, "exists", f"'{path}' already exists")
    check_new_file_dir(path, "the new file")
    tmp = reserve_temp_beside(path)
    try:
        if kind == "pdf":
            create_pdf(tmp, title, template)
        else:
            office.run(lambda o: create_office(o, kind, fmt, tmp, title, template))
        if os.path.lexists(path):
            raise Refusal(409, "exists", f"'{path}' already exists")
        commit_temp(tmp, path)
        tmp = None
    finally:
        remove_quietly(tmp)
    return written_answer(path, kind)


def create_office(office, kind, fmt, tmp, title, template):
    doc = new_document(office, kind)
    try:
        titled = template == "titled"
        if kind == "sheet":
            sheets = doc.getSheets()
            while sheets.getCount() > 1:
                sheets.removeByName(sheets.getByIndex(sheets.getCount() - 1).getName())
            sheets.getByIndex(0).setName("Sheet1")
            if titled:
                sheets.getByIndex(0).getCellByPosition(0, 0).setString(title)
        elif kind == "document":
            first = body_elements(doc)[0][1]
            if titled:
                first.ParaStyleName = "Title"
                first.setString(title)
        else:
            pages = doc.getDrawPages()
            while pages.getCount() > 1:
                pages.remove(pages.getByIndex(pages.getCount() - 1))
            page = pages.getByIndex(0)
            page.Layout = 0  # title slide
            if titled:
                for _, shape, role in slide_shapes(page):
                    if role == "title":
                        shape.setString(title)
        set_title_metadata(doc, title)
        store_document(doc, tmp, fmt)
    finally:
        close_document(doc)


def create_pdf(tmp, title, template):
    fitz = import_fitz()
    doc = fitz.open()
    try:
        width, height = fitz.paper_size("a4")
        page = doc.new_page(width=width, height=height)
        if template == "titled":
            draw_title(page, fitz.Rect(72, 72, width - 72, height - 72), title)
        if title is not None:
            doc.set_metadata({"title": title})
        doc.save(tmp, garbage=3, deflate=True)
    finally:
        doc.close()


def draw_title(page, box, title):
    """Draws the title in the box, in the largest size that fits (a title too long for the page
    even at 8 pt is cut). A Unicode TrueType font is used when the system has one."""
    font = next((f for f in PDF_TITLE_FONTS if os.path.exists(f)), None)
    font_args = {"fontname": "F0", "fontfile": font} if font else {"fontname": "helv"}
    shown = title
    while shown:
        for size in (24, 18, 14, 11, 8):
            if page.insert_textbox(box, shown, fontsize=size, **font_args) >= 0:
                return
        shown = shown[: len(shown) // 2]


def do_read(req, office):
    path, kind = request_path(req), request_kind(req)
    page = get_index(req, "page", 0)
    check_source(path, kind)
    if kind == "pdf":
        return read_pdf(path, page)

    def work(o):
        doc = load_document(o, path, kind, read_only=True)
        try:
            if kind == "sheet":
                body = read_sheet(doc, req, page)
            elif kind == "document":
                body = read_document(doc, page)
            else:
                body = read_deck(doc, page)
        finally:
            close_document(doc)
        return body

    body = office.run(work)
    answer = {"ok": True, "kind": kind, "page": page}
    answer.update(body)
    return answer


def do_apply(req, office):
    path, kind = request_path(req), request_kind(req)
    out = request_path(req, "out")
    ops = get_field(req, "ops", "list")
    check_ops(kind, ops)
    check_source(path, kind)
    out_fmt = check_extension(out, kind)
    check_new_file_dir(out, "the output file")
    out_tmp = reserve_temp_beside(out)
    warnings = []
    try:
        if kind == "pdf":
            apply_pdf(path, ops, out_tmp)
        else:
            warnings = office.run(lambda o: apply_office(o, kind, path, ops, out_tmp, out_fmt))
        commit_temp(out_tmp, out)
        out_tmp = None
    finally:
        remove_quietly(out_tmp)
    size, digest = file_digest(out)
    answer = {"ok": True, "size": size, "sha256": digest, "applied": len(ops)}
    if warnings:
        answer["warnings"] = warnings
    return answer


def apply_office(office, kind, path, ops, out_tmp, out_fmt):
    work_dir = tempfile.mkdtemp(prefix="berth-workpiece-")
    doc = None
    try:
        private = os.path.join(work_dir, "source." + extension_of(path))
        shutil.copyfile(path, private)
        hidden = not (kind == "deck" and DeckEdit.needs_view(ops))
        doc = load_document(office, private, kind, read_only=False, hidden=hidden)
        if kind == "sheet":
            editor = SheetEdit(doc, out_fmt)
        elif kind == "document":
            editor = DocumentEdit(doc)
        else:
            editor = DeckEdit(doc, office.ctx)
        run_ops(kind, editor, ops)
        warnings = []
        if kind == "sheet":
            editor.finish()
            warnings = editor.warnings
        store_document(doc, out_tmp, out_fmt)
        return warnings
    finally:
        close_document(doc)
        shutil.rmtree(work_dir, ignore_errors=True)


def apply_pdf(path, ops, out_tmp):
    doc = open_pdf(path)
    try:
        run_ops("pdf", PdfEdit(doc), ops)
        doc.save(out_tmp, garbage=3, deflate=True)
    finally:
        doc.close()


def do_render(req, office):
    path, kind = request_path(req), request_kind(req)
    max_pages = get_field(req, "max_pages", "int", RENDER_DEFAULT_PAGES)
    dpi = get_field(req, "dpi", "int", RENDER_DPI_DEFAULT)
    if not 1 <= max_pages <= RENDER_MAX_PAGES:
        raise bad_request(f"max_pages must be 1..{RENDER_MAX_PAGES}")
    if not RENDER_DPI_MIN <= dpi <= RENDER_DPI_MAX:
        raise bad_request(f"dpi must be {RENDER_DPI_MIN}..{RENDER_DPI_MAX}")
    check_source(path, kind)
    if kind == "pdf":
        return render_pdf(path, max_pages, dpi, None)
    work_dir = tempfile.mkdtemp(prefix="berth-workpiece-")
    try:
        pdf_path = os.path.join(work_dir, "render.pdf")

        def work(o):
            doc = load_document(o, path, kind, read_only=True)
            try:
                try:
                    total = doc.getRendererCount(doc, props())
                except Exception as e:
                    if office_down(e):
                        raise
                    total = None
                export_pdf(doc, kind, pdf_path, max_pages)
            finally:
                close_document(doc)
            return total

        total = office.run(work)
        return render_pdf(pdf_path, max_pages, dpi, total)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def render_pdf(path, max_pages, dpi, total):
    doc = open_pdf(path)
    try:
        pages = []
        for index in range(min(max_pages, doc.page_count)):
            pix = doc[index].get_pixmap(dpi=dpi)
            pages.append({"index": index, "width": pix.width, "height": pix.height,
                          "png": base64.b64encode(pix.tobytes("png")).decode("ascii")})
        return {"ok": True, "total": max(total or 0, doc.page_count), "pages": pages}
    finally:
        doc.close()


REQUESTS = {"inspect": do_inspect, "create": do_create, "read": do_read, "apply": do_apply,
            "render": do_render}


def handle(raw):
    try:
        req = json.loads(raw)
    except ValueError as e:
        raise bad_request(f"the request is not JSON: {e}")
    if not isinstance(req, dict):
        raise bad_request("the request must be a JSON object")
    op = get_field(req, "op", "str")
    if op not in REQUESTS:
        raise bad_request(f"unknown request op '{op}'; requests: {', '.join(REQUESTS)}")
    return REQUESTS[op](req, Office())


def main():
    # Libraries may print to fd 1; keep it for the one JSON answer and point fd 1 at stderr.
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    raw = sys.stdin.buffer.read()
    try:
        answer = handle(raw)
    except Refusal as refusal:
        answer = refusal.answer()
    data = json.dumps(answer, ensure_ascii=False).encode("utf-8", "replace") + b"\n"
    view = memoryview(data)
    while view:
        view = view[os.write(answer_fd, view):]
    sys.stderr.flush()
    # Skip interpreter teardown: the UNO bridge can hang or crash while it is torn down.
    os._exit(0)


if __name__ == "__main__":
    main()
