//! Text messages and number lookups, driven from one place. Sending ([`send`]) checks before
//! any carrier is contacted — E.164, the body (not empty, at most `[outbound] max_sms_chars`),
//! the sending number and its `allowed_destinations` (empty = refused; an in-call `send_sms`
//! may always text the call's other party, an agent's answer goes only to whoever texted),
//! the account's carrier — then reserves a place under `[outbound] max_sms_per_day` (this
//! process's count over the store on SQLite; one locked statement that inserts the row on
//! PostgreSQL, so the cap holds across instances and restarts), then has the number's carrier
//! send it and records `sent` or `failed` (a failed send stops counting). Number lookups
//! ([`lookup`]) go through the carrier of the account asked for, or of the first number that
//! can. Inbound messages ([`incoming`]) are stored once per carrier message id and, for a
//! number with `sms = true`, answered by its agent: one conversation per pair of numbers
//! (`conversation.rs`). Phone numbers in logs are masked; bodies are never logged.

mod conversation;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tracing::{info, warn};

use super::App;
use crate::carrier::messaging::{InboundSms, NumberInfo, OutgoingSms, SmsReceipt};
use crate::carrier::port::{GuardUnavailable, Host};
use crate::carrier::{Carrier, CarrierError};
use crate::config::Config;
use crate::security::mask_number;
use crate::store::messages::new_id;
use crate::store::{NewMessage, StoreError, Write, now_ms};
use crate::util::phone::normalize_e164;

pub(crate) use conversation::Conversations;

/// The replay guard's scope of inbound message ids (carrier + id).
const SEEN_SCOPE: &str = "sms_message";
/// How long an inbound message id is remembered.
const SEEN_TTL: Duration = Duration::from_secs(24 * 3600);

/// Why a message was not sent or a number not looked up; each says what to do.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SmsError {
    #[error(
        "{0:?} is not a valid phone number: write it in E.164 with the country code, e.g. \
         +15551234567"
    )]
    InvalidNumber(String),
    #[error("the message body is empty; give the text to send in `body`")]
    EmptyBody,
    #[error(
        "the message body is {chars} characters, more than [outbound] max_sms_chars = {max}; \
         shorten it"
    )]
    TooLong { chars: usize, max: usize },
    #[error("from {0:?} is not one of this daemon's [[numbers]]")]
    UnknownFrom(String),
    #[error(
        "text messages from {0} are disabled: add the destinations it may text (E.164 numbers or \
         prefixes) to allowed_destinations in its [[numbers]] entry"
    )]
    Disabled(String),
    #[error(
        "{to} is not an allowed destination for {from}: add it (or a prefix of it) to \
         allowed_destinations in the [[numbers]] entry of the number texting"
    )]
    NotAllowed { to: String, from: String },
    #[error(
        "text messages are disabled: no [[numbers]] entry has allowed_destinations that admit \
         {0}; add the destinations (E.164 numbers or prefixes) a number may text"
    )]
    NoNumber(String),
    #[error("[carriers.{0}] is not configured")]
    NoCarrier(String),
    #[error("{0}")]
    Unsupported(CarrierError),
    #[error(
        "{today} text messages were sent today (UTC), the limit ([outbound] max_sms_per_day); \
         try again tomorrow or raise the limit"
    )]
    Daily { today: u64 },
    #[error(
        "the cluster's text message cap could not be checked in the store ({0}); nothing was \
         sent — check that the PostgreSQL at [store] url is reachable, then try again"
    )]
    Unavailable(String),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Carrier(CarrierError),
}

/// Who a message is for, and so which destinations it may have.
#[derive(Debug, Clone)]
pub(crate) enum Sender {
    /// REST or MCP: `from` (default: the first number whose `allowed_destinations` admit
    /// `to`), its allow-list applies.
    Api { from: Option<String> },
    /// A call's in-call `send_sms`: from the call's number through its account; the call's
    /// other party always, anyone else as that number's allow-list says.
    Call {
        call_id: String,
        account: String,
        ours: String,
        other_party: String,
        agent: String,
    },
    /// An agent's answer to an inbound message: from the number texted, to whoever texted it.
    Reply {
        account: String,
        ours: String,
        agent: String,
    },
}

/// A message to send.
#[derive(Debug, Clone)]
pub(crate) struct SendRequest {
    pub(crate) to: String,
    pub(crate) body: String,
    pub(crate) sender: Sender,
}

/// The SQLite store's count of today's messages ([`reserve_local`]).
#[derive(Default)]
pub(crate) struct SmsCaps {
    state: Mutex<SmsCapState>,
}

#[derive(Default)]
struct SmsCapState {
    /// Start of the UTC day the counts are for (ms since the epoch).
    day: i64,
    /// Messages the store held for `day` when first needed (earlier runs).
    base: Option<u64>,
    /// Messages of `day` this run sent since.
    sent: u64,
    /// Sends in flight.
    pending: u64,
}

impl SmsCaps {
    fn lock(&self) -> std::sync::MutexGuard<'_, SmsCapState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A place under the daily cap held while the carrier is asked (SQLite: this process's count;
/// PostgreSQL: the row the reservation inserted, which counts by itself).
struct Reservation<'a> {
    caps: Option<(&'a SmsCaps, i64)>,
    sent: bool,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if let Some((caps, day)) = self.caps {
            let mut s = caps.lock();
            s.pending = s.pending.saturating_sub(1);
            if self.sent && s.day == day {
                s.sent += 1;
            }
        }
    }
}

/// The number a message goes out from and the account that sends it, after the policy.
struct Route {
    from: String,
    account: String,
    agent: Option<String>,
    call_id: Option<String>,
    source: &'static str,
}

/// The sending number's entry, its account, and whether `to` may be texted; see [`Sender`].
fn route(config: &Config, sender: &Sender, to: &str) -> Result<Route, SmsError> {
    match sender {
        Sender::Api { from: Some(from) } => {
            let n = normalize_e164(from)
                .and_then(|f| config.number(&f))
                .ok_or_else(|| SmsError::UnknownFrom(from.clone()))?;
            if n.allowed_destinations.is_empty() {
                return Err(SmsError::Disabled(n.number.clone()));
            }
            if !n.allows_destination(to) {
                return Err(SmsError::NotAllowed {
                    to: to.to_string(),
                    from: n.number.clone(),
                });
            }
            Ok(Route {
                from: n.number.clone(),
                account: n.carrier.clone(),
                agent: Some(n.agent.clone()),
                call_id: None,
                source: "api",
            })
        }
        Sender::Api { from: None } => {
            let n = config
                .numbers
                .iter()
                .find(|n| n.allows_destination(to))
                .ok_or_else(|| SmsError::NoNumber(to.to_string()))?;
            Ok(Route {
                from: n.number.clone(),
                account: n.carrier.clone(),
                agent: Some(n.agent.clone()),
                call_id: None,
                source: "api",
            })
        }
        Sender::Call {
            call_id,
            account,
            ours,
            other_party,
            agent,
        } => {
            let n = config.number(ours);
            let party = normalize_e164(other_party);
            if party.as_deref() != Some(to) {
                match n {
                    Some(n) if n.allows_destination(to) => {}
                    Some(n) if n.allowed_destinations.is_empty() => {
                        return Err(SmsError::NotAllowed {
                            to: to.to_string(),
                            from: n.number.clone(),
                        });
                    }
                    Some(n) => {
                        return Err(SmsError::NotAllowed {
                            to: to.to_string(),
                            from: n.number.clone(),
                        });
                    }
                    None => return Err(SmsError::UnknownFrom(ours.clone())),
                }
            }
            let from = normalize_e164(ours).ok_or_else(|| SmsError::UnknownFrom(ours.clone()))?;
            Ok(Route {
                from,
                account: account.clone(),
                agent: Some(agent.clone()),
                call_id: Some(call_id.clone()),
                source: "call",
            })
        }
        Sender::Reply {
            account,
            ours,
            agent,
        } => Ok(Route {
            from: ours.clone(),
            account: account.clone(),
            agent: Some(agent.clone()),
            call_id: None,
            source: "agent",
        }),
    }
}

/// The carrier of `account`, when it is configured and can send text messages.
fn carrier_for<'a>(
    app: &'a App,
    config: &Config,
    account: &str,
) -> Result<&'a Arc<dyn Carrier>, SmsError> {
    let cfg = config
        .carrier(account)
        .ok_or_else(|| SmsError::NoCarrier(account.to_string()))?;
    if cfg.account().sms_problem().is_some() {
        return Err(SmsError::Unsupported(CarrierError::NoMessaging {
            carrier: cfg.kind().as_str(),
            what: "send text messages",
        }));
    }
    app.carriers
        .get(cfg.kind())
        .filter(|c| c.has_account(account))
        .ok_or_else(|| SmsError::NoCarrier(account.to_string()))
}

/// Sends one message; see the module docs. The answer is the stored message as JSON.
pub(crate) async fn send(app: &Arc<App>, req: SendRequest) -> Result<Value, SmsError> {
    let config = app.config();
    let to = normalize_e164(&req.to).ok_or_else(|| SmsError::InvalidNumber(req.to.clone()))?;
    if req.body.trim().is_empty() {
        return Err(SmsError::EmptyBody);
    }
    let chars = req.body.chars().count();
    let max = config.outbound.max_sms_chars;
    if chars > max {
        return Err(SmsError::TooLong { chars, max });
    }
    let r = route(&config, &req.sender, &to)?;
    let carrier = carrier_for(app, &config, &r.account)?;
    let message = NewMessage {
        message_id: new_id(),
        direction: "outbound",
        carrier: carrier.kind().as_str().to_string(),
        carrier_account: r.account.clone(),
        carrier_message_id: None,
        from: r.from.clone(),
        to: to.clone(),
        body: req.body.clone(),
        status: "sending",
        agent: r.agent.clone(),
        call_id: r.call_id.clone(),
        source: r.source,
        created_at: now_ms(),
    };
    let mut reservation = reserve(app, &config, &message).await?;
    let sent = carrier
        .send_sms(
            &r.account,
            &OutgoingSms {
                from: r.from.clone(),
                to: to.clone(),
                body: req.body.clone(),
            },
        )
        .await;
    let (status, carrier_id, error) = match &sent {
        Ok(s) => ("sent", Some(s.carrier_message_id.clone()), None),
        Err(e) => ("failed", None, Some(e.to_string())),
    };
    app.store.tx.send(Write::MessageStatus {
        message_id: message.message_id.clone(),
        status,
        carrier_message_id: carrier_id.clone(),
        error,
        at: now_ms(),
    });
    match sent {
        Ok(s) => {
            reservation.sent = true;
            drop(reservation);
            info!(
                message_id = %message.message_id,
                from = %mask_number(&r.from),
                to = %mask_number(&to),
                chars,
                source = r.source,
                "text message sent"
            );
            Ok(json!({
                "message_id": message.message_id,
                "direction": "outbound",
                "status": "sent",
                "carrier": message.carrier,
                "carrier_account": r.account,
                "carrier_message_id": s.carrier_message_id,
                "carrier_status": s.status,
                "from": r.from,
                "to": to,
                "body": req.body,
                "source": r.source,
                "call_id": r.call_id,
            }))
        }
        Err(e) => {
            warn!(
                message_id = %message.message_id,
                to = %mask_number(&to),
                error = %e,
                "text message not sent"
            );
            Err(SmsError::Carrier(e))
        }
    }
}

/// Reserves a place under `[outbound] max_sms_per_day` for `message` and writes its row
/// (`sending`): one statement under the cap's row lock on PostgreSQL, this process's count on
/// SQLite.
async fn reserve<'a>(
    app: &'a App,
    config: &Config,
    message: &NewMessage,
) -> Result<Reservation<'a>, SmsError> {
    let max = config.outbound.max_sms_per_day;
    let day = super::dialer::day_start(message.created_at);
    #[cfg(feature = "postgres")]
    if let Some(pool) = app.store.pg_pool() {
        let r = crate::store::postgres::messages::reserve(&pool, message, i64::from(max), day)
            .await
            .map_err(|e| {
                warn!(error = %e, "the text message cap could not be checked; refusing");
                SmsError::Unavailable(e.to_string())
            })?;
        if !r.granted {
            return Err(SmsError::Daily {
                today: r.today.max(0) as u64,
            });
        }
        return Ok(Reservation {
            caps: None,
            sent: false,
        });
    }
    loop {
        let known = {
            let s = app.sms_caps.lock();
            s.day == day && s.base.is_some()
        };
        if !known {
            let stored = app.store.sms_sent_since(day).await?;
            let mut s = app.sms_caps.lock();
            if s.day != day || s.base.is_none() {
                s.day = day;
                s.base = Some(stored);
                s.sent = 0;
            }
        }
        let mut s = app.sms_caps.lock();
        if s.day != day {
            continue;
        }
        let today = s.base.unwrap_or(0) + s.sent + s.pending;
        if today >= u64::from(max) {
            return Err(SmsError::Daily { today });
        }
        s.pending += 1;
        drop(s);
        app.store.tx.send(Write::Message(message.clone()));
        return Ok(Reservation {
            caps: Some((&app.sms_caps, day)),
            sent: false,
        });
    }
}

/// What a lookup found, with the account that looked.
pub(crate) async fn lookup(
    app: &Arc<App>,
    number: &str,
    account: Option<&str>,
) -> Result<(NumberInfo, String), SmsError> {
    let config = app.config();
    let number =
        normalize_e164(number).ok_or_else(|| SmsError::InvalidNumber(number.to_string()))?;
    let account = match account {
        Some(a) => a.to_string(),
        None => lookup_account(&config).ok_or_else(|| SmsError::NoCarrier("<any>".into()))?,
    };
    let cfg = config
        .carrier(&account)
        .ok_or_else(|| SmsError::NoCarrier(account.clone()))?;
    let carrier = app
        .carriers
        .get(cfg.kind())
        .filter(|c| c.has_account(&account))
        .ok_or_else(|| SmsError::NoCarrier(account.clone()))?;
    match carrier.lookup_number(&account, &number).await {
        Ok(info) => {
            info!(number = %mask_number(&number), account = %account, "number looked up");
            Ok((info, account))
        }
        Err(e @ CarrierError::NoMessaging { .. }) => Err(SmsError::Unsupported(e)),
        Err(e) => Err(SmsError::Carrier(e)),
    }
}

/// The account a lookup goes through by default: the first number's that can, else the first
/// account that can.
fn lookup_account(config: &Config) -> Option<String> {
    let can = |name: &str| {
        config.carrier(name).is_some_and(|c| {
            c.account().sms_problem().is_none() && c.missing_credentials().is_empty()
        })
    };
    config
        .numbers
        .iter()
        .map(|n| n.carrier.clone())
        .find(|a| can(a))
        .or_else(|| config.carriers.keys().find(|a| can(a)).cloned())
}

/// An inbound message; see the module docs and [`Host::incoming_sms`].
pub(crate) async fn incoming(
    app: Arc<App>,
    sms: InboundSms<'_>,
) -> Result<SmsReceipt, GuardUnavailable> {
    let key = format!("{}:{}", sms.carrier.as_str(), sms.carrier_message_id);
    if !app.first_seen(SEEN_SCOPE, &key, SEEN_TTL).await? {
        info!(
            carrier = sms.carrier.as_str(),
            "text message already received (a retry or a replay); ignored"
        );
        return Ok(SmsReceipt::Repeated);
    }
    let config = app.config();
    let ours = normalize_e164(sms.to).unwrap_or_else(|| bounded(sms.to, 32));
    let theirs = normalize_e164(sms.from).unwrap_or_else(|| bounded(sms.from, 32));
    let number = config
        .numbers
        .iter()
        .find(|n| n.number == ours && n.carrier == sms.account);
    let body = bounded(sms.body, crate::carrier::messaging::MAX_SMS_CHARS);
    let message_id = new_id();
    app.store.tx.send(Write::Message(NewMessage {
        message_id: message_id.clone(),
        direction: "inbound",
        carrier: sms.carrier.as_str().to_string(),
        carrier_account: sms.account.to_string(),
        carrier_message_id: Some(bounded(sms.carrier_message_id, 128)),
        from: theirs.clone(),
        to: ours.clone(),
        body: body.clone(),
        status: "received",
        agent: number.map(|n| n.agent.clone()),
        call_id: None,
        source: "carrier",
        created_at: now_ms(),
    }));
    info!(
        %message_id,
        from = %mask_number(&theirs),
        to = %mask_number(&ours),
        chars = body.chars().count(),
        answered = number.is_some_and(|n| n.sms),
        "text message received"
    );
    let Some(number) = number.filter(|n| n.sms) else {
        return Ok(SmsReceipt::Stored);
    };
    if crate::util::phone::known_number(&theirs).is_none() || !number.allows_caller(&theirs) {
        info!(%message_id, "text message not answered: the sender is not a number the agent answers");
        return Ok(SmsReceipt::Stored);
    }
    if super::inbound::effective(&app, &number.number).enabled == Some(false) {
        info!(%message_id, "text message not answered: inbound is disabled by configure_inbound");
        return Ok(SmsReceipt::Stored);
    }
    app.conversations.deliver(
        &app,
        conversation::Turn {
            account: sms.account.to_string(),
            ours,
            theirs,
            agent: number.agent.clone(),
            message_id,
        },
    );
    Ok(SmsReceipt::Stored)
}

/// At most `max` characters of `s`.
fn bounded(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

impl crate::tools::Texter for std::sync::Weak<App> {
    fn text_from_call(
        &self,
        call: &crate::tools::CallCtx,
        to: Option<String>,
        body: String,
    ) -> crate::provider::ToolFuture {
        use crate::provider::ToolOutput;
        let app = self.upgrade();
        let sender = Sender::Call {
            call_id: call.call_id.clone(),
            account: call.carrier_account.clone(),
            ours: call.our_number().to_string(),
            other_party: call.other_party().to_string(),
            agent: call.agent.clone(),
        };
        let to = to.unwrap_or_else(|| call.other_party().to_string());
        Box::pin(async move {
            let Some(app) = app else {
                return ToolOutput::failed("The daemon is stopping; nothing was sent.");
            };
            match send(&app, SendRequest { to, body, sender }).await {
                Ok(v) => ToolOutput {
                    ok: true,
                    content: format!(
                        "The text message was sent to {}.",
                        v["to"].as_str().unwrap_or("the caller")
                    ),
                    say: None,
                },
                Err(e) => ToolOutput::failed(format!("The text message was not sent: {e}")),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(dir: &tempfile::TempDir, max: u32) -> Arc<App> {
        let text = format!(
            "[server]\ndata_dir = {:?}\n\n[outbound]\nmax_sms_per_day = {max}\n\n\
             [carriers.tw]\nkind = \"twilio\"\n",
            dir.path().display().to_string()
        );
        let loaded = crate::config::load_str_with_vars(&text, "t.toml", &[]).expect("config");
        App::new(loaded.config).expect("app")
    }

    fn message(to: &str) -> NewMessage {
        NewMessage {
            message_id: new_id(),
            direction: "outbound",
            carrier: "twilio".into(),
            carrier_account: "tw".into(),
            carrier_message_id: None,
            from: "+15550001234".into(),
            to: to.into(),
            body: "hi".into(),
            status: "sending",
            agent: None,
            call_id: None,
            source: "api",
            created_at: now_ms(),
        }
    }

    /// The cap counts sent and in-flight messages, not failed ones, and holds across a
    /// restart on the same store (SQLite: the rows are what a new process counts).
    #[tokio::test]
    async fn the_daily_cap_counts_the_store_across_restarts() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let app = app(&dir, 3);
            let config = app.config();
            let mut sent = reserve(&app, &config, &message("+15557654321"))
                .await
                .expect("first");
            sent.sent = true;
            drop(sent);
            // A failed send: released, its row `failed`.
            let failed_msg = message("+15557654322");
            let failed = reserve(&app, &config, &failed_msg).await.expect("second");
            app.store.tx.send(Write::MessageStatus {
                message_id: failed_msg.message_id.clone(),
                status: "failed",
                carrier_message_id: None,
                error: Some("refused".into()),
                at: now_ms(),
            });
            drop(failed);
            let pending = reserve(&app, &config, &message("+15557654323"))
                .await
                .expect("third (in flight)");
            let mut sent = reserve(&app, &config, &message("+15557654324"))
                .await
                .expect("fourth");
            sent.sent = true;
            drop(sent);
            match reserve(&app, &config, &message("+15557654325")).await {
                Err(SmsError::Daily { today }) => assert_eq!(today, 3),
                Err(e) => panic!("wrong refusal: {e}"),
                Ok(_) => panic!("the cap let a fourth message through"),
            }
            drop(pending);
            app.store.tx.flush().await.expect("flush");
        }
        // A new process on the same store: two sent and one left `sending` (it never
        // finished) count; the failed one does not.
        let app = app(&dir, 3);
        let config = app.config();
        assert!(matches!(
            reserve(&app, &config, &message("+15557654326")).await,
            Err(SmsError::Daily { today: 3 })
        ));
        let app4 = {
            drop(app);
            self::app(&dir, 4)
        };
        let config = app4.config();
        assert!(
            reserve(&app4, &config, &message("+15557654327"))
                .await
                .is_ok()
        );
    }

    #[test]
    fn conversations_have_one_id_per_pair() {
        assert_eq!(
            conversation::conversation_id("+15550001234", "+15557654321"),
            "sms-15550001234-15557654321"
        );
    }
}
