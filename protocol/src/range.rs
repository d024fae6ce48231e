//! HTTP single-range requests (`Range: bytes=…`), shared by every server that answers byte
//! ranges (the agent's recordings, the controller's artifacts).

/// `bytes=a-b`, `bytes=a-`, `bytes=-n` against a length: the inclusive `(start, end)` to
/// serve, `None` when unsatisfiable (answer 416). Several ranges are refused too.
pub fn parse_range(spec: &str, len: u64) -> Option<(u64, u64)> {
    let spec = spec.trim().strip_prefix("bytes=")?;
    if spec.contains(',') || len == 0 {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let (a, b) = (a.trim(), b.trim());
    let (start, end) = if a.is_empty() {
        let n: u64 = b.parse().ok()?;
        if n == 0 {
            return None;
        }
        (len.saturating_sub(n), len - 1)
    } else {
        let start: u64 = a.parse().ok()?;
        let end = if b.is_empty() {
            len - 1
        } else {
            b.parse::<u64>().ok()?.min(len - 1)
        };
        (start, end)
    };
    (start <= end && start < len).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::parse_range;

    #[test]
    fn ranges_are_served_clamped_or_refused() {
        assert_eq!(parse_range("bytes=0-9", 100), Some((0, 9)));
        assert_eq!(parse_range("bytes=90-", 100), Some((90, 99)));
        assert_eq!(parse_range("bytes=-10", 100), Some((90, 99)));
        assert_eq!(parse_range("bytes=-1000", 100), Some((0, 99)));
        assert_eq!(parse_range("bytes=50-5000", 100), Some((50, 99)));
        assert_eq!(parse_range(" bytes= 1 - 2 ", 100), Some((1, 2)));
        for bad in [
            "bytes=100-",
            "bytes=5-4",
            "bytes=-0",
            "bytes=0-1,5-6",
            "bytes=a-b",
            "items=0-1",
            "bytes=",
            "bytes=-",
            "0-1",
        ] {
            assert_eq!(parse_range(bad, 100), None, "{bad}");
        }
        assert_eq!(parse_range("bytes=0-", 0), None, "nothing to serve");
    }
}
