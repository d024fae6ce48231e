"""Workpieces of all four kinds through the controller, as an engine and a person use them: the
official MCP Python SDK makes, reads and proposes edits to a deck, a sheet, a document and a PDF
(the controller's /mcp); a person accepts one proposal and rejects another of each (REST with the
API key); the accepted files are read back with readers that did not write them (openpyxl,
python-docx, python-pptx, pdfplumber and pypdf), both as the kept version and as the file in the
sandbox; a stale proposal and bad operations are refused; a change made in the sandbox by other
means becomes a version.

Usage: client.py BASE KEY SANDBOX
Prints one JSON object with what it saw; tests/tests/workpieces.rs asserts on it too.
"""

import asyncio
import hashlib
import io
import json
import sys

import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

import docx
import openpyxl
import pdfplumber
import pptx
import pypdf

BASE, KEY, SB = sys.argv[1], sys.argv[2], sys.argv[3]
SBURL = f"{BASE}/sandbox/sandboxes/v1/{SB}"

# A PDF with a form field, made in the sandbox with its own PyMuPDF (not the engine).
FORM_PDF = r'''
import fitz, os
os.makedirs(os.path.expanduser("~/work"), exist_ok=True)
d = fitz.open()
p = d.new_page()
p.insert_text((72, 100), "Invoice 2026-12: total due 420 EUR", fontsize=14)
p.insert_text((72, 140), "Customer:", fontsize=12)
w = fitz.Widget()
w.field_name = "customer"
w.field_type = fitz.PDF_WIDGET_TYPE_TEXT
w.rect = fitz.Rect(150, 125, 400, 145)
p.add_widget(w)
d.new_page().insert_text((72, 100), "Terms: thirty days", fontsize=12)
d.save(os.path.expanduser("~/work/invoice.pdf"))
'''


def structured(result, what):
    assert not result.is_error, f"{what}: {result.content[0].text if result.content else result}"
    return result.structured_content


def tool_error(result, what):
    assert result.is_error, f"{what} was not refused: {result.structured_content}"
    return json.loads(result.content[0].text)["error"]


async def call(s, name, **args):
    return await s.call_tool(name, args)


async def rest(http, method, path, **kw):
    r = await http.request(method, SBURL + path, **kw)
    return r.status_code, (r.json() if r.headers.get("content-type", "").startswith("application/json") else r.content)


async def version_bytes(http, w, n):
    v = next(v for v in w["versions"] if v["version"] == n)
    r = await http.get(f"{BASE}/sandbox/v1/artifacts/{v['artifact_id']}")
    assert r.status_code == 200, r.text
    assert hashlib.sha256(r.content).hexdigest() == v["sha256"], "the kept bytes are the version"
    return r.content


async def sandbox_bytes(http, path):
    r = await http.get(SBURL + "/files", params={"path": path})
    assert r.status_code == 200, r.text
    return r.content


async def decide(http, wid, pid, how):
    code, body = await rest(http, "POST", f"/workpieces/{wid}/proposals/{pid}/{how}")
    return code, body


async def flow(s, http, kind, create, ops_accept, ops_reject, check_file, out):
    seen = {}
    w = structured(await call(s, "workpiece_create", id=SB, kind=kind, **create), f"create {kind}")
    wid = w["id"]
    seen["created"] = {k: w[k] for k in ("kind", "path", "format", "latest_version", "title")}
    seen["read"] = structured(await call(s, "workpiece_read", id=SB, workpiece=wid), f"read {kind}")
    a = structured(await call(s, "workpiece_propose", id=SB, workpiece=wid, base_version=1,
                              summary=f"{kind}: the edits", operations=ops_accept), f"propose {kind}")
    b = structured(await call(s, "workpiece_propose", id=SB, workpiece=wid, base_version=1,
                              summary=f"{kind}: edits a person refuses", operations=ops_reject),
                   f"propose {kind} (to reject)")
    assert a["status"] == "pending" and a["preview_pages"] >= 1, a
    # The preview pages render (PNG) before anyone decides.
    r = await http.get(SBURL + f"/workpieces/{wid}/proposals/{a['id']}/pages/1")
    assert r.status_code == 200 and r.content[:4] == b"\x89PNG", r.status_code
    before = await sandbox_bytes(http, w["path"])
    code, acc = await decide(http, wid, a["id"], "accept")
    assert code == 200 and acc["status"] == "accepted" and acc["result_version"] == 2, (code, acc)
    # B was written against version 1: accepting it now is a 409 naming both versions.
    code, stale = await decide(http, wid, b["id"], "accept")
    seen["accept_stale"] = [code, stale["error"]["message"]]
    code, rej = await decide(http, wid, b["id"], "reject")
    assert code == 200 and rej["status"] == "rejected", (code, rej)
    code, again = await decide(http, wid, b["id"], "accept")
    seen["accept_rejected"] = [code, again["error"]["message"]]
    c = structured(await call(s, "workpiece_propose", id=SB, workpiece=wid, base_version=2,
                              summary="against the latest", operations=ops_reject), "propose C")
    old = tool_error(await call(s, "workpiece_propose", id=SB, workpiece=wid, base_version=1,
                                summary="against an old version", operations=ops_reject), "stale")
    seen["stale"] = old
    code, _ = await decide(http, wid, c["id"], "reject")
    assert code == 200
    w = structured(await call(s, "workpiece_list", id=SB), "list")
    w = next(x for x in w["workpieces"] if x["id"] == wid)
    assert w["latest_version"] == 2, w
    kept = await version_bytes(http, w, 2)
    in_sandbox = await sandbox_bytes(http, w["path"])
    assert kept == in_sandbox, "the file in the sandbox is the accepted version"
    assert in_sandbox != before
    seen["independent"] = check_file(kept)
    seen["proposals"] = [p["status"] for p in structured(
        await call(s, "workpiece_proposals", id=SB, workpiece=wid), "proposals")["proposals"]]
    seen["proposal"] = structured(await call(s, "workpiece_proposal", id=SB, workpiece=wid,
                                             proposal=a["id"]), "proposal")["status"]
    seen["versions"] = [(v["version"], v["author"], v["preview_pages"]) for v in w["versions"]]
    out[kind] = seen
    return wid, w


def check_sheet(data):
    wb = openpyxl.load_workbook(io.BytesIO(data))
    ws = wb["Sheet1"]
    got = {"sheets": wb.sheetnames, "A1": ws["A1"].value, "A2": ws["A2"].value, "B2": ws["B2"].value,
           "B4": ws["B4"].value}
    assert got["sheets"] == ["Sheet1", "Notes"], got
    assert (got["A1"], got["A2"], got["B2"], got["B4"]) == ("Budget", "Rent", 1200, "=SUM(B2:B3)"), got
    values = openpyxl.load_workbook(io.BytesIO(data), data_only=True)["Sheet1"]
    got["B4_value"] = values["B4"].value
    assert got["B4_value"] == 1500, got
    return got


def check_document(data):
    d = docx.Document(io.BytesIO(data))
    paras = [(p.style.name, p.text) for p in d.paragraphs if p.text]
    assert paras[0] == ("Title", "Annual report"), paras
    assert ("Heading 1", "Revenue grew") in paras, paras
    t = d.tables[0]
    cells = [[c.text for c in row.cells] for row in t.rows]
    assert cells == [["Quarter", "Revenue"], ["Q4", "420"]], cells
    return {"paragraphs": paras, "table": cells}


def check_deck(data):
    p = pptx.Presentation(io.BytesIO(data))
    titles = [s.shapes.title.text if s.shapes.title is not None else None for s in p.slides]
    assert titles == ["Pitch", "Team", "Market"], titles
    notes = p.slides[2].notes_slide.notes_text_frame.text if p.slides[2].has_notes_slide else ""
    assert notes == "Say it loud", notes
    bodies = [sh.text_frame.text for sh in p.slides[2].shapes if sh.has_text_frame and sh != p.slides[2].shapes.title]
    assert "A big market" in bodies, bodies
    return {"titles": titles, "notes": notes}


def check_pdf(data):
    r = pypdf.PdfReader(io.BytesIO(data))
    fields = {k: v.get("/V") for k, v in (r.get_fields() or {}).items()}
    assert fields.get("customer") == "ACME GmbH", fields
    assert len(r.pages) == 2 and r.pages[0].rotation == 90, [p.rotation for p in r.pages]
    with pdfplumber.open(io.BytesIO(data)) as pdf:
        first = pdf.pages[0]
        annots = [a.get("data", {}).get("Subtype") for a in first.annots]
        texts = pdf.pages[1].extract_text()
    subtypes = sorted(str(getattr(a, "name", a)) for a in annots if a is not None)
    assert "Highlight" in subtypes and "Text" in subtypes, subtypes
    assert "Terms" in texts, texts
    return {"fields": fields, "rotation": r.pages[0].rotation, "annotations": subtypes}


async def main():
    out = {}
    async with httpx2.AsyncClient(headers={"X-Api-Key": KEY}, timeout=httpx2.Timeout(300.0)) as http:
        code, run = await rest(http, "POST", "/exec", json={"command": ["python3", "-c", FORM_PDF]})
        assert code == 200 and run.get("exit_code") == 0, (code, run)
        async with streamable_http_client(BASE + "/mcp", http_client=http) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                tools = sorted(t.name for t in (await s.list_tools()).tools if t.name.startswith("workpiece"))
                out["tools"] = tools
                sheet_id, sheet = await flow(
                    s, http, "sheet", {"path": "~/work/budget.xlsx", "title": "Budget"},
                    [{"op": "set_cells", "sheet": "Sheet1", "range": "A2:B3", "values": [["Rent", 1200], ["Food", 300]]},
                     {"op": "set_cells", "sheet": "Sheet1", "range": "B4", "values": [["=SUM(B2:B3)"]]},
                     {"op": "add_sheet", "name": "Notes"}],
                    [{"op": "rename_sheet", "sheet": "Sheet1", "name": "Old"}],
                    check_sheet, out)
                await flow(
                    s, http, "document", {"path": "~/work/report.docx", "title": "Quarterly report"},
                    [{"op": "replace_text", "find": "Quarterly", "replace": "Annual"},
                     {"op": "insert_paragraph", "index": 1, "text": "Revenue grew", "style": "Heading 1"},
                     {"op": "insert_table", "index": 2, "rows": [["Quarter", "Revenue"], ["Q4", "420"]]}],
                    [{"op": "set_paragraph_style", "index": 0, "style": "Heading 2"}],
                    check_document, out)
                await flow(
                    s, http, "deck", {"path": "~/work/pitch.pptx", "title": "Pitch"},
                    [{"op": "add_slide", "title": "Market", "body": "A big market"},
                     {"op": "set_notes", "slide": 1, "text": "Say it loud"},
                     {"op": "add_slide", "title": "Team"},
                     {"op": "move_slide", "from": 2, "to": 1}],
                    [{"op": "set_text", "slide": 0, "shape": "title", "text": "Refused title"}],
                    check_deck, out)
                await flow(
                    s, http, "pdf", {"path": "~/work/invoice.pdf", "existing": True},
                    [{"op": "fill_field", "name": "customer", "value": "ACME GmbH"},
                     {"op": "add_note", "page": 0, "x": 420, "y": 90, "text": "Check the total"},
                     {"op": "highlight", "page": 0, "text": "total due"},
                     {"op": "rotate_page", "page": 0, "degrees": 90}],
                    [{"op": "reorder_pages", "order": [1, 0]}],
                    check_pdf, out)
                # Bad operations are refused at once, each naming itself.
                bad = {}
                for name, ops in {
                    "missing_sheet": [{"op": "delete_sheet", "sheet": "Nope"}],
                    "bad_formula": [{"op": "set_cells", "sheet": "Sheet1", "range": "C1", "values": [["=NOSUCHFN(1)"]]}],
                    "foreign_op": [{"op": "delete_slide", "index": 0}],
                }.items():
                    bad[name] = tool_error(await call(s, "workpiece_propose", id=SB, workpiece=sheet_id,
                                                      base_version=2, summary="bad", operations=ops), name)
                out["bad"] = bad
                # A change by other means (the files route, as a shell or an editor would): a version.
                v1 = await version_bytes(http, sheet, 1)
                r = await http.put(SBURL + "/files", params={"path": sheet["path"]}, content=v1)
                assert r.status_code in (200, 201), r.text
                listed = structured(await call(s, "workpiece_list", id=SB), "list")
                w = next(x for x in listed["workpieces"] if x["id"] == sheet_id)
                out["hand_change"] = [(v["version"], v["author"], v["sha256"] == sheet["versions"][0]["sha256"])
                                      for v in w["versions"]]
        code, ev = await rest(http, "GET", "/events", params={"limit": 1000})
        out["events"] = sorted({e["kind"] for e in ev["events"] if e["kind"].startswith("workpiece.")})
    print(json.dumps(out))


asyncio.run(main())
