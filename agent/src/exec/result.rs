//! A foreground command's wire answer: each stream bounded, as text when it is UTF-8 and as
//! base64 otherwise. Shared by `POST /v1/exec` and the MCP `exec` tool.

use base64::Engine;
use berth_protocol::ExecResult;

use super::ForegroundOutcome;

impl ForegroundOutcome {
    /// A foreground command's answer, each stream cut to `max` bytes (`output_truncated` then).
    pub fn into_result(self, max: usize) -> ExecResult {
        let (stdout, cut_out) = bound_output(self.stdout, max);
        let (stderr, cut_err) = bound_output(self.stderr, max);
        let (stdout, stdout_b64) = text_or_b64(stdout);
        let (stderr, stderr_b64) = text_or_b64(stderr);
        ExecResult {
            id: self.id,
            exit_code: self.exit.exit_code(),
            signal: self.exit.signal.map(crate::proc::signal_name),
            stdout,
            stdout_b64,
            stderr,
            stderr_b64,
            duration_ms: self.duration.as_millis() as u64,
            timed_out: self.timed_out,
            output_truncated: self.truncated || cut_out || cut_err,
        }
    }
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
