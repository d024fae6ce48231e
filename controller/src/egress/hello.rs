//! The server name a TLS client asks for, read from its ClientHello (RFC 8446 §4.1.2, the
//! `server_name` extension of RFC 6066 §3) without decrypting anything.

/// What the first bytes of a tunnelled connection say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// Not all of the ClientHello has arrived yet: read more.
    Partial,
    /// A TLS ClientHello naming this server (lower case, no trailing dot).
    Tls(Option<String>),
    /// Not TLS.
    NotTls,
    /// A TLS handshake record that is not a whole ClientHello: malformed, over a record's
    /// size, or split across records, which hides its server name from a reader of one
    /// record (clients send theirs whole).
    Unreadable,
}

/// The largest ClientHello record read before a decision (a TLS record's own bound).
pub const MAX_HELLO: usize = 5 + (1 << 14);

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.b.len() < n {
            return None;
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Some(h)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| b[0] as usize)
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2).map(|b| (b[0] as usize) << 8 | b[1] as usize)
    }
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(n)
    }
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(n)
    }
}

/// Reads `buf`, the first bytes a client sent into a tunnel.
pub fn parse(buf: &[u8]) -> Hello {
    // A handshake record (22) of TLS 1.0 or later.
    match buf {
        [] => return Hello::Partial,
        [22] | [22, 3] => return Hello::Partial,
        [22, 3, ..] => {}
        _ => return Hello::NotTls,
    }
    if buf.len() < 5 {
        return Hello::Partial;
    }
    let len = (buf[3] as usize) << 8 | buf[4] as usize;
    if len > 1 << 14 {
        return Hello::Unreadable;
    }
    if buf.len() < 5 + len {
        return Hello::Partial;
    }
    match client_hello(&buf[5..5 + len]) {
        Some(name) => Hello::Tls(name),
        None => Hello::Unreadable,
    }
}

/// The handshake message in one record: `None` when it is not a well-formed ClientHello
/// (one split across records is not read: clients send theirs whole).
fn client_hello(record: &[u8]) -> Option<Option<String>> {
    let mut r = Reader { b: record };
    if r.u8()? != 1 {
        return None;
    }
    let n = r.take(3)?;
    let n = (n[0] as usize) << 16 | (n[1] as usize) << 8 | n[2] as usize;
    let mut r = Reader { b: r.take(n)? };
    r.take(2 + 32)?; // version, random
    r.vec8()?; // session id
    r.vec16()?; // cipher suites
    r.vec8()?; // compression methods
    if r.b.is_empty() {
        return Some(None);
    }
    let mut ext = Reader { b: r.vec16()? };
    while !ext.b.is_empty() {
        let kind = ext.u16()?;
        let body = ext.vec16()?;
        if kind != 0 {
            continue;
        }
        let mut list = Reader {
            b: Reader { b: body }.vec16()?,
        };
        while !list.b.is_empty() {
            let name_type = list.u8()?;
            let name = list.vec16()?;
            if name_type == 0 {
                let name = std::str::from_utf8(name).ok()?;
                return Some(Some(berth_protocol::egress::normalise(name)));
            }
        }
        return Some(None);
    }
    Some(None)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A ClientHello as a client writes it, with `server_name` when given.
    pub fn hello(server_name: Option<&str>) -> Vec<u8> {
        let mut ext = Vec::new();
        // supported_versions, then server_name, as clients order them variously.
        ext.extend_from_slice(&[0x00, 0x2b, 0x00, 0x03, 0x02, 0x03, 0x04]);
        if let Some(n) = server_name {
            let n = n.as_bytes();
            let entry_len = 3 + n.len();
            ext.extend_from_slice(&[0x00, 0x00]);
            ext.extend_from_slice(&((entry_len + 2) as u16).to_be_bytes());
            ext.extend_from_slice(&(entry_len as u16).to_be_bytes());
            ext.push(0);
            ext.extend_from_slice(&(n.len() as u16).to_be_bytes());
            ext.extend_from_slice(n);
        }
        let mut body = vec![0x03, 0x03];
        body.extend_from_slice(&[7; 32]);
        body.push(0);
        body.extend_from_slice(&[0x00, 0x02, 0x13, 0x01]);
        body.extend_from_slice(&[0x01, 0x00]);
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut hs = vec![1, 0, (body.len() >> 8) as u8, body.len() as u8];
        hs.extend_from_slice(&body);
        let mut rec = vec![22, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn the_server_name_is_read() {
        let h = hello(Some("GitHub.com."));
        assert_eq!(parse(&h), Hello::Tls(Some("github.com".into())));
        assert_eq!(parse(&hello(None)), Hello::Tls(None));
    }

    #[test]
    fn every_prefix_asks_for_more() {
        let h = hello(Some("example.org"));
        for n in 0..h.len() {
            assert_eq!(parse(&h[..n]), Hello::Partial, "{n} bytes");
        }
    }

    #[test]
    fn other_bytes_are_not_tls_and_odd_handshakes_are_unreadable() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
        assert_eq!(parse(b"SSH-2.0-OpenSSH\r\n"), Hello::NotTls);
        assert_eq!(parse(&[22, 3, 1, 0xff, 0xff]), Hello::Unreadable);
        let mut h = hello(Some("example.org"));
        h[5] = 2; // a ServerHello
        assert_eq!(parse(&h), Hello::Unreadable);
        // A truncated extension list inside a complete record.
        let mut h = hello(Some("example.org"));
        let l = h.len();
        h[l - 3] = 0xff;
        assert_eq!(parse(&h), Hello::Unreadable);
        // The same ClientHello split across two records: its first record alone is read.
        let h = hello(Some("evil.test"));
        let body = &h[5..];
        let (a, b) = body.split_at(20);
        let mut split = vec![22, 3, 1, 0, a.len() as u8];
        split.extend_from_slice(a);
        split.extend_from_slice(&[22, 3, 1, (b.len() >> 8) as u8, b.len() as u8]);
        split.extend_from_slice(b);
        assert_eq!(parse(&split), Hello::Unreadable);
    }

    #[test]
    fn hostile_lengths_never_panic() {
        let h = hello(Some("example.org"));
        for i in 5..h.len() {
            for v in [0u8, 1, 0x7f, 0xff] {
                let mut m = h.clone();
                m[i] = v;
                let _ = parse(&m);
            }
        }
    }
}
