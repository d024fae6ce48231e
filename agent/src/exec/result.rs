//! A foreground command's wire answer: each stream inline (as text when it is UTF-8, as
//! base64 otherwise) up to a bound, past it a preview and a reference. Shared by `POST /v1/exec` and the MCP `exec` tool.

use base64::Engine;
use berth_protocol::{ExecResult, OutputEnd, OutputPreview};

use super::ForegroundOutcome;

impl ForegroundOutcome {
    /// A foreground command's answer: each stream inline up to `max` bytes; a larger one as
    /// a preview (its first and last lines, its size) with where the whole is read by range.
    pub fn into_result(self, max: usize) -> ExecResult {
        let (stdout, stdout_b64, stdout_preview) =
            inline_or_preview(self.stdout, &self.stdout_end, max);
        let (stderr, stderr_b64, stderr_preview) =
            inline_or_preview(self.stderr, &self.stderr_end, max);
        let previewed = stdout_preview.is_some() || stderr_preview.is_some();
        ExecResult {
            exit_code: self.exit.exit_code(),
            signal: self.exit.signal.map(crate::proc::signal_name),
            stdout,
            stdout_b64,
            stderr,
            stderr_b64,
            duration_ms: self.duration.as_millis() as u64,
            timed_out: self.timed_out,
            output_truncated: self.truncated || previewed,
            output_href: previewed.then(|| {
                berth_protocol::routes::fill(
                    berth_protocol::routes::native::COMMAND_OUTPUT,
                    &[&self.id],
                )
            }),
            id: self.id,
            stdout_preview,
            stderr_preview,
        }
    }
}

/// A stream as text, as base64 when it is not UTF-8, or past `max` bytes as a preview.
fn inline_or_preview(
    kept: Vec<u8>,
    end: &OutputEnd,
    max: usize,
) -> (Option<String>, Option<String>, Option<OutputPreview>) {
    let total = end.total.max(kept.len() as u64);
    if total <= max as u64 {
        let (text, b64) = text_or_b64(kept);
        return (text, b64, None);
    }
    let last = if end.last.is_empty() {
        &kept
    } else {
        &end.last
    };
    (None, None, Some(OutputPreview::of(&kept, last, total)))
}

/// At most `max` bytes, cut back to a character boundary when the bytes are UTF-8 text (a
/// character split by the cut would turn the text into base64). Says whether it cut.
pub fn bound_output(mut bytes: Vec<u8>, max: usize) -> (Vec<u8>, bool) {
    if bytes.len() <= max {
        return (bytes, false);
    }
    bytes.truncate(max);
    if let Err(e) = std::str::from_utf8(&bytes)
        && e.error_len().is_none()
        && bytes.len() - e.valid_up_to() < 4
    {
        bytes.truncate(e.valid_up_to());
    }
    (bytes, true)
}

fn text_or_b64(bytes: Vec<u8>) -> (Option<String>, Option<String>) {
    match String::from_utf8(bytes) {
        Ok(s) => (Some(s), None),
        Err(e) => (
            None,
            Some(base64::engine::general_purpose::STANDARD.encode(e.into_bytes())),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_cut_at_the_bound_and_on_a_character_boundary() {
        assert_eq!(bound_output(b"abc".to_vec(), 3), (b"abc".to_vec(), false));
        assert_eq!(bound_output(b"abcd".to_vec(), 3), (b"abc".to_vec(), true));
        // "é" is two bytes: a cut through it keeps the text before it, still UTF-8.
        let (cut, truncated) = bound_output("aé".as_bytes().to_vec(), 2);
        assert_eq!((cut.as_slice(), truncated), (b"a".as_slice(), true));
        // Binary output is cut where the bound says.
        let (cut, _) = bound_output(vec![0xff; 10], 4);
        assert_eq!(cut.len(), 4);
    }
}
