//! The SSRF guard for every URL patterd calls on a tool's behalf (consult, webhook tools): only
//! `http`/`https`; never loopback, private, link-local, CGNAT, multicast, unspecified, reserved
//! or documentation addresses, nor cloud metadata hosts — whatever the spelling (the URL is
//! parsed the WHATWG way, so decimal `2130706433`, octal `0177.0.0.1`, hex `0x7f.1` and
//! short-form `127.1` all become `127.0.0.1`; IPv4-mapped, -compatible, -translated (SIIT,
//! `::ffff:0:a.b.c.d`), NAT64 and 6to4 IPv6 addresses are judged by the IPv4 address inside;
//! the discard-only `100::/64` is refused). A literal address is checked up front; a
//! name is checked on the addresses it resolves to, inside the HTTP client's resolver, so the
//! addresses checked are the ones connected to (no DNS-rebinding window). The client follows
//! no redirects and uses no proxy. `allow_loopback` relaxes loopback and private ranges only,
//! and only for the client (the URL) it is set on.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use url::{Host, Url};

/// Host names of cloud metadata services, refused whatever they resolve to.
const METADATA_HOSTS: &[&str] = &[
    "metadata",
    "metadata.google.internal",
    "metadata.goog",
    "metadata.azure.internal",
    "instance-data",
    "instance-data.ec2.internal",
];

/// Why a URL or an address is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SsrfError {
    #[error("`{0}` is not a valid URL")]
    Invalid(String),
    #[error("only http and https URLs are allowed, not `{0}:`")]
    Scheme(String),
    #[error("the URL has no host")]
    NoHost,
    #[error("`{0}` is a cloud metadata host and is never called")]
    Metadata(String),
    #[error(
        "{addr} is a {why} address and is not called on a tool's behalf{hint}",
        hint = if *relaxable { " (set allow_loopback = true for a service on this machine or network)" } else { "" }
    )]
    Address {
        addr: IpAddr,
        why: &'static str,
        relaxable: bool,
    },
    #[error("`{0}` resolves to no allowed address")]
    NoAddress(String),
}

/// What kind of address `ip` is, if it is refused: `(why, relaxable by allow_loopback)`.
fn classify(ip: IpAddr) -> Option<(&'static str, bool)> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<(&'static str, bool)> {
    let o = ip.octets();
    let r = match o {
        [127, ..] => ("loopback", true),
        [10, ..] | [192, 168, ..] => ("private", true),
        [172, b, ..] if (16..32).contains(&b) => ("private", true),
        [0, ..] => ("unspecified", false),
        [169, 254, ..] => ("link-local", false),
        [100, b, ..] if (64..128).contains(&b) => ("shared (CGNAT)", false),
        [a, ..] if (224..240).contains(&a) => ("multicast", false),
        [a, ..] if a >= 240 => ("reserved", false),
        [192, 0, 0, _] | [198, 18 | 19, ..] => ("reserved", false),
        [192, 0, 2, _] | [198, 51, 100, _] | [203, 0, 113, _] => ("documentation", false),
        _ => return None,
    };
    Some(r)
}

fn classify_v6(ip: Ipv6Addr) -> Option<(&'static str, bool)> {
    let s = ip.segments();
    if ip.is_unspecified() {
        return Some(("unspecified", false));
    }
    if ip.is_loopback() {
        return Some(("loopback", true));
    }
    // IPv4 inside IPv6: mapped (::ffff:a.b.c.d), compatible (::a.b.c.d), NAT64 (64:ff9b::/96).
    if let Some(v4) = ip.to_ipv4_mapped() {
        return classify_v4(v4).or(None);
    }
    let embedded =
        |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    if s[..6] == [0; 6] {
        return classify_v4(embedded(s[6], s[7])).or(Some(("IPv4-compatible", false)));
    }
    // IPv4-translated (SIIT, ::ffff:0:a.b.c.d).
    if s[..6] == [0, 0, 0, 0, 0xffff, 0] {
        return classify_v4(embedded(s[6], s[7]));
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return classify_v4(embedded(s[6], s[7]));
    }
    if s[0] == 0x64 && s[1] == 0xff9b {
        return Some(("NAT64 local-use", false));
    }
    if s[0] == 0x2002 {
        // 6to4: the IPv4 address is in segments 1 and 2.
        return classify_v4(embedded(s[1], s[2]));
    }
    match s[0] {
        0x100 if s[1..4] == [0, 0, 0] => Some(("discard-only", false)),
        0x2001 if s[1] == 0 => Some(("Teredo", false)),
        0x2001 if s[1] == 0xdb8 => Some(("documentation", false)),
        x if x & 0xfe00 == 0xfc00 => Some(("private (unique local)", true)),
        x if x & 0xffc0 == 0xfe80 => Some(("link-local", false)),
        x if x & 0xffc0 == 0xfec0 => Some(("site-local", false)),
        x if x & 0xff00 == 0xff00 => Some(("multicast", false)),
        _ => None,
    }
}

/// Refuses `ip` unless it is a public address (or loopback/private with `allow_loopback`).
pub(crate) fn check_ip(ip: IpAddr, allow_loopback: bool) -> Result<(), SsrfError> {
    match classify(ip) {
        Some((_, true)) if allow_loopback => Ok(()),
        Some((why, relaxable)) => Err(SsrfError::Address {
            addr: ip,
            why,
            relaxable,
        }),
        None => Ok(()),
    }
}

/// Parses and checks `url`: scheme, metadata names and a literal address. A name's addresses
/// are checked when the guarded client resolves it.
pub(crate) fn check_url(url: &str, allow_loopback: bool) -> Result<Url, SsrfError> {
    let parsed = Url::parse(url.trim()).map_err(|_| SsrfError::Invalid(url.to_string()))?;
    match parsed.scheme() {
        "http" | "https" => {}
        other => return Err(SsrfError::Scheme(other.to_string())),
    }
    match parsed.host() {
        None => return Err(SsrfError::NoHost),
        Some(Host::Ipv4(v4)) => check_ip(IpAddr::V4(v4), allow_loopback)?,
        Some(Host::Ipv6(v6)) => check_ip(IpAddr::V6(v6), allow_loopback)?,
        Some(Host::Domain(d)) => check_name(d)?,
    }
    Ok(parsed)
}

fn check_name(name: &str) -> Result<(), SsrfError> {
    let n = name.trim_end_matches('.').to_ascii_lowercase();
    if METADATA_HOSTS.contains(&n.as_str()) {
        return Err(SsrfError::Metadata(name.to_string()));
    }
    Ok(())
}

/// A resolver that keeps only allowed addresses (reqwest calls it at connect time).
#[derive(Debug, Clone, Copy)]
pub(crate) struct GuardedResolver {
    pub allow_loopback: bool,
}

impl GuardedResolver {
    /// The allowed addresses `host` resolves to; an error when there are none.
    pub(crate) async fn lookup(&self, host: &str) -> Result<Vec<SocketAddr>, SsrfError> {
        check_name(host)?;
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, 0))
            .await
            .map_err(|_| SsrfError::NoAddress(host.to_string()))?
            .collect();
        let mut first_refusal = None;
        let allowed: Vec<SocketAddr> = addrs
            .into_iter()
            .filter(|a| match check_ip(a.ip(), self.allow_loopback) {
                Ok(()) => true,
                Err(e) => {
                    first_refusal.get_or_insert(e);
                    false
                }
            })
            .collect();
        if allowed.is_empty() {
            return Err(first_refusal.unwrap_or(SsrfError::NoAddress(host.to_string())));
        }
        Ok(allowed)
    }
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let this = *self;
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs = this.lookup(&host).await.map_err(|e| {
                tracing::warn!(error = %e, "a tool's URL was refused at connect time");
                Box::new(e) as Box<dyn std::error::Error + Send + Sync>
            })?;
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// An HTTP client for one tool URL: the guarded resolver, no redirects, no proxy, `timeout`
/// for the whole request.
pub(crate) fn client(
    allow_loopback: bool,
    timeout: Duration,
) -> Result<reqwest::Client, reqwest::Error> {
    crate::util::init_tls();
    reqwest::Client::builder()
        .dns_resolver(Arc::new(GuardedResolver { allow_loopback }))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(10)))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (url, allow_loopback, allowed?)
    const TABLE: &[(&str, bool, bool)] = &[
        ("https://api.example.com/x", false, true),
        ("http://93.184.216.34/", false, true),
        ("ftp://example.com/", false, false),
        ("file:///etc/passwd", false, false),
        ("gopher://127.0.0.1/", true, false),
        ("http://127.0.0.1/", false, false),
        ("http://127.0.0.1:8080/", true, true),
        ("http://127.1/", false, false),
        ("http://0177.0.0.1/", false, false),
        ("http://0x7f.0.0.1/", false, false),
        ("http://0x7f000001/", false, false),
        ("http://2130706433/", false, false),
        ("http://017700000001/", false, false),
        ("http://0/", false, false),
        ("http://0.0.0.0/", true, false),
        ("http://[::1]/", false, false),
        ("http://[::1]/", true, true),
        ("http://[::]/", true, false),
        ("http://[::ffff:127.0.0.1]/", false, false),
        ("http://[::ffff:7f00:1]/", false, false),
        ("http://[::ffff:169.254.169.254]/", true, false),
        ("http://[::127.0.0.1]/", false, false),
        ("http://[::ffff:0:127.0.0.1]/", false, false),
        ("http://[::ffff:0:a9fe:a9fe]/", true, false),
        ("http://[::ffff:0:10.0.0.1]/", false, false),
        ("http://[100::1]/", true, false),
        ("http://[100::ffff:ffff:ffff:ffff]/", true, false),
        ("http://[100:0:0:1::1]/", false, true),
        ("http://[64:ff9b::7f00:1]/", false, false),
        ("http://[64:ff9b::a9fe:a9fe]/", true, false),
        ("http://[2002:7f00:1::]/", false, false),
        ("http://[2002:5db8:d822::]/", false, true),
        ("http://[fd00::1]/", false, false),
        ("http://[fd00::1]/", true, true),
        ("http://[fe80::1]/", true, false),
        ("http://[ff02::1]/", false, false),
        ("http://[2001:db8::1]/", false, false),
        ("http://[2606:4700::1111]/", false, true),
        ("http://10.0.0.1/", false, false),
        ("http://10.0.0.1/", true, true),
        ("http://172.16.5.4/", false, false),
        ("http://172.32.0.1/", false, true),
        ("http://192.168.1.1/", false, false),
        ("http://169.254.169.254/latest/meta-data/", false, false),
        ("http://169.254.169.254/latest/meta-data/", true, false),
        ("http://0xa9fea9fe/", false, false),
        ("http://2852039166/", true, false),
        ("http://100.64.0.1/", false, false),
        ("http://100.100.100.200/", true, false),
        ("http://100.128.0.1/", false, true),
        ("http://224.0.0.1/", false, false),
        ("http://255.255.255.255/", true, false),
        (
            "http://metadata.google.internal/computeMetadata/v1/",
            true,
            false,
        ),
        ("http://METADATA.GOOGLE.INTERNAL./", true, false),
        ("http://instance-data/", true, false),
        ("http://user:pw@127.0.0.1/", false, false),
        ("not a url", false, false),
    ];

    #[test]
    fn spellings_table() {
        assert!(TABLE.len() >= 25);
        for &(url, allow, ok) in TABLE {
            let got = check_url(url, allow);
            assert_eq!(got.is_ok(), ok, "{url} (allow_loopback={allow}): {got:?}");
        }
    }

    #[test]
    fn errors_say_what_to_do() {
        let e = check_url("http://127.0.0.1/", false).unwrap_err();
        assert!(e.to_string().contains("allow_loopback"), "{e}");
        let e = check_url("http://169.254.169.254/", true).unwrap_err();
        assert!(!e.to_string().contains("allow_loopback"), "{e}");
    }

    #[tokio::test]
    async fn a_name_resolving_to_loopback_is_refused_at_connect_time() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                    )
                    .await;
            }
        });
        let url = format!("http://localhost:{port}/");
        // The name passes the up-front check; its addresses do not.
        assert!(check_url(&url, false).is_ok());
        let refused = GuardedResolver {
            allow_loopback: false,
        }
        .lookup("localhost")
        .await;
        assert!(
            matches!(
                refused,
                Err(SsrfError::Address {
                    relaxable: true,
                    ..
                })
            ),
            "{refused:?}"
        );
        let strict = client(false, Duration::from_secs(5)).unwrap();
        let err = strict.get(&url).send().await.expect_err("refused");
        assert!(err.is_connect(), "{err:?}");
        let relaxed = client(true, Duration::from_secs(5)).unwrap();
        let body = relaxed
            .get(&url)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(body, "ok");
    }
}
