//! Reading a toolset member's `input` as the `anthropic` SDK's types define it, and picking a
//! turn's `tool_use` blocks: what the computer and browser toolsets share.

use berth_protocol::toolset::invalid_input;
use serde_json::{Map, Value};

/// The most `tool_use` blocks one turn runs.
pub const MAX_CALLS: usize = 100;

/// Reads a member's input fields, collecting every problem (`field: problem`).
pub struct Fields<'a> {
    pub input: &'a Map<String, Value>,
    pub problems: Vec<String>,
}

impl<'a> Fields<'a> {
    pub fn problem(&mut self, field: &str, p: impl std::fmt::Display) {
        self.problems.push(format!("{field}: {p}"));
    }

    pub fn present(&self, field: &str) -> Option<&'a Value> {
        self.input.get(field).filter(|v| !v.is_null())
    }

    pub fn string(&mut self, field: &str, required: bool) -> Option<String> {
        match self.present(field) {
            None if required => self.problem(field, "Field required"),
            None => {}
            Some(Value::String(s)) => return Some(s.clone()),
            Some(_) => self.problem(field, "Input should be a valid string"),
        }
        None
    }

    pub fn int(&mut self, field: &str, required: bool) -> Option<i64> {
        match self.present(field) {
            None if required => self.problem(field, "Field required"),
            None => {}
            Some(v) => match whole(v) {
                Some(i) => return Some(i),
                None => self.problem(field, "Input should be a valid integer"),
            },
        }
        None
    }

    /// A number (whole or not) within `lo..=hi`, the bound named in the error.
    pub fn seconds(&mut self, field: &str, required: bool, lo: f64, hi: f64) -> Option<f64> {
        match self.present(field) {
            None if required => self.problem(field, "Field required"),
            None => {}
            Some(v) => match v.as_f64() {
                Some(s) if (lo..=hi).contains(&s) => return Some(s),
                Some(_) => self.problem(field, format!("must be {lo} to {hi} seconds")),
                None => self.problem(field, "Input should be a valid number"),
            },
        }
        None
    }

    /// `zoom`'s `region`: `[x0, y0, x1, y1]` inside a `w`x`h` screenshot (its end may equal the
    /// size), not empty.
    pub fn region(&mut self, (w, h): (u32, u32)) -> Option<[i64; 4]> {
        let [x0, y0, x1, y1] = self.ints::<4>("region", true, "[x0, y0, x1, y1]")?;
        let (wi, hi) = (w as i64, h as i64);
        if x0 < 0 || y0 < 0 || x1 > wi || y1 > hi {
            self.problem(
                "region",
                format!("[{x0}, {y0}, {x1}, {y1}] is outside the {w}x{h} screenshot"),
            );
            return None;
        }
        if x1 <= x0 || y1 <= y0 {
            self.problem("region", "expected x1 > x0 and y1 > y0");
            return None;
        }
        Some([x0, y0, x1, y1])
    }

    /// An integer within `lo..=hi`, the bound named in the error.
    pub fn ranged(
        &mut self,
        field: &str,
        required: bool,
        lo: i64,
        hi: i64,
        unit: &str,
    ) -> Option<i64> {
        let v = self.int(field, required)?;
        if (lo..=hi).contains(&v) {
            Some(v)
        } else {
            self.problem(field, format!("must be {lo} to {hi}{unit}"));
            None
        }
    }

    /// A fixed number of whole numbers (`[x, y]`, a region), `shape` naming it in errors.
    pub fn ints<const N: usize>(
        &mut self,
        field: &str,
        required: bool,
        shape: &str,
    ) -> Option<[i64; N]> {
        match self.present(field) {
            None if required => self.problem(field, "Field required"),
            None => {}
            Some(Value::Array(items)) if items.len() == N => {
                let parsed: Option<Vec<i64>> = items.iter().map(whole).collect();
                match parsed {
                    Some(v) => return v.try_into().ok(),
                    None => self.problem(field, format!("expected {shape} of integers")),
                }
            }
            Some(_) => self.problem(field, format!("expected {shape}")),
        }
        None
    }
}

/// A member's `input` read by `lower` (which names each problem on the [`Fields`]): what it
/// returns, or the refusal the model reads — every problem at once, as the SDK's types report
/// them. Pure.
pub fn check<T>(
    family: &str,
    name: &str,
    input: &Value,
    lower: impl FnOnce(&mut Fields) -> Option<T>,
) -> Result<T, String> {
    let empty = Map::new();
    let map = match input {
        Value::Object(m) => m,
        Value::Null => &empty,
        _ => {
            return Err(invalid_input(
                family,
                name,
                "Input should be a valid dictionary",
            ));
        }
    };
    let mut f = Fields {
        input: map,
        problems: Vec::new(),
    };
    let out = lower(&mut f);
    if !f.problems.is_empty() {
        return Err(invalid_input(family, name, &f.problems.join("; ")));
    }
    out.ok_or_else(|| invalid_input(family, name, "invalid input"))
}

/// A JSON number that is a whole number (`2` or `2.0`), as the SDK's integer fields take it.
pub fn whole(v: &Value) -> Option<i64> {
    v.as_i64().or_else(|| {
        v.as_f64()
            .filter(|f| f.fract() == 0.0 && f.abs() < 9e15)
            .map(|f| f as i64)
    })
}

/// A turn's `tool_use` blocks for this family, in order; other blocks are skipped. Errors name
/// the block that is not a well-formed `tool_use`.
pub fn calls(content: &[Value], family: &str) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for (i, block) in content.iter().enumerate() {
        let Value::Object(b) = block else {
            return Err(format!("content[{i}]: a content block is a JSON object"));
        };
        if b.get("type").and_then(Value::as_str) != Some("tool_use")
            || b.get("toolset_name").and_then(Value::as_str) != Some(family)
        {
            continue;
        }
        if !b.get("id").is_some_and(Value::is_string)
            || !b.get("name").is_some_and(Value::is_string)
        {
            return Err(format!(
                "content[{i}]: a tool_use block needs a string `id` and `name`"
            ));
        }
        out.push(block.clone());
    }
    if out.len() > MAX_CALLS {
        return Err(format!(
            "a turn runs at most {MAX_CALLS} tool_use blocks, not {}",
            out.len()
        ));
    }
    Ok(out)
}
