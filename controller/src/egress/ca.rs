//! The egress CA: the certificate authority the proxy signs its leaf certificates with when it
//! opens a tunnel to add a credential. Generated once and kept in the controller's state
//! directory (the key readable by the controller alone); sandboxes get the certificate, never
//! the key.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use anyhow::Context;
use openssl::asn1::Asn1Time;
use openssl::bn::{BigNum, MsbOption};
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::x509::extension::{
    AuthorityKeyIdentifier, BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAlternativeName,
    SubjectKeyIdentifier,
};
use openssl::x509::{X509, X509NameBuilder};

/// The CA's certificate in the state directory.
pub const CERT_FILE: &str = "egress-ca.pem";
/// Its private key (mode 0600).
pub const KEY_FILE: &str = "egress-ca-key.pem";
/// Leaf certificates kept, by host; past this many the cache starts again.
const LEAVES: usize = 1024;
/// A leaf's validity.
const LEAF_DAYS: u32 = 30;

pub struct Ca {
    cert: X509,
    key: PKey<Private>,
    /// One key for every leaf (a P-256 key: signing a leaf is then a fraction of a millisecond).
    leaf_key: PKey<Private>,
    pem: String,
    leaves: Mutex<HashMap<String, tokio_native_tls::TlsAcceptor>>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ca(..)")
    }
}

fn p256() -> anyhow::Result<PKey<Private>> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?;
    Ok(PKey::from_ec_key(EcKey::generate(&group)?)?)
}

fn serial() -> anyhow::Result<openssl::asn1::Asn1Integer> {
    let mut bn = BigNum::new()?;
    bn.rand(127, MsbOption::MAYBE_ZERO, false)?;
    Ok(bn.to_asn1_integer()?)
}

impl Ca {
    /// The CA kept in `dir`, generated there on first use.
    pub fn load_or_create(dir: &Path, name: &str) -> anyhow::Result<Ca> {
        let (cert_path, key_path) = (dir.join(CERT_FILE), dir.join(KEY_FILE));
        let (cert, key) = match (std::fs::read(&cert_path), std::fs::read(&key_path)) {
            (Ok(c), Ok(k)) => {
                let cert = X509::from_pem(&c).with_context(|| cert_path.display().to_string())?;
                let key = PKey::private_key_from_pem(&k)
                    .with_context(|| key_path.display().to_string())?;
                (cert, key)
            }
            _ => {
                let (cert, key) = generate(name)?;
                write_private(&key_path, &key.private_key_to_pem_pkcs8()?)?;
                std::fs::write(&cert_path, cert.to_pem()?)
                    .with_context(|| cert_path.display().to_string())?;
                tracing::info!(path = %cert_path.display(), "egress CA generated");
                (cert, key)
            }
        };
        Ca::new(cert, key)
    }

    fn new(cert: X509, key: PKey<Private>) -> anyhow::Result<Ca> {
        let pem = String::from_utf8(cert.to_pem()?)?;
        Ok(Ca {
            cert,
            key,
            leaf_key: p256()?,
            pem,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// A CA held in memory only (tests).
    pub fn ephemeral(name: &str) -> anyhow::Result<Ca> {
        let (cert, key) = generate(name)?;
        Ca::new(cert, key)
    }

    /// The CA's certificate (PEM): what sandboxes trust.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// A TLS acceptor presenting a certificate for `host` signed by this CA.
    pub fn acceptor(&self, host: &str) -> anyhow::Result<tokio_native_tls::TlsAcceptor> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = leaves.get(host) {
            return Ok(a.clone());
        }
        let leaf = self.leaf(host)?;
        let mut chain = leaf.to_pem()?;
        chain.extend_from_slice(&self.cert.to_pem()?);
        let key = self.leaf_key.private_key_to_pem_pkcs8()?;
        let identity = native_tls::Identity::from_pkcs8(&chain, &key)?;
        let acceptor: tokio_native_tls::TlsAcceptor =
            native_tls::TlsAcceptor::builder(identity).build()?.into();
        if leaves.len() >= LEAVES {
            leaves.clear();
        }
        leaves.insert(host.to_string(), acceptor.clone());
        Ok(acceptor)
    }

    fn leaf(&self, host: &str) -> anyhow::Result<X509> {
        let mut name = X509NameBuilder::new()?;
        // A CN is at most 64 characters; the name that matters is the SAN.
        name.append_entry_by_nid(Nid::COMMONNAME, &host[..host.len().min(64)])?;
        let name = name.build();
        let mut b = X509::builder()?;
        b.set_version(2)?;
        let sn = serial()?;
        b.set_serial_number(&sn)?;
        b.set_subject_name(&name)?;
        b.set_issuer_name(self.cert.subject_name())?;
        b.set_pubkey(&self.leaf_key)?;
        let from = hours_ago(1)?;
        b.set_not_before(&from)?;
        let to = Asn1Time::days_from_now(LEAF_DAYS)?;
        b.set_not_after(&to)?;
        b.append_extension(BasicConstraints::new().critical().build()?)?;
        b.append_extension(
            KeyUsage::new()
                .critical()
                .digital_signature()
                .key_encipherment()
                .build()?,
        )?;
        b.append_extension(ExtendedKeyUsage::new().server_auth().build()?)?;
        let mut san = SubjectAlternativeName::new();
        match host.parse::<std::net::IpAddr>() {
            Ok(_) => san.ip(host),
            Err(_) => san.dns(host),
        };
        let ctx = b.x509v3_context(Some(&self.cert), None);
        let san = san.build(&ctx)?;
        let ski = SubjectKeyIdentifier::new().build(&ctx)?;
        let aki = AuthorityKeyIdentifier::new().keyid(true).build(&ctx)?;
        b.append_extension(san)?;
        b.append_extension(ski)?;
        b.append_extension(aki)?;
        b.sign(&self.key, MessageDigest::sha256())?;
        Ok(b.build())
    }
}

/// A time `hours` back: a sandbox whose clock runs a little behind still accepts a new leaf.
fn hours_ago(hours: i64) -> anyhow::Result<Asn1Time> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs() as i64;
    Ok(Asn1Time::from_unix(now - hours * 3600)?)
}

fn generate(name: &str) -> anyhow::Result<(X509, PKey<Private>)> {
    let key = p256()?;
    let mut subject = X509NameBuilder::new()?;
    subject.append_entry_by_nid(Nid::ORGANIZATIONNAME, "berth")?;
    subject.append_entry_by_nid(Nid::COMMONNAME, &format!("berth egress CA {name}"))?;
    let subject = subject.build();
    let mut b = X509::builder()?;
    b.set_version(2)?;
    let sn = serial()?;
    b.set_serial_number(&sn)?;
    b.set_subject_name(&subject)?;
    b.set_issuer_name(&subject)?;
    b.set_pubkey(&key)?;
    let from = hours_ago(24)?;
    b.set_not_before(&from)?;
    let to = Asn1Time::days_from_now(3650)?;
    b.set_not_after(&to)?;
    b.append_extension(BasicConstraints::new().critical().ca().pathlen(0).build()?)?;
    b.append_extension(
        KeyUsage::new()
            .critical()
            .key_cert_sign()
            .crl_sign()
            .build()?,
    )?;
    let ski = SubjectKeyIdentifier::new().build(&b.x509v3_context(None, None))?;
    b.append_extension(ski)?;
    b.sign(&key, MessageDigest::sha256())?;
    Ok((b.build(), key))
}

fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| tmp.display().to_string())?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| path.display().to_string())?;
    Ok(())
}
