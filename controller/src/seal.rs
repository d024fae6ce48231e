//! Secrets at rest. The store never holds an agent token (or a run's not-yet-delivered
//! environment) in the clear: each is sealed with ChaCha20-Poly1305 under a key kept outside the
//! database, bound to the row it belongs to. A copy of `berth.db` alone hands out nothing.
//!
//! Encryption rather than a hash: the controller must present the agent's token to the agent,
//! so it has to get the token back.

use std::io::Write;
use std::path::Path;

use base64::Engine;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Sealed values start with this, so a store from before sealing is recognised and migrated.
pub const PREFIX: &str = "sealed:v1:";
const NONCE_LEN: usize = 12;

#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("not a sealed value")]
    NotSealed,
    #[error("a sealed value does not open with this key (sealed with another key, or altered)")]
    WrongKey,
}

#[derive(Clone)]
pub struct Sealer {
    cipher: ChaCha20Poly1305,
    /// The key for values derived from the secret key (HMAC-SHA-256), apart from the
    /// cipher's own.
    derive: [u8; 32],
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(..)")
    }
}

impl Sealer {
    pub fn new(key: [u8; 32]) -> Sealer {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&key).expect("any key length");
        mac.update(b"berth: the key values are derived with");
        Sealer {
            cipher: ChaCha20Poly1305::new(Key::from_slice(&key)),
            derive: mac.finalize().into_bytes().into(),
        }
    }

    /// A secret derived from the secret key for `label` (hex): the same for the same key and
    /// label, and nothing about the key or other labels' secrets follows from it.
    pub fn derive(&self, label: &str) -> String {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.derive).expect("any key length");
        mac.update(label.as_bytes());
        crate::util::hex(&mac.finalize().into_bytes())
    }

    /// The key in `path` (64 hex digits), created 0600 with a random key when missing.
    pub fn load_or_create(path: &Path) -> anyhow::Result<Sealer> {
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let key = parse_key(text.trim()).ok_or_else(|| {
                    anyhow::anyhow!("{}: a secret key is 64 hex digits", path.display())
                })?;
                Ok(Sealer::new(key))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut key = [0u8; 32];
                getrandom::fill(&mut key).map_err(|e| anyhow::anyhow!("random key: {e}"))?;
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                use std::os::unix::fs::OpenOptionsExt;
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path)
                    .map_err(|e| anyhow::anyhow!("creating {}: {e}", path.display()))?;
                f.write_all(crate::util::hex(&key).as_bytes())?;
                f.sync_all()?;
                Ok(Sealer::new(key))
            }
            Err(e) => Err(anyhow::anyhow!("reading {}: {e}", path.display())),
        }
    }

    /// Seals `plain` for the row named `bound_to` (it opens only for that name).
    pub fn seal(&self, plain: &[u8], bound_to: &str) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).expect("the OS random source");
        let ct = self
            .cipher
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: plain,
                    aad: bound_to.as_bytes(),
                },
            )
            .expect("ChaCha20-Poly1305 seals any message this size");
        let mut raw = nonce.to_vec();
        raw.extend(ct);
        format!(
            "{PREFIX}{}",
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(raw)
        )
    }

    pub fn open(&self, sealed: &str, bound_to: &str) -> Result<Vec<u8>, SealError> {
        let b64 = sealed.strip_prefix(PREFIX).ok_or(SealError::NotSealed)?;
        let raw = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(b64)
            .map_err(|_| SealError::WrongKey)?;
        if raw.len() < NONCE_LEN {
            return Err(SealError::WrongKey);
        }
        let (nonce, ct) = raw.split_at(NONCE_LEN);
        self.cipher
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: ct,
                    aad: bound_to.as_bytes(),
                },
            )
            .map_err(|_| SealError::WrongKey)
    }

    pub fn open_string(&self, sealed: &str, bound_to: &str) -> Result<String, SealError> {
        String::from_utf8(self.open(sealed, bound_to)?).map_err(|_| SealError::WrongKey)
    }
}

pub fn is_sealed(value: &str) -> bool {
    value.starts_with(PREFIX)
}

fn parse_key(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut key = [0u8; 32];
    for (i, b) in key.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_secrets_follow_the_key_and_the_label() {
        let a = Sealer::new([7; 32]);
        let d = a.derive("control-key:sb_1");
        assert_eq!(d.len(), 64);
        assert_eq!(d, Sealer::new([7; 32]).derive("control-key:sb_1"));
        assert_ne!(d, a.derive("control-key:sb_2"));
        assert_ne!(d, Sealer::new([8; 32]).derive("control-key:sb_1"));
    }

    #[test]
    fn a_sealed_value_opens_only_with_its_key_and_its_row() {
        let s = Sealer::new([7; 32]);
        let sealed = s.seal(b"token-123", "sb_1");
        assert!(is_sealed(&sealed));
        assert!(!sealed.contains("token-123"));
        assert_eq!(s.open(&sealed, "sb_1").unwrap(), b"token-123");
        assert!(matches!(s.open(&sealed, "sb_2"), Err(SealError::WrongKey)));
        let other = Sealer::new([8; 32]);
        assert!(matches!(
            other.open(&sealed, "sb_1"),
            Err(SealError::WrongKey)
        ));
        assert!(matches!(
            s.open("token-123", "sb_1"),
            Err(SealError::NotSealed)
        ));
        // Two seals of one value differ (a fresh nonce each).
        assert_ne!(sealed, s.seal(b"token-123", "sb_1"));
        let mut tampered = sealed.clone();
        tampered.pop();
        assert!(s.open(&tampered, "sb_1").is_err());
    }

    #[test]
    fn the_key_file_is_created_once_0600_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("secret.key");
        let a = Sealer::load_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let b = Sealer::load_or_create(&path).unwrap();
        assert_eq!(b.open(&a.seal(b"x", "r"), "r").unwrap(), b"x");
        std::fs::write(&path, "not hex").unwrap();
        assert!(Sealer::load_or_create(&path).is_err());
    }
}
