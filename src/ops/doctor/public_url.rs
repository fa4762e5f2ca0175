//! Doctor's `public_url` check: the URL parses as http(s) with a host, the host resolves,
//! and `GET {public_url}/healthz?nonce=N` comes back with `X-Patterd-Nonce: N` (so a patterd
//! answered, not a proxy's default page) and the same `X-Patterd-Instance` as the daemon on
//! `server.listen` (so it is this daemon).

use super::Finding;
use crate::carrier::registry::BoxFuture;
use crate::carrier::webhook::public_request_url;
use crate::config::Config;

/// The headers `/healthz` echoes (see `server::health`).
pub(crate) const NONCE_HEADER: &str = "x-patterd-nonce";
pub(crate) const INSTANCE_HEADER: &str = "x-patterd-instance";

pub(super) fn check(config: &Config, client: &reqwest::Client) -> BoxFuture<Vec<Finding>> {
    let public = config.server.public_url.trim().to_string();
    let listen = config.server.listen.trim().to_string();
    let tls = config.server.tls.is_some();
    let client = client.clone();
    Box::pin(async move { vec![check_url(&public, &listen, tls, &client).await] })
}

fn nonce() -> String {
    use ring::rand::{SecureRandom, SystemRandom};
    let mut b = [0u8; 16];
    if SystemRandom::new().fill(&mut b).is_err() {
        b = crate::store::now_ms()
            .to_le_bytes()
            .repeat(2)
            .try_into()
            .unwrap_or([7; 16]);
    }
    hex::encode(b)
}

/// The local base URL of the listener (`0.0.0.0` / `[::]` → loopback).
fn local_base(listen: &str, tls: bool) -> String {
    let listen = listen
        .replace("0.0.0.0:", "127.0.0.1:")
        .replace("[::]:", "[::1]:");
    format!("{}://{listen}", if tls { "https" } else { "http" })
}

async fn check_url(public: &str, listen: &str, tls: bool, client: &reqwest::Client) -> Finding {
    let url = public.to_string();
    let parsed = match url::Url::parse(public) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => u,
        // The config's validation refuses such URLs; kept for a config built in code.
        Ok(_) => {
            return Finding::PublicUrlUnreachable {
                url,
                error: "it is not an http(s) URL with a host".into(),
            };
        }
        Err(e) => {
            return Finding::PublicUrlUnreachable {
                url,
                error: e.to_string(),
            };
        }
    };
    let host = parsed
        .host_str()
        .unwrap_or_default()
        .trim_matches(['[', ']'])
        .to_string();
    let port = parsed.port_or_known_default().unwrap_or(443);
    match tokio::net::lookup_host((host.as_str(), port))
        .await
        .map(|mut a| a.next())
    {
        Ok(Some(_)) => {}
        Ok(None) => {
            return Finding::PublicUrlUnresolved {
                url,
                error: "no addresses".into(),
            };
        }
        Err(e) => {
            return Finding::PublicUrlUnresolved {
                url,
                error: e.to_string(),
            };
        }
    }
    let n = nonce();
    let health = public_request_url(public, "/healthz", Some(&format!("nonce={n}")));
    let resp = match client.get(&health).send().await {
        Ok(r) => r,
        Err(e) => {
            return Finding::PublicUrlUnreachable {
                url,
                error: crate::carrier::chain(&e),
            };
        }
    };
    let header = |r: &reqwest::Response, name: &str| {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    if header(&resp, NONCE_HEADER).as_deref() != Some(n.as_str()) {
        return Finding::PublicUrlNotPatterd {
            url,
            status: resp.status().as_u16(),
        };
    }
    let remote = header(&resp, INSTANCE_HEADER);
    let local_url = format!("{}/healthz", local_base(listen, tls));
    let local = match client.get(&local_url).send().await {
        Ok(r) => header(&r, INSTANCE_HEADER),
        Err(_) => None,
    };
    match (remote, local) {
        (Some(a), Some(b)) if a == b => Finding::PublicUrlReachesDaemon { url },
        (_, None) => Finding::PublicUrlUnconfirmed {
            url,
            listen: listen.to_string(),
        },
        _ => Finding::PublicUrlOtherDaemon { url },
    }
}
