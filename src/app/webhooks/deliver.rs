//! One delivery attempt and what follows it: the request (the exact stored body, the Standard
//! Webhooks headers signed with the entry's current secret and a fresh `webhook-timestamp`,
//! through the SSRF-guarded client of the entry's `allow_loopback`, no redirects), the answer
//! judged (2xx delivered; 410 Gone dead at once; anything else, a timeout or a refused
//! connection retried) and the next attempt scheduled ([`schedule`]: exponential from
//! `retry_base_ms`, jittered between half and all of the step, at most `retry_max_ms`, never
//! sooner than the receiver's `Retry-After`, dead once `give_up_after_s` has passed).

use std::time::{Duration, SystemTime};

use crate::config::{Config, WebhookDeliveryConfig};
use crate::net::{ssrf, webhook_sign};
use crate::store::{OutboxRow, Settle, now_ms};

/// The HTTP clients of the outbox: one per `allow_loopback` setting (the SSRF guard lives in
/// the client's resolver), sharing nothing else.
pub(super) struct Clients {
    guarded: reqwest::Client,
    loopback: reqwest::Client,
}

impl Clients {
    pub(super) fn new(timeout: Duration) -> Result<Self, reqwest::Error> {
        Ok(Self {
            guarded: ssrf::client(false, timeout)?,
            loopback: ssrf::client(true, timeout)?,
        })
    }

    fn get(&self, allow_loopback: bool) -> &reqwest::Client {
        if allow_loopback {
            &self.loopback
        } else {
            &self.guarded
        }
    }
}

/// How an attempt went, before the schedule decides what follows.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Outcome {
    Delivered(u16),
    /// Not worth another attempt.
    Refused {
        status: Option<u16>,
        why: String,
    },
    /// Worth another attempt; `retry_after` is the receiver's `Retry-After`.
    Failed {
        status: Option<u16>,
        why: String,
        retry_after: Option<Duration>,
    },
}

/// The receiver's host, for logs (a URL's path or query may carry a token).
pub(super) fn host_of(url: &str) -> String {
    url::Url::parse(url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// `Retry-After`: seconds, or an HTTP date.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let v = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(s) = v.parse::<u64>() {
        return Some(Duration::from_secs(s));
    }
    httpdate::parse_http_date(v)
        .ok()?
        .duration_since(SystemTime::now())
        .ok()
}

/// Sends `row` once to its `[[webhooks]]` entry in `config`.
pub(super) async fn attempt(config: &Config, clients: &Clients, row: &OutboxRow) -> Outcome {
    let Some(hook) = config.webhooks.iter().find(|w| w.url.trim() == row.url) else {
        return Outcome::Refused {
            status: None,
            why: "no [[webhooks]] entry has this url any more".into(),
        };
    };
    if let Err(e) = ssrf::check_url(&row.url, hook.allow_loopback) {
        return Outcome::Refused {
            status: None,
            why: format!("the url is refused: {e}"),
        };
    }
    let mut keys = Vec::with_capacity(2);
    for secret in std::iter::once(&hook.secret).chain(hook.previous_secret.as_ref()) {
        match webhook_sign::key(secret.expose()) {
            Ok(k) => keys.push(k),
            Err(e) => {
                return Outcome::Refused {
                    status: None,
                    why: format!("its secret {e}"),
                };
            }
        }
    }
    let timestamp = now_ms().div_euclid(1000);
    let signature = webhook_sign::header(&keys, &row.id, timestamp, row.body.as_bytes());
    let req = clients
        .get(hook.allow_loopback)
        .post(&row.url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(
            reqwest::header::USER_AGENT,
            concat!("patterd/", env!("CARGO_PKG_VERSION")),
        )
        .header("webhook-id", &row.id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(row.body.clone());
    // With tracing on, the receiver's trace joins the call's (its id follows from the call id).
    let trace = (config.telemetry.enabled() && !row.call_id.is_empty())
        .then(|| crate::util::traceparent::TraceParent::for_call(&row.call_id));
    let req = crate::net::http::with_traceparent(req, trace.as_ref());
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => {
            let why = if e.is_timeout() {
                "it timed out".to_string()
            } else if e.is_connect() {
                format!("it could not be reached ({e})")
            } else {
                format!("the request failed ({e})")
            };
            return Outcome::Failed {
                status: None,
                why,
                retry_after: None,
            };
        }
    };
    let status = resp.status().as_u16();
    let after = retry_after(resp.headers());
    // The answer's body is not read: nothing in it changes the outcome.
    drop(resp);
    match status {
        200..=299 => Outcome::Delivered(status),
        410 => Outcome::Refused {
            status: Some(status),
            why: "it answered 410 Gone (it wants no more webhooks)".into(),
        },
        _ => Outcome::Failed {
            status: Some(status),
            why: format!("it answered HTTP {status}"),
            retry_after: after,
        },
    }
}

/// The wait before the attempt after `failures` failed ones (1 = the first failed): the
/// exponential step, jittered by `rand` between half and all of it, at least `retry_after`.
/// `None` when the next attempt would fall after the give-up time (`left_ms` from now).
pub(super) fn schedule(
    cfg: &WebhookDeliveryConfig,
    failures: u32,
    retry_after: Option<Duration>,
    left_ms: i64,
    rand: u64,
) -> Option<u64> {
    let shift = failures.saturating_sub(1).min(40);
    let step = cfg
        .retry_base_ms
        .saturating_mul(1u64 << shift)
        .min(cfg.retry_max_ms)
        .max(1);
    let half = step / 2;
    let jittered = half + rand % (step - half + 1);
    let wait = jittered.max(retry_after.map_or(0, |d| d.as_millis() as u64));
    (i64::try_from(wait).ok()? < left_ms).then_some(wait)
}

/// What to record for `row` after `outcome`, with `rand` for the jitter.
pub(super) fn settle(
    cfg: &WebhookDeliveryConfig,
    row: &OutboxRow,
    outcome: Outcome,
    now: i64,
    rand: u64,
) -> Settle {
    match outcome {
        Outcome::Delivered(status) => Settle::Delivered { status },
        Outcome::Refused { status, why } => Settle::Dead {
            status,
            attempted: status.is_some(),
            error: why,
        },
        Outcome::Failed {
            status,
            why,
            retry_after,
        } => {
            let failures = u32::try_from(row.attempts.saturating_add(1)).unwrap_or(u32::MAX);
            let give_up_at = row.window_start.saturating_add(
                i64::try_from(cfg.give_up_after_s.saturating_mul(1000)).unwrap_or(i64::MAX),
            );
            match schedule(cfg, failures, retry_after, give_up_at - now, rand) {
                Some(delay_ms) => Settle::Retry {
                    status,
                    error: why,
                    delay_ms,
                },
                None => Settle::Dead {
                    status,
                    attempted: true,
                    error: format!(
                        "given up after {failures} attempts over {} s; the last: {why}",
                        cfg.give_up_after_s
                    ),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> WebhookDeliveryConfig {
        WebhookDeliveryConfig::default()
    }

    #[test]
    fn the_default_schedule_doubles_from_five_seconds_to_an_hour() {
        let c = cfg();
        let day = 86_400_000;
        // rand = u64::MAX % (step/2 + 1) varies; the bounds hold for any rand.
        for (failures, step) in [
            (1u32, 5_000u64),
            (2, 10_000),
            (3, 20_000),
            (11, 3_600_000),
            (30, 3_600_000),
        ] {
            for rand in [0, 1, 7, 1 << 40, u64::MAX] {
                let w = schedule(&c, failures, None, day, rand).expect("within the day");
                assert!(
                    w >= step / 2 && w <= step,
                    "failures {failures}: {w} not in [{}, {step}]",
                    step / 2
                );
            }
        }
        assert_eq!(schedule(&c, 1, None, day, 0), Some(2_500));
        assert_eq!(schedule(&c, 1, None, day, 2_500), Some(5_000));
    }

    #[test]
    fn retry_after_is_honoured_and_the_window_closes() {
        let c = cfg();
        assert_eq!(
            schedule(&c, 1, Some(Duration::from_secs(120)), 86_400_000, 0),
            Some(120_000)
        );
        assert_eq!(
            schedule(&c, 1, None, 2_000, 0),
            None,
            "2.5 s is past the give-up"
        );
        assert_eq!(
            schedule(&c, 1, Some(Duration::from_secs(3600)), 60_000, 0),
            None
        );
    }

    #[test]
    fn the_schedule_reaches_the_day_in_a_few_dozen_attempts() {
        let c = cfg();
        let (mut spent, mut attempts) = (0i64, 1u32);
        while let Some(w) = schedule(&c, attempts, None, 86_400_000 - spent, u64::MAX) {
            spent += w as i64;
            attempts += 1;
        }
        assert!((20..60).contains(&attempts), "{attempts} attempts");
    }

    fn row(attempts: i64, window_start: i64) -> OutboxRow {
        OutboxRow {
            id: "msg_1".into(),
            url: "https://h.example.test/".into(),
            event: "call.ended".into(),
            call_id: "CA1".into(),
            body: "{}".into(),
            attempts,
            window_start,
        }
    }

    #[test]
    fn outcomes_settle_as_delivered_retried_or_dead() {
        let c = cfg();
        assert_eq!(
            settle(&c, &row(0, 0), Outcome::Delivered(204), 0, 0),
            Settle::Delivered { status: 204 }
        );
        let gone = settle(
            &c,
            &row(0, 0),
            Outcome::Refused {
                status: Some(410),
                why: "gone".into(),
            },
            0,
            0,
        );
        assert!(
            matches!(
                gone,
                Settle::Dead {
                    attempted: true,
                    ..
                }
            ),
            "{gone:?}"
        );
        let failed = |attempts, now| {
            settle(
                &c,
                &row(attempts, 0),
                Outcome::Failed {
                    status: Some(500),
                    why: "it answered HTTP 500".into(),
                    retry_after: None,
                },
                now,
                0,
            )
        };
        assert!(matches!(
            failed(2, 1_000),
            Settle::Retry {
                delay_ms: 10_000,
                ..
            }
        ));
        let Settle::Dead { error, .. } = failed(30, 86_399_000) else {
            panic!("a delivery past its day is dead");
        };
        assert!(error.starts_with("given up after 31 attempts"), "{error}");
    }

    #[test]
    fn retry_after_takes_seconds_or_a_date() {
        let mut h = reqwest::header::HeaderMap::new();
        h.insert(reqwest::header::RETRY_AFTER, "7".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(7)));
        let later = SystemTime::now() + Duration::from_secs(3600);
        h.insert(
            reqwest::header::RETRY_AFTER,
            httpdate::fmt_http_date(later).parse().unwrap(),
        );
        let d = retry_after(&h).expect("a date");
        assert!(
            d > Duration::from_secs(3500) && d <= Duration::from_secs(3600),
            "{d:?}"
        );
        h.insert(reqwest::header::RETRY_AFTER, "soon".parse().unwrap());
        assert_eq!(retry_after(&h), None);
    }
}
