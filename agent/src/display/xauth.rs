//! X access control: one MIT-MAGIC-COOKIE-1 per desktop. The X server reads it from a file
//! only the agent can read (`-auth`); clients get it from the sandbox user's Xauthority file.
//! Without it the server refuses a client, so nothing on the machine but the desktop's own
//! programs (and the agent) can read the screen or inject input.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

pub const MIT_MAGIC_COOKIE_1: &[u8] = b"MIT-MAGIC-COOKIE-1";
/// Xauth's address families: a Unix-socket connection names the host; a wild entry matches
/// any address (libxcb and x11rb honour it, python-xlib does not).
const FAMILY_LOCAL: u16 = 256;
const FAMILY_WILD: u16 = 65535;

#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Cookie(pub [u8; 16]);

impl std::fmt::Debug for Cookie {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cookie(..)")
    }
}

impl Cookie {
    pub fn generate() -> std::io::Result<Cookie> {
        let mut c = [0u8; 16];
        getrandom::fill(&mut c).map_err(std::io::Error::other)?;
        Ok(Cookie(c))
    }
}

/// One Xauthority record: family, address, display number, protocol name, data — each a
/// big-endian u16 length (the family is the u16 itself) and its bytes.
fn entry(family: u16, address: &[u8], number: &[u8], cookie: &Cookie) -> Vec<u8> {
    let mut out = family.to_be_bytes().to_vec();
    for field in [address, number, MIT_MAGIC_COOKIE_1, &cookie.0[..]] {
        out.extend_from_slice(&(field.len() as u16).to_be_bytes());
        out.extend_from_slice(field);
    }
    out
}

/// The server's file: one wild entry for any display (the server loads every cookie in it).
pub fn server_file(cookie: &Cookie) -> Vec<u8> {
    entry(FAMILY_WILD, b"", b"", cookie)
}

/// The clients' file for display `number`: the entry `xauth add :N . COOKIE` writes (this
/// host's name), which python-xlib needs, and a wild one for clients that look no further.
pub fn client_file(cookie: &Cookie, number: &str, hostname: &[u8]) -> Vec<u8> {
    let mut out = entry(FAMILY_LOCAL, hostname, number.as_bytes(), cookie);
    out.extend(entry(FAMILY_WILD, b"", number.as_bytes(), cookie));
    out
}

/// Writes `bytes` to `path` (mode 0600, owned by `owner`), replacing what was there at once.
pub fn write_private(path: &Path, bytes: &[u8], owner: Option<(u32, u32)>) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.berth-tmp"));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(&tmp, Some(uid), Some(gid))?;
    }
    std::fs::rename(&tmp, path)
}

/// The display number of `:N` / `:N.S` / `host:N`.
pub fn display_number(display: &str) -> Option<&str> {
    let n = display.rsplit_once(':')?.1;
    let n = n.split('.').next()?;
    (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).then_some(n)
}

pub fn hostname() -> Vec<u8> {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned().into_bytes())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_file_holds_the_entry_xauth_writes_and_a_wild_one() {
        let c = Cookie([7; 16]);
        let f = client_file(&c, "12", b"box");
        // family 256, "box", "12", the protocol name, 16 bytes of cookie
        let mut want = vec![1, 0, 0, 3, b'b', b'o', b'x', 0, 2, b'1', b'2', 0, 18];
        want.extend_from_slice(MIT_MAGIC_COOKIE_1);
        want.extend_from_slice(&[0, 16]);
        want.extend_from_slice(&[7; 16]);
        assert_eq!(&f[..want.len()], &want[..]);
        assert_eq!(&f[want.len()..want.len() + 2], &[0xff, 0xff]);
        assert_eq!(f.len(), want.len() * 2 - 3);
    }

    #[test]
    fn display_numbers_are_read_from_every_form() {
        assert_eq!(display_number(":3"), Some("3"));
        assert_eq!(display_number(":10.0"), Some("10"));
        assert_eq!(display_number("host:4"), Some("4"));
        assert_eq!(display_number("nope"), None);
        assert_eq!(display_number(":x"), None);
    }
}
