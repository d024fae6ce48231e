//! Workpieces: documents of a sandbox the controller knows (a deck, a sheet, a document, a PDF),
//! their versions, and proposals of typed edit operations a person accepts or rejects.
//!
//! The wire types of the controller's `…/{id}/workpieces` routes and MCP tools, the edit
//! operations per kind, the limits, and the pure checks both programs share (a path's kind and
//! format, an operation list's validity).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A workpiece file's largest size (bytes): larger ones are refused (413).
pub const MAX_FILE_BYTES: u64 = 50 << 20;
/// The most operations one proposal carries.
pub const MAX_OPERATIONS: usize = 500;
/// The longest text one operation carries (bytes), per text field.
pub const MAX_TEXT_BYTES: usize = 64 << 10;
/// The most cells one `set_cells` sets.
pub const MAX_CELLS: usize = 10_000;
/// The longest title and summary (bytes).
pub const MAX_SUMMARY_BYTES: usize = 4 << 10;
/// The most pages (slides, sheet print pages) a version's or proposal's preview renders.
pub const PREVIEW_PAGES: u32 = 20;
/// Where the agent stages proposals' results and copies of versions, under the sandbox
/// user's home.
pub const SCRATCH: &str = ".cache/berth/workpieces";
/// The most workpieces one sandbox holds.
pub const MAX_PER_SANDBOX: usize = 200;

/// What a workpiece is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WorkpieceKind {
    /// A presentation (`.pptx`, `.odp`), edited in LibreOffice Impress.
    Deck,
    /// A spreadsheet (`.xlsx`, `.ods`), edited in LibreOffice Calc.
    Sheet,
    /// A text document (`.docx`, `.odt`), edited in LibreOffice Writer.
    Document,
    /// A PDF, opened in the desktop's document viewer.
    Pdf,
}

impl WorkpieceKind {
    pub const ALL: &[WorkpieceKind] = &[
        WorkpieceKind::Deck,
        WorkpieceKind::Sheet,
        WorkpieceKind::Document,
        WorkpieceKind::Pdf,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WorkpieceKind::Deck => "deck",
            WorkpieceKind::Sheet => "sheet",
            WorkpieceKind::Document => "document",
            WorkpieceKind::Pdf => "pdf",
        }
    }

    /// The file formats (extensions, lower case, with the dot) of the kind.
    pub fn formats(self) -> &'static [&'static str] {
        match self {
            WorkpieceKind::Deck => &[".pptx", ".odp"],
            WorkpieceKind::Sheet => &[".xlsx", ".ods"],
            WorkpieceKind::Document => &[".docx", ".odt"],
            WorkpieceKind::Pdf => &[".pdf"],
        }
    }

    /// The edit operations of the kind, by name.
    pub fn operations(self) -> &'static [&'static str] {
        match self {
            WorkpieceKind::Sheet => &["set_cells", "add_sheet", "rename_sheet", "delete_sheet"],
            WorkpieceKind::Document => &[
                "replace_text",
                "insert_paragraph",
                "delete_paragraph",
                "set_paragraph_style",
                "insert_table",
            ],
            WorkpieceKind::Deck => &[
                "add_slide",
                "delete_slide",
                "move_slide",
                "set_text",
                "set_notes",
            ],
            WorkpieceKind::Pdf => &[
                "add_note",
                "highlight",
                "fill_field",
                "delete_page",
                "rotate_page",
                "reorder_pages",
            ],
        }
    }

    /// The content type of a file of the kind in `format`.
    pub fn content_type(format: &str) -> &'static str {
        match format {
            ".pptx" => "application/vnd.openxmlformats-officedocument.presentationml.presentation",
            ".odp" => "application/vnd.oasis.opendocument.presentation",
            ".xlsx" => "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
            ".ods" => "application/vnd.oasis.opendocument.spreadsheet",
            ".docx" => "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
            ".odt" => "application/vnd.oasis.opendocument.text",
            ".pdf" => "application/pdf",
            _ => "application/octet-stream",
        }
    }
}

impl std::fmt::Display for WorkpieceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The format (`.xlsx`, …) of `path` for a workpiece of `kind`, or why it cannot be one.
pub fn format_of(kind: WorkpieceKind, path: &str) -> Result<&'static str, String> {
    let name = path.rsplit('/').next().unwrap_or(path);
    let ext = name
        .rfind('.')
        .filter(|&i| i > 0)
        .map(|i| name[i..].to_ascii_lowercase());
    match ext {
        Some(e) => kind
            .formats()
            .iter()
            .copied()
            .find(|f| *f == e)
            .ok_or_else(|| {
                format!(
                    "{path:?} is no {kind}: a {kind} is one of {}",
                    kind.formats().join(", ")
                )
            }),
        None => Err(format!(
            "{path:?} has no extension: a {kind} is one of {}",
            kind.formats().join(", ")
        )),
    }
}

/// `POST …/{id}/workpieces`: a new document of a kind at `path`, or an existing file there
/// registered (`existing`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateWorkpiece {
    pub kind: Option<WorkpieceKind>,
    /// Absolute, or relative to the sandbox user's home; its extension names the format
    /// (`.pptx`/`.odp`, `.xlsx`/`.ods`, `.docx`/`.odt`, `.pdf`).
    pub path: String,
    /// The title: the document's metadata, and its first slide's title, first paragraph
    /// (style Title), cell A1 or first page's heading in a new document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Register the file already at `path` (it must be of the kind) instead of making one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub existing: bool,
    /// The run it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
}

/// Who made a version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum VersionAuthor {
    /// The first version: made or registered by `workpiece_create`.
    Creator,
    /// An accepted proposal.
    Proposal,
    /// The file changed in the sandbox by other means (a shell, a person in an editor).
    Sandbox,
}

impl VersionAuthor {
    pub fn as_str(self) -> &'static str {
        match self {
            VersionAuthor::Creator => "creator",
            VersionAuthor::Proposal => "proposal",
            VersionAuthor::Sandbox => "sandbox",
        }
    }

    pub fn parse(s: &str) -> Option<VersionAuthor> {
        [
            VersionAuthor::Creator,
            VersionAuthor::Proposal,
            VersionAuthor::Sandbox,
        ]
        .into_iter()
        .find(|a| a.as_str() == s)
    }
}

/// One immutable version of a workpiece, kept as an artifact.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct WorkpieceVersion {
    /// 1, 2, …
    pub version: u32,
    /// Hex SHA-256 of the file.
    pub sha256: String,
    pub size: u64,
    pub author: VersionAuthor,
    /// The accepted proposal that made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proposal: Option<String>,
    /// Its bytes: `GET /sandbox/v1/artifacts/{artifact_id}`.
    pub artifact_id: String,
    pub created_at: String,
    /// Pages (slides, a sheet's printed pages) rendered as PNG previews (at most
    /// [`PREVIEW_PAGES`]); 0 while none is kept.
    pub preview_pages: u32,
}

/// A workpiece.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct Workpiece {
    /// `wp_…`.
    pub id: String,
    pub sandbox: String,
    pub kind: WorkpieceKind,
    /// The absolute path in the sandbox.
    pub path: String,
    pub title: String,
    /// `.pptx`, `.xlsx`, …
    pub format: String,
    /// The run that created it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    pub created_at: String,
    /// The newest version's number.
    pub latest_version: u32,
    /// Every version, oldest first.
    pub versions: Vec<WorkpieceVersion>,
    /// Proposals waiting for a person.
    pub pending_proposals: u32,
    /// The file is gone from the sandbox (its versions are kept).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub missing: bool,
    /// The sandbox has ended: this is the record the controller kept.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub record: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct WorkpieceList {
    pub workpieces: Vec<Workpiece>,
}

/// `POST …/workpieces/{wid}/proposals`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProposeEdits {
    /// The version the operations were written against: the latest, or the proposal is 409.
    pub base_version: u32,
    /// What the edits do, for the person reviewing them.
    pub summary: String,
    /// The edits, in order (at most [`MAX_OPERATIONS`]); each `{"op": …}` of the workpiece's
    /// kind.
    #[schemars(with = "Vec<Operation>")]
    pub operations: Vec<Value>,
    /// The run it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
}

/// Where a proposal is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProposalStatus {
    /// Waiting for a person.
    Pending,
    /// Applied: its result is the workpiece's `result_version`.
    Accepted,
    /// Refused: the file stayed as it was.
    Rejected,
}

impl ProposalStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ProposalStatus::Pending => "pending",
            ProposalStatus::Accepted => "accepted",
            ProposalStatus::Rejected => "rejected",
        }
    }

    pub fn parse(s: &str) -> Option<ProposalStatus> {
        [
            ProposalStatus::Pending,
            ProposalStatus::Accepted,
            ProposalStatus::Rejected,
        ]
        .into_iter()
        .find(|a| a.as_str() == s)
    }
}

/// A proposal of edits to a workpiece.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct Proposal {
    /// `wpp_…`.
    pub id: String,
    pub workpiece: String,
    pub base_version: u32,
    pub summary: String,
    #[schemars(with = "Vec<Operation>")]
    pub operations: Vec<Value>,
    pub status: ProposalStatus,
    /// The version accepting it made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_version: Option<u32>,
    /// Its base is no longer the latest version: accepting it is 409.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stale: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<String>,
    /// The result as it would be, rendered: `preview_pages` PNG pages at
    /// `…/proposals/{pid}/pages/{n}` (n from 1), and the file at `preview_artifact_id`.
    pub preview_pages: u32,
    pub preview_artifact_id: String,
    /// Its size and SHA-256.
    pub preview_sha256: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct ProposalList {
    pub proposals: Vec<Proposal>,
}

/// `POST …/proposals/{pid}/reject`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Decision {
    /// Why, for the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One edit operation (`op` names it). Indexes count from 0.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Operation {
    /// Sheet: set the cells of `range` (`A1`, `B2:D4`) row by row; a string starting with `=`
    /// is a formula, `null` clears a cell.
    SetCells {
        sheet: String,
        range: String,
        values: Vec<Vec<Value>>,
    },
    /// Sheet: a new, empty sheet (at `index`, default last).
    AddSheet {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        index: Option<u32>,
    },
    RenameSheet {
        sheet: String,
        name: String,
    },
    /// Sheet: removes a sheet (not the last one).
    DeleteSheet {
        sheet: String,
    },
    /// Document: replaces `find` with `replace` (every occurrence unless `all` is false).
    ReplaceText {
        find: String,
        replace: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        all: Option<bool>,
    },
    /// Document: a new paragraph before paragraph `index` (the paragraph count appends).
    InsertParagraph {
        index: u32,
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        style: Option<String>,
    },
    DeleteParagraph {
        index: u32,
    },
    /// Document: a paragraph style the document has (`Heading 1`, `Title`, …).
    SetParagraphStyle {
        index: u32,
        style: String,
    },
    /// Document: a table before paragraph `index`, its cells' text row by row.
    InsertTable {
        index: u32,
        rows: Vec<Vec<String>>,
    },
    /// Deck: a new slide at `index` (default last), with a title and body text.
    AddSlide {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        index: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        title: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        body: Option<String>,
    },
    DeleteSlide {
        index: u32,
    },
    MoveSlide {
        from: u32,
        to: u32,
    },
    /// Deck: the text of a shape: `title`, `subtitle`, `body`, its name, or its index among
    /// the slide's shapes.
    SetText {
        slide: u32,
        #[schemars(with = "Value")]
        shape: Value,
        text: String,
    },
    SetNotes {
        slide: u32,
        text: String,
    },
    /// PDF: a text note (sticky note) at (`x`, `y`) in points from the page's top left.
    AddNote {
        page: u32,
        x: f64,
        y: f64,
        text: String,
    },
    /// PDF: highlights every occurrence of `text` on the page, or the `rect` [x0, y0, x1, y1].
    Highlight {
        page: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rect: Option<[f64; 4]>,
    },
    /// PDF: a form field's value, by its name.
    FillField {
        name: String,
        value: String,
    },
    /// PDF: removes a page (not the last one).
    DeletePage {
        page: u32,
    },
    /// PDF: turns a page by a multiple of 90 degrees.
    RotatePage {
        page: u32,
        degrees: i32,
    },
    /// PDF: the pages in a new order: a permutation of every page index.
    ReorderPages {
        order: Vec<u32>,
    },
}

/// Why an operation list was refused: which operation, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub index: Option<usize>,
    pub operation: Option<String>,
    pub message: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Checks the operations of a proposal to a workpiece of `kind` before anything runs: their
/// count, that each is an operation of the kind with the fields it needs, and the bounds on
/// text and cells. The document itself (a missing sheet, a bad formula) is checked when they
/// are applied.
pub fn check_operations(kind: WorkpieceKind, ops: &[Value]) -> Result<Vec<Operation>, Refused> {
    let refuse = |index: Option<usize>, operation: Option<&str>, message: String| Refused {
        index,
        operation: operation.map(str::to_string),
        message,
    };
    if ops.is_empty() {
        return Err(refuse(None, None, "operations: give at least one".into()));
    }
    if ops.len() > MAX_OPERATIONS {
        return Err(refuse(
            None,
            None,
            format!(
                "{} operations: a proposal carries at most {MAX_OPERATIONS}",
                ops.len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(ops.len());
    for (i, v) in ops.iter().enumerate() {
        let name = v.get("op").and_then(Value::as_str);
        let Some(name) = name else {
            return Err(refuse(
                Some(i),
                None,
                format!("operation {i}: an object with \"op\" naming the operation"),
            ));
        };
        if !kind.operations().contains(&name) {
            return Err(refuse(
                Some(i),
                Some(name),
                format!(
                    "operation {i}: {name:?} is no operation of a {kind}; a {kind}'s operations: {}",
                    kind.operations().join(", ")
                ),
            ));
        }
        let op: Operation = serde_json::from_value(v.clone())
            .map_err(|e| refuse(Some(i), Some(name), format!("operation {i} ({name}): {e}")))?;
        if let Some(m) = op.bound_problem() {
            return Err(refuse(
                Some(i),
                Some(name),
                format!("operation {i} ({name}): {m}"),
            ));
        }
        out.push(op);
    }
    Ok(out)
}

impl Operation {
    /// What exceeds a bound in the operation, if anything.
    fn bound_problem(&self) -> Option<String> {
        let long = |what: &str, s: &str| {
            (s.len() > MAX_TEXT_BYTES)
                .then(|| format!("{what} is {} bytes; at most {MAX_TEXT_BYTES}", s.len()))
        };
        match self {
            Operation::SetCells { values, .. } => {
                let cells: usize = values.iter().map(Vec::len).sum();
                if cells > MAX_CELLS {
                    return Some(format!("{cells} cells; at most {MAX_CELLS}"));
                }
                values.iter().flatten().find_map(|v| match v {
                    Value::String(s) => long("a cell", s),
                    Value::Array(_) | Value::Object(_) => {
                        Some("a cell is a number, a string, a boolean or null".into())
                    }
                    _ => None,
                })
            }
            Operation::ReplaceText { find, replace, .. } => {
                if find.is_empty() {
                    return Some("find is empty".into());
                }
                long("find", find).or_else(|| long("replace", replace))
            }
            Operation::InsertParagraph { text, .. } => long("text", text),
            Operation::InsertTable { rows, .. } => {
                let cells: usize = rows.iter().map(Vec::len).sum();
                if rows.is_empty() || rows.iter().any(Vec::is_empty) {
                    return Some("rows: at least one row of at least one cell".into());
                }
                if cells > MAX_CELLS {
                    return Some(format!("{cells} cells; at most {MAX_CELLS}"));
                }
                rows.iter().flatten().find_map(|c| long("a cell", c))
            }
            Operation::AddSlide { title, body, .. } => title
                .as_deref()
                .and_then(|t| long("title", t))
                .or_else(|| body.as_deref().and_then(|b| long("body", b))),
            Operation::SetText { shape, text, .. } => {
                if !(shape.is_string() || shape.is_u64()) {
                    return Some(
                        "shape: \"title\", \"subtitle\", \"body\", a shape's name, or its index"
                            .into(),
                    );
                }
                long("text", text)
            }
            Operation::SetNotes { text, .. } | Operation::AddNote { text, .. } => {
                long("text", text)
            }
            Operation::Highlight { text, rect, .. } => match (text, rect) {
                (Some(t), None) if !t.is_empty() => long("text", t),
                (None, Some(_)) => None,
                _ => Some("give either text or rect".into()),
            },
            Operation::FillField { value, .. } => long("value", value),
            Operation::RotatePage { degrees, .. } if degrees % 90 != 0 => {
                Some(format!("degrees {degrees}: a multiple of 90"))
            }
            Operation::AddSheet { name, .. } | Operation::RenameSheet { name, .. }
                if name.is_empty() || name.len() > 255 =>
            {
                Some("a sheet's name is 1-255 bytes".into())
            }
            _ => None,
        }
    }
}

/// What a person may do with a proposal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Review {
    Accept,
    Reject,
}

/// What a review does to a proposal: the pure rule both the REST routes and the session view
/// go through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReviewOutcome {
    /// Accept it: its result becomes version `latest + 1`.
    Apply { new_version: u32 },
    /// Reject it.
    Reject,
    /// Already decided this way: answer it as it is.
    AlreadyDone,
    /// Refused (409), with why.
    Conflict(String),
}

/// Decides a review of a proposal in `status` against `base` when the workpiece's latest
/// version is `latest`.
pub fn review(status: ProposalStatus, review: Review, base: u32, latest: u32) -> ReviewOutcome {
    match (status, review) {
        (ProposalStatus::Accepted, Review::Accept) | (ProposalStatus::Rejected, Review::Reject) => {
            ReviewOutcome::AlreadyDone
        }
        (ProposalStatus::Accepted, Review::Reject) => {
            ReviewOutcome::Conflict("the proposal was accepted already".into())
        }
        (ProposalStatus::Rejected, Review::Accept) => {
            ReviewOutcome::Conflict("the proposal was rejected already".into())
        }
        (ProposalStatus::Pending, Review::Reject) => ReviewOutcome::Reject,
        (ProposalStatus::Pending, Review::Accept) if base != latest => {
            ReviewOutcome::Conflict(stale_message(base, latest))
        }
        (ProposalStatus::Pending, Review::Accept) => ReviewOutcome::Apply {
            new_version: latest + 1,
        },
    }
}

/// The 409 of edits written against a version that is not the latest.
pub fn stale_message(base: u32, latest: u32) -> String {
    format!(
        "the proposal's base is version {base} but the workpiece's latest is version {latest}: \
         read version {latest} and propose again"
    )
}

/// What a look at a workpiece's file in the sandbox finds, against what the controller kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// The file is the latest version.
    Unchanged,
    /// The file is another content: a new version by the sandbox.
    Changed,
    /// The file is still the version before an accepted proposal whose result is not in place
    /// yet: put it there (a controller stopped between the two).
    InstallPending,
    /// The file is gone.
    Missing,
}

/// Compares the file's hash (None: missing) with the latest version's and, when the latest
/// came from a proposal not yet put in place, the version before it.
pub fn observe(file: Option<&str>, latest: &str, before_uninstalled: Option<&str>) -> Observed {
    match file {
        None => Observed::Missing,
        Some(f) if f == latest => Observed::Unchanged,
        Some(f) if Some(f) == before_uninstalled => Observed::InstallPending,
        Some(_) => Observed::Changed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_path_names_its_format_and_a_foreign_one_is_refused() {
        assert_eq!(
            format_of(WorkpieceKind::Sheet, "/h/a.XLSX").unwrap(),
            ".xlsx"
        );
        assert_eq!(format_of(WorkpieceKind::Deck, "d.odp").unwrap(), ".odp");
        assert_eq!(format_of(WorkpieceKind::Pdf, "/x/y.pdf").unwrap(), ".pdf");
        let e = format_of(WorkpieceKind::Document, "/h/a.pdf").unwrap_err();
        assert!(e.contains(".docx, .odt"), "{e}");
        assert!(format_of(WorkpieceKind::Pdf, "/h/.pdf").is_err());
        assert!(format_of(WorkpieceKind::Pdf, "/h/pdf").is_err());
        for k in WorkpieceKind::ALL {
            for f in k.formats() {
                assert_ne!(WorkpieceKind::content_type(f), "application/octet-stream");
            }
        }
    }

    #[test]
    fn operations_are_checked_per_kind_and_bounded() {
        let ok = check_operations(
            WorkpieceKind::Sheet,
            &[json!({"op": "set_cells", "sheet": "S", "range": "A1", "values": [[1]]})],
        )
        .unwrap();
        assert!(matches!(ok[0], Operation::SetCells { .. }));
        // Another kind's operation, named with its index.
        let e = check_operations(
            WorkpieceKind::Sheet,
            &[
                json!({"op": "add_sheet", "name": "x"}),
                json!({"op": "delete_slide", "index": 1}),
            ],
        )
        .unwrap_err();
        assert_eq!(e.index, Some(1));
        assert_eq!(e.operation.as_deref(), Some("delete_slide"));
        assert!(e.message.contains("set_cells, add_sheet"), "{}", e.message);
        // A missing field names the operation.
        let e = check_operations(
            WorkpieceKind::Deck,
            &[json!({"op": "move_slide", "from": 1})],
        )
        .unwrap_err();
        assert!(
            e.message.contains("move_slide") && e.message.contains("to"),
            "{e}"
        );
        // Bounds.
        let many = vec![json!({"op": "delete_page", "page": 0}); MAX_OPERATIONS + 1];
        let e = check_operations(WorkpieceKind::Pdf, &many).unwrap_err();
        assert!(e.message.contains("at most 500"), "{e}");
        assert!(check_operations(WorkpieceKind::Pdf, &[]).is_err());
        let e = check_operations(
            WorkpieceKind::Pdf,
            &[json!({"op": "rotate_page", "page": 0, "degrees": 45})],
        )
        .unwrap_err();
        assert!(e.message.contains("multiple of 90"), "{e}");
        let big = vec![vec![json!(1); 101]; 100];
        let e = check_operations(
            WorkpieceKind::Sheet,
            &[json!({"op": "set_cells", "sheet": "S", "range": "A1", "values": big})],
        )
        .unwrap_err();
        assert!(e.message.contains("10100 cells"), "{e}");
        let e = check_operations(WorkpieceKind::Pdf, &[json!({"op": "highlight", "page": 0})])
            .unwrap_err();
        assert!(e.message.contains("either text or rect"), "{e}");
        let e = check_operations(
            WorkpieceKind::Document,
            &[json!({"op": "replace_text", "find": "a", "replace": "b", "x": 1})],
        )
        .unwrap_err();
        assert!(e.message.contains("unknown field"), "{e}");
        // Every kind's named operations parse.
        for k in WorkpieceKind::ALL {
            for name in k.operations() {
                let e = check_operations(*k, &[json!({"op": name})]);
                if let Err(e) = e {
                    assert!(!e.message.contains("no operation of"), "{name}: {e}");
                }
            }
        }
    }

    #[test]
    fn a_review_applies_only_a_pending_proposal_on_the_latest_version() {
        use ProposalStatus::*;
        assert_eq!(
            review(Pending, Review::Accept, 3, 3),
            ReviewOutcome::Apply { new_version: 4 }
        );
        match review(Pending, Review::Accept, 2, 3) {
            ReviewOutcome::Conflict(m) => {
                assert!(m.contains("version 2") && m.contains("version 3"), "{m}")
            }
            o => panic!("{o:?}"),
        }
        assert_eq!(review(Pending, Review::Reject, 2, 3), ReviewOutcome::Reject);
        assert_eq!(
            review(Accepted, Review::Accept, 3, 4),
            ReviewOutcome::AlreadyDone
        );
        assert_eq!(
            review(Rejected, Review::Reject, 3, 3),
            ReviewOutcome::AlreadyDone
        );
        assert!(matches!(
            review(Accepted, Review::Reject, 3, 4),
            ReviewOutcome::Conflict(_)
        ));
        assert!(matches!(
            review(Rejected, Review::Accept, 3, 3),
            ReviewOutcome::Conflict(_)
        ));
    }

    #[test]
    fn a_look_at_the_file_tells_a_change_from_an_install_still_to_do() {
        assert_eq!(observe(Some("a"), "a", None), Observed::Unchanged);
        assert_eq!(observe(Some("b"), "a", None), Observed::Changed);
        assert_eq!(observe(Some("b"), "a", Some("b")), Observed::InstallPending);
        assert_eq!(observe(Some("c"), "a", Some("b")), Observed::Changed);
        assert_eq!(observe(None, "a", Some("b")), Observed::Missing);
    }
}
