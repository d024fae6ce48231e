use std::time::SystemTime;

/// RFC 3339 UTC with milliseconds, the timestamp format of every API field.
pub fn now_rfc3339() -> String {
    rfc3339(SystemTime::now())
}

pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(s).ok()
}
