//! Container image references as registries and kubelets read them.

/// Whether `r` parses as an image reference: `[host[:port]/]path[:tag][@algo:hex]`, the path
/// lowercase `[a-z0-9._-]` components.
pub fn valid_reference(r: &str) -> bool {
    let (name, digest) = match r.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (r, None),
    };
    if let Some(d) = digest {
        let Some((algo, hex)) = d.split_once(':') else {
            return false;
        };
        if algo.is_empty() || hex.len() < 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return false;
        }
    }
    let last_slash = name.rfind('/').map(|i| i + 1).unwrap_or(0);
    let (name, tag) = match name[last_slash..].rfind(':') {
        Some(i) => (&name[..last_slash + i], Some(&name[last_slash + i + 1..])),
        None => (name, None),
    };
    if let Some(t) = tag
        && (t.is_empty()
            || t.len() > 128
            || !t
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-')))
    {
        return false;
    }
    let mut parts: Vec<&str> = name.split('/').collect();
    // A first component with a '.', a ':' or "localhost" is a registry host[:port].
    if parts.len() > 1
        && (parts[0].contains('.') || parts[0].contains(':') || parts[0] == "localhost")
    {
        let host = parts.remove(0);
        let (h, port) = host.split_once(':').unwrap_or((host, "1"));
        if h.is_empty() || port.parse::<u16>().is_err() {
            return false;
        }
    }
    !parts.is_empty()
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
                })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references_parse_like_a_kubelet_reads_them() {
        for ok in [
            "registry.fake-apiserver.invalid/berth/desktop:test",
            "localhost:5000/berth/desktop@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "busybox",
            "library/busybox:1.36",
        ] {
            assert!(valid_reference(ok), "{ok}");
        }
        for bad in [
            "docker:sha256:abc",
            "",
            "Upper/case",
            "a:b:c",
            "x@sha256:zz",
            "host:port/x",
        ] {
            assert!(!valid_reference(bad), "{bad}");
        }
    }
}
