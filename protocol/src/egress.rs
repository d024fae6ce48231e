//! A sandbox's egress policy (`egress` at create, on pools and leases, and the config's
//! default) and the decisions the egress proxy takes with it: pure functions of the policy,
//! the name asked for and the addresses it resolves to.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// How a sandbox behind the egress proxy comes to trust the proxy's CA: the controller sets
/// these in the sandbox's environment, the agent installs the certificate.
pub mod trust {
    /// The CA certificate (PEM) for the agent to install.
    pub const CA_VAR: &str = "BERTH_EGRESS_CA";
    /// Where the agent puts it (`update-ca-certificates` keeps it on a rebuild).
    pub const CA_FILE: &str = "/usr/local/share/ca-certificates/berth-egress.crt";
    /// The system bundle, to which the agent adds it.
    pub const BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
    /// Variables pointing programs with their own CA list at the system bundle (Python's
    /// `requests`, pip, git, curl, OpenSSL).
    pub const BUNDLE_VARS: [&str; 5] = [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "PIP_CERT",
        "GIT_SSL_CAINFO",
        "CURL_CA_BUNDLE",
    ];
    /// Node's extra CAs: the certificate itself.
    pub const NODE_VAR: &str = "NODE_EXTRA_CA_CERTS";
}

/// Where a sandbox's programs may connect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum Egress {
    /// `"open"`: anywhere its host reaches, directly (nothing counted); `"none"`: nowhere.
    Mode(EgressMode),
    /// Only the hosts allowed, through the egress proxy.
    Rules(EgressRules),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EgressMode {
    Open,
    None,
}

/// `{"allow": ["github.com", "*.pypi.org", "203.0.113.0/24"], "deny_private": true}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressRules {
    /// Host names (`github.com`), wildcards for names below one (`*.pypi.org`: not
    /// `pypi.org` itself), and addresses or ranges (`10.0.0.5`, `10.0.0.0/8`). Ports are
    /// not restricted.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Refuse private, loopback, link-local and other non-public addresses, whatever name
    /// led to them, unless an address entry of `allow` covers them. Default true.
    #[serde(default = "yes")]
    pub deny_private: bool,
}

fn yes() -> bool {
    true
}

impl Default for Egress {
    fn default() -> Self {
        Egress::Mode(EgressMode::Open)
    }
}

/// Why a connection was refused: the `reason` of an `egress.denied` event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denial {
    /// The policy is `"none"`.
    NoEgress,
    /// The name matches no `allow` entry.
    NotAllowed,
    /// An address asked for directly, which no address entry allows.
    IpLiteral,
    /// The name resolved to a private or otherwise non-public address.
    PrivateAddress,
    /// The TLS server name differs from the host asked for.
    SniMismatch,
    /// A TLS ClientHello the proxy cannot read whole in its first record (malformed, or
    /// split across records), so its server name cannot be checked.
    UnreadableHello,
    /// The request's `Host` header differs from the host in its URL.
    HostMismatch,
    /// The name does not resolve.
    Unresolved,
}

impl Denial {
    pub fn as_str(self) -> &'static str {
        match self {
            Denial::NoEgress => "egress_none",
            Denial::NotAllowed => "not_allowed",
            Denial::IpLiteral => "ip_literal",
            Denial::PrivateAddress => "private_address",
            Denial::SniMismatch => "sni_mismatch",
            Denial::UnreadableHello => "unreadable_client_hello",
            Denial::HostMismatch => "host_mismatch",
            Denial::Unresolved => "unresolved",
        }
    }
}

/// One `allow` entry, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    Exact(String),
    /// `*.suffix`: any name ending in `.suffix`.
    Below(String),
    /// An address range (a single address is a range of one).
    Net(IpAddr, u8),
}

fn parse_entry(s: &str) -> Result<Entry, String> {
    let bad = |why: &str| format!("egress allow entry {s:?}: {why}");
    let t = s.trim();
    if let Some((addr, bits)) = t.split_once('/') {
        let ip: IpAddr = addr.parse().map_err(|_| bad("not an address range"))?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let bits: u8 = bits
            .parse()
            .ok()
            .filter(|b| *b <= max)
            .ok_or_else(|| bad("the prefix length is out of range"))?;
        return Ok(Entry::Net(ip, bits));
    }
    if let Ok(ip) = t.trim_matches(['[', ']']).parse::<IpAddr>() {
        return Ok(Entry::Net(ip, if ip.is_ipv4() { 32 } else { 128 }));
    }
    let (below, name) = match t.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, t),
    };
    let name = normalise(name);
    let valid = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if !valid {
        return Err(bad("give a host name, *.name, an address or a range"));
    }
    Ok(if below {
        Entry::Below(name)
    } else {
        Entry::Exact(name)
    })
}

/// A host name as compared: lower case, without a trailing dot.
pub fn normalise(host: &str) -> String {
    host.trim().trim_end_matches('.').to_ascii_lowercase()
}

/// The host of an `http(s)://` URL, normalised (no port, user or path); `None` for another
/// scheme or no host.
pub fn url_host(url: &str) -> Option<String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit('@').next()?;
    let host = normalise(host_of(authority));
    (!host.is_empty()).then_some(host)
}

/// The host of a `Host` header or authority (`h`, `h:80`, `[::1]:80`).
pub fn host_of(authority: &str) -> &str {
    let a = authority.trim();
    if let Some(rest) = a.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match a.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) && !h.contains(':') => h,
        _ => a,
    }
}

/// Whether `host` is the name a credential's pattern names: the name itself, or for
/// `*.suffix` any name below `suffix`.
pub fn name_matches(pattern: &str, host: &str) -> bool {
    let name = normalise(host);
    match parse_entry(pattern) {
        Ok(Entry::Exact(n)) => n == name,
        Ok(Entry::Below(suffix)) => below(&name, &suffix),
        Ok(Entry::Net(net, bits)) => host
            .trim_matches(['[', ']'])
            .parse::<IpAddr>()
            .is_ok_and(|ip| in_net(ip, net, bits)),
        Err(_) => false,
    }
}

fn below(name: &str, suffix: &str) -> bool {
    name.strip_suffix(suffix)
        .is_some_and(|head| head.len() > 1 && head.ends_with('.'))
}

/// Checks a policy's entries: the reason of the first that does not parse.
pub fn validate(e: &Egress) -> Result<(), String> {
    if let Egress::Rules(r) = e {
        for a in &r.allow {
            parse_entry(a)?;
        }
    }
    Ok(())
}

fn in_net(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// Whether `ip` is not a public unicast address: private, loopback, link-local, shared
/// (100.64/10), documentation, benchmarking, multicast, unspecified, reserved, or IPv6's
/// unique-local, link-local and the IPv4 addresses it maps.
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_private()
                || v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_documentation()
                || o[0] == 0
                || (o[0] == 100 && (o[1] & 0xc0) == 64)
                || (o[0] == 192 && o[1] == 0 && o[2] == 0)
                || (o[0] == 198 && (o[1] & 0xfe) == 18)
                || o[0] >= 240
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_private(IpAddr::V4(v4));
            }
            let s = v6.segments();
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || (s[0] == 0x2001 && s[1] == 0x0db8)
                || (s[0] == 0x64 && s[1] == 0xff9b)
        }
    }
}

/// What the proxy may do with a host asked for, before resolving it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostVerdict {
    /// Allowed by name: resolve it, then check each address ([`address_allowed`]).
    Resolve,
    /// An address asked for directly and allowed: connect to it.
    Connect(IpAddr),
    Deny(Denial),
}

/// The decision on a host asked for (`CONNECT host:port`, or an absolute URL's host).
pub fn host_verdict(policy: &Egress, host: &str) -> HostVerdict {
    let rules = match policy {
        Egress::Mode(EgressMode::None) => return HostVerdict::Deny(Denial::NoEgress),
        Egress::Mode(EgressMode::Open) => None,
        Egress::Rules(r) => Some(r),
    };
    let entries: Vec<Entry> = rules
        .map(|r| r.allow.iter().filter_map(|a| parse_entry(a).ok()).collect())
        .unwrap_or_default();
    if let Ok(ip) = host.trim_matches(['[', ']']).parse::<IpAddr>() {
        let covered = rules.is_none()
            || entries
                .iter()
                .any(|e| matches!(e, Entry::Net(n, b) if in_net(ip, *n, *b)));
        return match covered {
            true => HostVerdict::Connect(ip),
            false => HostVerdict::Deny(Denial::IpLiteral),
        };
    }
    if rules.is_none() {
        return HostVerdict::Resolve;
    }
    let name = normalise(host);
    let named = entries.iter().any(|e| match e {
        Entry::Exact(n) => *n == name,
        Entry::Below(suffix) => below(&name, suffix),
        Entry::Net(..) => false,
    });
    if named {
        HostVerdict::Resolve
    } else {
        HostVerdict::Deny(Denial::NotAllowed)
    }
}

/// Whether a name allowed by [`host_verdict`] may be reached at `ip`, one of its addresses.
pub fn address_allowed(policy: &Egress, ip: IpAddr) -> Result<(), Denial> {
    let r = match policy {
        Egress::Mode(EgressMode::None) => return Err(Denial::NoEgress),
        Egress::Mode(EgressMode::Open) => return Ok(()),
        Egress::Rules(r) => r,
    };
    if !r.deny_private || !is_private(ip) {
        return Ok(());
    }
    let covered = r
        .allow
        .iter()
        .filter_map(|a| parse_entry(a).ok())
        .any(|e| matches!(e, Entry::Net(n, b) if in_net(ip, n, b)));
    if covered {
        Ok(())
    } else {
        Err(Denial::PrivateAddress)
    }
}

/// The addresses of an allowed name that the policy lets a sandbox reach (in the order
/// given), or why none: the reason of the first refused, or `Unresolved` when there are none.
pub fn reachable(policy: &Egress, addrs: &[IpAddr]) -> Result<Vec<IpAddr>, Denial> {
    let allowed: Vec<IpAddr> = addrs
        .iter()
        .copied()
        .filter(|ip| address_allowed(policy, *ip).is_ok())
        .collect();
    if !allowed.is_empty() {
        return Ok(allowed);
    }
    Err(addrs
        .first()
        .and_then(|ip| address_allowed(policy, *ip).err())
        .unwrap_or(Denial::Unresolved))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_patterns_name_hosts() {
        assert!(name_matches("github.com", "GitHub.com."));
        assert!(!name_matches("github.com", "api.github.com"));
        assert!(name_matches("*.github.com", "api.github.com"));
        assert!(!name_matches("*.github.com", "github.com"));
        assert!(!name_matches("*.github.com", "evilgithub.com"));
        assert!(name_matches("10.0.0.0/8", "10.1.2.3"));
        assert!(!name_matches("10.0.0.0/8", "example.org"));
        assert!(!name_matches("a b", "a b"));
    }

    fn rules(allow: &[&str], deny_private: bool) -> Egress {
        Egress::Rules(EgressRules {
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny_private,
        })
    }

    #[test]
    fn the_three_forms_parse_from_json() {
        let open: Egress = serde_json::from_str(r#""open""#).unwrap();
        assert_eq!(open, Egress::Mode(EgressMode::Open));
        let none: Egress = serde_json::from_str(r#""none""#).unwrap();
        assert_eq!(none, Egress::Mode(EgressMode::None));
        let r: Egress = serde_json::from_str(r#"{"allow": ["github.com"]}"#).unwrap();
        assert_eq!(r, rules(&["github.com"], true));
        assert!(serde_json::from_str::<Egress>(r#""closed""#).is_err());
        assert!(serde_json::from_str::<Egress>(r#"{"allow": [], "deny": []}"#).is_err());
    }

    #[test]
    fn names_match_exactly_or_below_a_wildcard() {
        let p = rules(&["GitHub.com.", "*.pypi.org"], true);
        assert_eq!(host_verdict(&p, "github.com"), HostVerdict::Resolve);
        assert_eq!(host_verdict(&p, "GITHUB.COM."), HostVerdict::Resolve);
        assert_eq!(host_verdict(&p, "files.pypi.org"), HostVerdict::Resolve);
        assert_eq!(host_verdict(&p, "a.b.pypi.org"), HostVerdict::Resolve);
        let no = HostVerdict::Deny(Denial::NotAllowed);
        assert_eq!(host_verdict(&p, "pypi.org"), no);
        assert_eq!(host_verdict(&p, "evilpypi.org"), no);
        assert_eq!(host_verdict(&p, "api.github.com"), no);
        assert_eq!(host_verdict(&p, "github.com.evil.net"), no);
    }

    #[test]
    fn addresses_need_an_address_entry() {
        let p = rules(&["github.com", "203.0.113.0/24", "10.1.2.3"], true);
        let lit = HostVerdict::Deny(Denial::IpLiteral);
        assert_eq!(host_verdict(&p, "198.51.100.7"), lit);
        assert_eq!(host_verdict(&p, "127.0.0.1"), lit);
        assert_eq!(host_verdict(&p, "[::1]"), lit);
        let ip = "203.0.113.9".parse().unwrap();
        assert_eq!(host_verdict(&p, "203.0.113.9"), HostVerdict::Connect(ip));
        let ip = "10.1.2.3".parse().unwrap();
        assert_eq!(host_verdict(&p, "10.1.2.3"), HostVerdict::Connect(ip));
        assert_eq!(host_verdict(&p, "10.1.2.4"), lit);
    }

    #[test]
    fn private_addresses_are_refused_unless_an_entry_covers_them() {
        let p = rules(&["github.com", "172.18.0.0/16"], true);
        for a in [
            "127.0.0.1",
            "10.0.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
        ] {
            let ip: IpAddr = a.parse().unwrap();
            assert_eq!(address_allowed(&p, ip), Err(Denial::PrivateAddress), "{a}");
        }
        assert_eq!(address_allowed(&p, "172.18.3.4".parse().unwrap()), Ok(()));
        assert_eq!(address_allowed(&p, "140.82.121.4".parse().unwrap()), Ok(()));
        assert_eq!(address_allowed(&p, "2606:4700::1".parse().unwrap()), Ok(()));
        let lax = rules(&["github.com"], false);
        assert_eq!(address_allowed(&lax, "10.0.0.1".parse().unwrap()), Ok(()));
    }

    #[test]
    fn open_and_none() {
        let open = Egress::Mode(EgressMode::Open);
        assert_eq!(
            host_verdict(&open, "anything.example"),
            HostVerdict::Resolve
        );
        assert_eq!(address_allowed(&open, "10.0.0.1".parse().unwrap()), Ok(()));
        let none = Egress::Mode(EgressMode::None);
        let no = HostVerdict::Deny(Denial::NoEgress);
        assert_eq!(host_verdict(&none, "github.com"), no);
        assert_eq!(host_verdict(&none, "1.1.1.1"), no);
    }

    #[test]
    fn bad_entries_are_named() {
        for bad in [
            "",
            "*.",
            "a..b",
            "10.0.0.0/33",
            "exa mple.com",
            "http://x.com",
        ] {
            let e = validate(&rules(&[bad], true)).unwrap_err();
            assert!(e.contains("egress allow entry"), "{bad}: {e}");
        }
        assert!(validate(&rules(&["*.pypi.org", "::1/128", "[::1]"], true)).is_ok());
    }
}
