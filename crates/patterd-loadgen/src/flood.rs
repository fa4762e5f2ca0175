//! Floods for the robustness figures: hostile traffic sent to the server under test
//! (127.0.0.1 only) while the live calls talk, one flood after another. Every flood is
//! bounded in count and in time ([`BOUND`] per connection) and stops by itself; each
//! request's outcome is counted.
//!
//! - forged Twilio voice webhooks (bad `X-Twilio-Signature`) → expected 403;
//! - idle unauthenticated media WebSockets (upgrade, then nothing) → expected refused (503
//!   past the media-socket bound) or closed by the server at the 5 s `start` deadline;
//! - oversized and fragmented media frames (one 100 KiB frame, one 2 MiB frame, 20 × 8 KiB
//!   continuation fragments; a third each) → expected closed;
//! - slowloris: half send headers one byte a second, half a body one byte a second →
//!   expected timed out (header timeout, body timeout).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::time::{Instant, timeout};

use crate::report::Quantiles;

/// No flood connection lives longer than this.
pub const BOUND: Duration = Duration::from_secs(20);

/// How many of each flood to send.
#[derive(Debug, Clone, Default)]
pub struct FloodPlan {
    pub webhooks: usize,
    pub idle_ws: usize,
    pub oversized: usize,
    pub slowloris: usize,
}

impl FloodPlan {
    pub fn any(&self) -> bool {
        self.webhooks + self.idle_ws + self.oversized + self.slowloris > 0
    }
}

/// One flood's counts: outcome → how many, and time from connect to the server's refusal.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FloodStats {
    pub kind: String,
    pub sent: usize,
    pub outcomes: BTreeMap<String, usize>,
    /// Connect → refusal (status line, close or EOF), ms.
    pub refused_after_ms: Quantiles,
    /// First request sent → last outcome, ms.
    pub wall_ms: f64,
}

/// What became of one hostile request (the server's answer, a close, or nothing within the
/// bound) and how long after it was sent.
#[derive(Debug)]
struct RequestFate {
    what: String,
    after: Duration,
}

async fn read_head(s: &mut TcpStream) -> Option<(u16, Vec<u8>)> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end]).ok()?;
            let code = head.split_whitespace().nth(1)?.parse().ok()?;
            return Some((code, buf[end + 4..].to_vec()));
        }
        if buf.len() > 64 * 1024 {
            return None;
        }
    }
}

/// Reads until the server closes (EOF, reset, or a close frame's opcode in the first byte
/// of what it sends). Returns true if it closed within the bound.
async fn wait_closed(s: &mut TcpStream, left: Duration) -> bool {
    let mut chunk = [0u8; 4096];
    timeout(left, async {
        loop {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) if chunk[..n].first().is_some_and(|b| b & 0x0f == 0x8) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// When the server closed a media socket, relative to its 5 s `start` deadline.
fn closed_when(after_connect: Duration) -> String {
    let s = after_connect.as_secs_f64();
    if s < 4.5 {
        "closed by the server at once".into()
    } else if s < 6.5 {
        "closed by the server at the 5 s start deadline".into()
    } else {
        format!("closed by the server after {s:.0} s")
    }
}

/// A masked client frame.
fn ws_frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(payload.len() + 14);
    f.push(if fin { 0x80 } else { 0 } | opcode);
    let len = payload.len();
    if len < 126 {
        f.push(0x80 | len as u8);
    } else if len <= 0xffff {
        f.push(0x80 | 126);
        f.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        f.push(0x80 | 127);
        f.extend_from_slice(&(len as u64).to_be_bytes());
    }
    let key = [0x1b, 0x2c, 0x3d, 0x4e];
    f.extend_from_slice(&key);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    f
}

fn upgrade_request(addr: SocketAddr) -> String {
    format!(
        "GET /twilio/media HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: Zmxvb2QtZmxvb2QtZmxvb2Q=\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
}

async fn forged_webhook(addr: SocketAddr, i: usize) -> RequestFate {
    let t = Instant::now();
    let what = timeout(BOUND, async {
        let mut s = match TcpStream::connect(addr).await {
            Ok(s) => s,
            Err(e) => return format!("connect error: {}", e.kind()),
        };
        let body = format!(
            "AccountSid={}&CallSid=CAf1{i:030}&From=%2B1555{i:07}&To=%2B15550001234&CallStatus=ringing&Direction=inbound",
            crate::ACCOUNT_SID
        );
        let req = format!(
            "POST /twilio/voice HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
             X-Twilio-Signature: Zm9yZ2VkLXNpZ25hdHVyZS1mb3JnZWQtc2ln\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        if s.write_all(req.as_bytes()).await.is_err() {
            return "write error".into();
        }
        match read_head(&mut s).await {
            Some((code, _)) => code.to_string(),
            None => "closed without an answer".into(),
        }
    })
    .await
    .unwrap_or_else(|_| "no answer within the bound".into());
    RequestFate {
        what,
        after: t.elapsed(),
    }
}

async fn upgraded(addr: SocketAddr) -> Result<TcpStream, String> {
    let mut s = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect error: {}", e.kind()))?;
    s.write_all(upgrade_request(addr).as_bytes())
        .await
        .map_err(|_| "write error".to_string())?;
    match read_head(&mut s).await {
        Some((101, _)) => Ok(s),
        Some((code, _)) => Err(format!("upgrade refused {code}")),
        None => Err("closed before upgrade".into()),
    }
}

async fn idle_ws(addr: SocketAddr) -> RequestFate {
    let t = Instant::now();
    let what = match timeout(BOUND, upgraded(addr)).await {
        Err(_) => "no upgrade answer within the bound".into(),
        Ok(Err(e)) => e,
        Ok(Ok(mut s)) => {
            if wait_closed(&mut s, BOUND.saturating_sub(t.elapsed())).await {
                format!("upgraded, {}", closed_when(t.elapsed()))
            } else {
                "upgraded, still open at the bound".into()
            }
        }
    };
    RequestFate {
        what,
        after: t.elapsed(),
    }
}

async fn oversized(addr: SocketAddr, i: usize) -> RequestFate {
    let t = Instant::now();
    let kind = ["100 KiB frame", "2 MiB frame", "20 × 8 KiB fragments"][i % 3];
    let what = match timeout(BOUND, upgraded(addr)).await {
        Err(_) => "no upgrade answer within the bound".into(),
        Ok(Err(e)) => e,
        Ok(Ok(mut s)) => {
            let bytes = match i % 3 {
                0 => ws_frame(true, 0x1, &vec![b'a'; 100 * 1024]),
                1 => ws_frame(true, 0x1, &vec![b'a'; 2 * 1024 * 1024]),
                _ => {
                    let piece = vec![b'a'; 8 * 1024];
                    let mut v = ws_frame(false, 0x1, &piece);
                    for k in 1..20 {
                        v.extend(ws_frame(k == 19, 0x0, &piece));
                    }
                    v
                }
            };
            // A write error means the server closed while we were still sending: refused.
            let _ = timeout(BOUND, s.write_all(&bytes)).await;
            if wait_closed(&mut s, BOUND.saturating_sub(t.elapsed())).await {
                format!("{kind}: {}", closed_when(t.elapsed()))
            } else {
                format!("{kind}: still open at the bound")
            }
        }
    };
    RequestFate {
        what,
        after: t.elapsed(),
    }
}

async fn slowloris(addr: SocketAddr, i: usize) -> RequestFate {
    let t = Instant::now();
    let body_mode = i % 2 == 1;
    let kind = if body_mode {
        "slow body"
    } else {
        "slow headers"
    };
    let what = timeout(BOUND, async {
        let mut s = match TcpStream::connect(addr).await {
            Ok(s) => s,
            Err(e) => return format!("connect error: {}", e.kind()),
        };
        let (first, drip): (String, &[u8]) = if body_mode {
            (
                format!(
                    "POST /twilio/voice HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
                     X-Twilio-Signature: Zm9yZ2Vk\r\nContent-Length: 4000\r\n\r\n"
                ),
                b"a",
            )
        } else {
            (format!("POST /twilio/voice HTTP/1.1\r\nHost: {addr}\r\n"), b"X")
        };
        if s.write_all(first.as_bytes()).await.is_err() {
            return format!("{kind}: closed by the server");
        }
        let (mut rd, mut wr) = s.into_split();
        let dripper = async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if wr.write_all(drip).await.is_err() {
                    return;
                }
            }
        };
        let reader = async move {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 1024];
            loop {
                match rd.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let code = std::str::from_utf8(&buf)
                .ok()
                .and_then(|h| h.split_whitespace().nth(1).map(str::to_string));
            match code {
                Some(c) => format!("{kind}: {c}, closed by the server"),
                None => format!("{kind}: closed by the server"),
            }
        };
        tokio::select! {
            r = reader => r,
            _ = dripper => format!("{kind}: closed by the server (write failed)"),
        }
    })
    .await
    .unwrap_or_else(|_| format!("{kind}: still open at the bound"));
    RequestFate {
        what,
        after: t.elapsed(),
    }
}

async fn collect<F, Fut>(
    kind: &str,
    n: usize,
    in_flight: usize,
    addr: SocketAddr,
    f: F,
) -> FloodStats
where
    F: Fn(SocketAddr, usize) -> Fut,
    Fut: std::future::Future<Output = RequestFate> + Send + 'static,
{
    let t = Instant::now();
    let sem = Arc::new(Semaphore::new(in_flight.max(1)));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let Ok(permit) = sem.clone().acquire_owned().await else {
            break;
        };
        let fut = f(addr, i);
        set.spawn(async move {
            let o = fut.await;
            drop(permit);
            o
        });
    }
    let mut stats = FloodStats {
        kind: kind.into(),
        sent: n,
        ..Default::default()
    };
    let mut after = Vec::with_capacity(n);
    while let Some(o) = set.join_next().await {
        let o = o.unwrap_or(RequestFate {
            what: "task failed".into(),
            after: Duration::ZERO,
        });
        after.push(o.after.as_secs_f64() * 1000.0);
        *stats.outcomes.entry(o.what).or_default() += 1;
    }
    stats.refused_after_ms = Quantiles::of(after);
    stats.wall_ms = t.elapsed().as_secs_f64() * 1000.0;
    stats
}

/// Runs the floods of `plan` one after another against `addr` (forged webhooks, oversized
/// frames, idle WebSockets, slowloris: the idle sockets would otherwise take the media-socket
/// places the oversized frames need); returns when the last has finished (each connection
/// lasts at most [`BOUND`]).
pub async fn run(addr: SocketAddr, plan: FloodPlan) -> Vec<FloodStats> {
    let mut out = Vec::new();
    if plan.webhooks > 0 {
        out.push(
            collect(
                "forged Twilio webhooks",
                plan.webhooks,
                64,
                addr,
                forged_webhook,
            )
            .await,
        );
    }
    if plan.oversized > 0 {
        out.push(
            collect(
                "oversized / fragmented media frames",
                plan.oversized,
                90,
                addr,
                oversized,
            )
            .await,
        );
    }
    if plan.idle_ws > 0 {
        out.push(
            collect(
                "idle unauthenticated media WebSockets",
                plan.idle_ws,
                plan.idle_ws,
                addr,
                |a, _| idle_ws(a),
            )
            .await,
        );
    }
    if plan.slowloris > 0 {
        out.push(
            collect(
                "slowloris headers / bodies",
                plan.slowloris,
                plan.slowloris,
                addr,
                slowloris,
            )
            .await,
        );
    }
    out
}

/// The floods as a markdown table.
pub fn markdown(stats: &[FloodStats]) -> String {
    let mut s = String::from(
        "| flood | sent | outcomes | connect → refusal p50 / p99 / max ms | wall s |\n|---|---:|---|---:|---:|\n",
    );
    for f in stats {
        let outcomes: Vec<String> = f
            .outcomes
            .iter()
            .map(|(k, v)| format!("{v} × {k}"))
            .collect();
        let q = &f.refused_after_ms;
        s.push_str(&format!(
            "| {} | {} | {} | {:.0} / {:.0} / {:.0} | {:.1} |\n",
            f.kind,
            f.sent,
            outcomes.join("; "),
            q.p50,
            q.p99,
            q.max,
            f.wall_ms / 1000.0
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unmask(f: &[u8], header: usize) -> Vec<u8> {
        let key = &f[header - 4..header];
        f[header..]
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ key[i % 4])
            .collect()
    }

    #[test]
    fn frames_carry_their_length_and_a_mask() {
        let small = ws_frame(true, 0x1, b"hi");
        assert_eq!(&small[..2], &[0x81, 0x82]);
        assert_eq!(unmask(&small, 6), b"hi");
        let mid = ws_frame(false, 0x0, &[7; 8 * 1024]);
        assert_eq!(mid[0], 0x00);
        assert_eq!(mid[1], 0x80 | 126);
        assert_eq!(u16::from_be_bytes([mid[2], mid[3]]), 8 * 1024);
        assert_eq!(unmask(&mid, 8), vec![7; 8 * 1024]);
        let big = ws_frame(true, 0x1, &[1; 100 * 1024]);
        assert_eq!(big[1], 0x80 | 127);
        assert_eq!(
            u64::from_be_bytes(big[2..10].try_into().unwrap()),
            100 * 1024
        );
        assert_eq!(big.len(), 14 + 100 * 1024);
    }

    #[test]
    fn closes_are_placed_against_the_start_deadline() {
        assert!(closed_when(Duration::from_millis(30)).contains("at once"));
        assert!(closed_when(Duration::from_millis(5020)).contains("5 s start deadline"));
        assert!(closed_when(Duration::from_secs(12)).contains("after 12 s"));
    }
}
