//! The control API, transport-free: every `/v1` operation as a function of the daemon's state
//! ([`crate::app::App`]) returning JSON or an [`ApiError`] (an HTTP status, a stable code and a
//! message that says what to do), and the access check both HTTP edges apply ([`auth`]). The
//! HTTP layer (`crate::server`) adds bodies around [`dispatch`]; the in-process MCP server
//! calls [`dispatch`] directly and `patterd mcp --stdio` reaches the same routes over HTTP, so
//! all three behave identically. The originate operation is [`originate`], runtime inbound
//! overrides [`inbound`], text messages and number lookups `messages`.

pub mod auth;
mod cluster;
mod error;
pub(crate) mod forward;
pub mod inbound;
mod messages;
pub mod originate;
pub mod pages;
mod peer;
mod webhooks;

use std::sync::Arc;

use hyper::Method;
use serde_json::{Value, json};

pub use auth::{Grant, Permission, Scope};
pub use error::{ApiError, ErrorCode};

use crate::app::App;
use crate::call::action::ActionSpec;
use crate::call::{ActionOutcome, CallAction, CallError};
use crate::store::{CallFilter, now_ms};

/// What each route does, for the scope check ([`auth::Grant::permits`]): the permission and
/// the call it is on. `None` for a path that is no route (404/405 follow, whatever the
/// scope). The recording (`GET /calls/{id}/recording`, served by the HTTP edge) is here too.
pub(crate) fn route_permission<'a>(
    method: &Method,
    segments: &[&'a str],
) -> Option<(Permission, Option<&'a str>)> {
    use Permission::{ActOnCall, Operator, ReadAll, ReadCall};
    Some(match (method.clone(), segments) {
        (Method::GET, ["calls"] | ["metrics"] | ["inbound"]) => (ReadAll, None),
        (Method::POST, ["calls"]) => (Operator, None),
        (Method::GET, ["calls", id]) => (ReadCall, Some(*id)),
        (
            Method::GET,
            [
                "calls",
                id,
                "transcript" | "events" | "metrics" | "recording" | "timeline",
            ],
        ) => (ReadCall, Some(*id)),
        (Method::POST, ["calls", id, "hangup"]) => (ActOnCall, Some(*id)),
        (Method::POST, ["calls", id, verb]) if ActionSpec::by_verb(verb).is_some() => {
            (ActOnCall, Some(*id))
        }
        (Method::PUT | Method::POST, ["inbound"]) => (Operator, None),
        (Method::GET, ["cluster"]) => (Operator, None),
        (Method::GET, ["webhooks", "deliveries"] | ["webhooks", "deliveries", _]) => {
            (Operator, None)
        }
        (Method::POST, ["webhooks", "deliveries", _, "retry"]) => (Operator, None),
        (Method::POST, ["messages"]) => (Operator, None),
        (Method::GET, ["messages"]) => (ReadAll, None),
        // A lookup costs money at the carrier, like a call.
        (Method::GET, ["numbers", _, "lookup"]) => (Operator, None),
        _ => return None,
    })
}

/// Runs one API request for a caller holding `grant` (refused with 403 `forbidden_scope`
/// when the route's [`route_permission`] is beyond it). `path` is the path under `/v1`
/// (e.g. `/calls/CA1/transcript`), `query` the raw query string; `body` the parsed JSON body
/// for POST/PUT.
pub(crate) async fn dispatch(
    app: &Arc<App>,
    grant: &Grant,
    method: &Method,
    path: &str,
    query: &str,
    body: Option<Value>,
) -> Result<(u16, Value), ApiError> {
    // Call ids travel percent-encoded in the path (Telnyx ids contain `:`; MCP and clients
    // escape them): every segment is decoded before it is matched or used.
    let decoded: Vec<String> = path
        .trim_matches('/')
        .split('/')
        .map(decode_segment)
        .collect::<Result<_, _>>()?;
    let segments: Vec<&str> = decoded.iter().map(String::as_str).collect();
    if let Some((permission, call)) = route_permission(method, &segments)
        && let Err(e) = grant.permits(permission, call)
    {
        tracing::info!(
            token = %auth::for_log(&grant.name, 64),
            %method,
            path = %auth::for_log(path, 96),
            "API request refused: beyond the token's scope"
        );
        return Err(e);
    }
    // A call that runs on another instance of the cluster is served there (`forward`).
    if let Some((id, kind)) = forward::call_route(method, &segments) {
        let req = forward::Incoming {
            method,
            path,
            query,
            body: body.as_ref(),
        };
        if let Some(answer) = forward::elsewhere(app, grant, &req, id, kind).await {
            return answer;
        }
    }
    if matches!(grant.scope, Scope::ForeignCall { .. }) {
        // Never answered here on the strength of a token nobody here could check.
        return Err(forward::call_token_refused());
    }
    let q: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    let param = |k: &str| {
        q.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .filter(|v| !v.is_empty())
    };
    let ok = |v: Value| Ok((200, v));
    match (method.clone(), segments.as_slice()) {
        (Method::GET, ["calls"]) => ok(list_calls(app, &param).await?),
        (Method::POST, ["calls"]) => {
            let req = originate::Originate::from_json(body.unwrap_or(Value::Null))?;
            let wait = req.wait;
            let v = originate::originate(app, req).await?;
            Ok((if wait { 200 } else { 201 }, v))
        }
        (Method::GET, ["calls", id]) => ok(call_json(app, id).await?),
        (Method::GET, ["calls", id, "transcript"]) => ok(transcript_json(app, id).await?),
        (Method::GET, ["calls", id, "events"]) => {
            let call = app
                .store
                .call(id)
                .await?
                .ok_or_else(|| ApiError::not_found(id))?;
            let events = app.store.events(id).await?;
            ok(json!({"call_id": call.call_id, "events": events}))
        }
        (Method::GET, ["calls", id, "metrics"]) => {
            app.store
                .call(id)
                .await?
                .ok_or_else(|| ApiError::not_found(id))?;
            let m = app.store.metrics(Some(id)).await?;
            ok(json!({"call_id": id, "metrics": m}))
        }
        (Method::POST, ["calls", id, "hangup"]) => ok(hang_up(app, id).await?),
        (Method::POST, ["calls", id, verb]) if ActionSpec::by_verb(verb).is_some() => {
            let action = action_from_json(verb, body.unwrap_or(Value::Null))?;
            ok(act(app, id, action).await?)
        }
        (Method::GET, ["metrics"]) => {
            let m = app.store.metrics(None).await?;
            let mut v = json!({"live_calls": app.calls.len(), "metrics": m});
            if let Some(c) = cluster::metrics(app).await? {
                v["cluster"] = c;
            }
            ok(v)
        }
        (Method::GET, ["cluster"]) => ok(cluster::view(app).await?),
        (Method::GET, ["webhooks", "deliveries"]) => ok(webhooks::list(app, &param).await?),
        (Method::GET, ["webhooks", "deliveries", id]) => ok(webhooks::get(app, id).await?),
        (Method::POST, ["webhooks", "deliveries", id, "retry"]) => {
            ok(webhooks::retry(app, id).await?)
        }
        (Method::POST, ["messages"]) => {
            Ok((201, messages::send(app, body.unwrap_or(Value::Null)).await?))
        }
        (Method::GET, ["messages"]) => ok(messages::list(app, &param).await?),
        (Method::GET, ["numbers", number, "lookup"]) => {
            ok(messages::lookup(app, number, param("account")).await?)
        }
        (Method::GET, ["inbound"]) => ok(inbound::get(app)),
        (Method::PUT | Method::POST, ["inbound"]) => {
            ok(inbound::configure(app, body.unwrap_or(Value::Null)).await?)
        }
        (
            _,
            ["calls"]
            | ["calls", _]
            | ["calls", _, _]
            | ["metrics"]
            | ["inbound"]
            | ["cluster"]
            | ["webhooks", "deliveries"]
            | ["webhooks", "deliveries", _]
            | ["webhooks", "deliveries", _, "retry"]
            | ["messages"]
            | ["numbers", _, "lookup"],
        ) => Err(ApiError::new(
            405,
            ErrorCode::MethodNotAllowed,
            "method not allowed on this resource",
        )),
        _ => Err(ApiError::new(
            404,
            ErrorCode::UnknownRoute,
            "no such API route; see docs/api.md",
        )),
    }
}

async fn list_calls(
    app: &Arc<App>,
    param: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<Value, ApiError> {
    let limit = match param("limit") {
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|l| (1..=1000).contains(l))
            .ok_or_else(|| ApiError::bad_request("limit must be a number from 1 to 1000"))?,
        None => 50,
    };
    let direction = param("direction");
    if let Some(d) = &direction
        && d != "inbound"
        && d != "outbound"
    {
        return Err(ApiError::bad_request(
            "direction must be `inbound` or `outbound`",
        ));
    }
    let number = match param("number") {
        Some(n) => Some(crate::util::phone::normalize_e164(&n).ok_or_else(|| {
            ApiError::bad_request(format!(
                "number {n:?} is not a phone number; use E.164, e.g. +15551234567"
            ))
        })?),
        None => None,
    };
    let since_ms = match param("since") {
        Some(s) => Some(parse_since(&s, now_ms()).ok_or_else(|| {
            ApiError::bad_request(
                "since must be milliseconds since the Unix epoch (0 or more) or a look-back \
                 like 90s, 15m, 2h, 7d (at most 100 years)",
            )
        })?),
        None => None,
    };
    let calls = app
        .store
        .calls(CallFilter {
            status: param("status"),
            direction,
            number,
            since_ms,
            limit,
        })
        .await?;
    Ok(json!({"calls": calls}))
}

/// Decodes one percent-encoded path segment; a segment that is not UTF-8 once decoded is a
/// bad request.
pub(crate) fn decode_segment(seg: &str) -> Result<String, ApiError> {
    percent_encoding::percent_decode_str(seg)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| {
            ApiError::bad_request(
                "a path segment is not UTF-8 once percent-decoded; percent-encode call ids as UTF-8",
            )
        })
}

/// The longest look-back `since` accepts (100 years), so the arithmetic cannot overflow.
const MAX_LOOKBACK_S: i64 = 100 * 366 * 86_400;

/// `since`: epoch milliseconds (not negative), or a look-back like `90s`, `15m`, `2h`, `7d`
/// from `now_ms`. None for anything else (never panics, never overflows).
fn parse_since(s: &str, now_ms: i64) -> Option<i64> {
    if let Ok(ms) = s.parse::<i64>() {
        return (ms >= 0).then_some(ms);
    }
    // The unit is the last character, which may be any Unicode scalar: split on a char
    // boundary, never on a byte index.
    let unit = s.chars().next_back()?;
    let n: i64 = s[..s.len() - unit.len_utf8()].parse().ok()?;
    let per = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => return None,
    };
    let secs = n
        .checked_mul(per)
        .filter(|s| (0..=MAX_LOOKBACK_S).contains(s))?;
    now_ms.checked_sub(secs.checked_mul(1000)?)
}

/// A call with `live` (an actor is running for it).
pub(crate) async fn call_json(app: &Arc<App>, id: &str) -> Result<Value, ApiError> {
    let call = app
        .store
        .call(id)
        .await?
        .ok_or_else(|| ApiError::not_found(id))?;
    let mut v = json!(call);
    v["live"] = json!(app.calls.get(id).is_some());
    Ok(v)
}

/// A finished call's recording (a stereo WAV), opened, with its size: the edge streams it
/// from the file. 404 when the call was not recorded or its recording is not complete yet.
pub async fn recording(app: &Arc<App>, id: &str) -> Result<(tokio::fs::File, u64), ApiError> {
    let none = || {
        ApiError::new(
            404,
            ErrorCode::NoRecording,
            format!(
                "call `{}` has no recording; only agents with `record = true` are recorded, \
                 and a recording is served once its call has ended",
                id.escape_default()
            ),
        )
    };
    let path = crate::call::recording::path(&app.config().server.data_dir, id).ok_or_else(none)?;
    let opened = async {
        let file = tokio::fs::File::open(&path).await?;
        let len = file.metadata().await?.len();
        Ok::<_, std::io::Error>((file, len))
    };
    match opened.await {
        Ok(opened) => Ok(opened),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(none()),
        Err(e) => Err(ApiError::new(
            500,
            ErrorCode::RecordingUnreadable,
            format!("the recording could not be read ({e}); check data_dir's permissions"),
        )),
    }
}

/// A call with its turns.
pub(crate) async fn transcript_json(app: &Arc<App>, id: &str) -> Result<Value, ApiError> {
    let mut v = call_json(app, id).await?;
    v["transcript"] = json!(app.store.turns(id).await?);
    Ok(v)
}

/// The body of `POST /v1/calls/{id}/{verb}` (`transfer`, `dtmf`, `say`: the actions on the
/// control surface, `call::action`) as an action.
fn action_from_json(verb: &str, body: Value) -> Result<CallAction, ApiError> {
    let (spec, control) = ActionSpec::by_verb(verb).ok_or_else(|| {
        ApiError::new(
            404,
            ErrorCode::UnknownRoute,
            "no such API route; see docs/api.md",
        )
    })?;
    let value = |key: &str| {
        body.get(key)
            .and_then(Value::as_str)
            .filter(|v| !v.trim().is_empty())
            .map(str::to_string)
    };
    if let Some(missing) = spec.args.iter().find(|a| value(a.key).is_none()) {
        return Err(ApiError::bad_request(format!(
            "the body needs a string `{}`, e.g. {}",
            missing.key, control.example
        )));
    }
    Ok((spec.build)(&|key| value(key).unwrap_or_default()))
}

/// Carries out an agent action on a live call through its actor, so the agent's policies
/// (transfer allow-list, DTMF digits) apply as they do to the brain's tools. Refused → 422
/// `action_refused`, failed at the carrier → 502 `action_failed`.
pub async fn act(app: &Arc<App>, id: &str, action: CallAction) -> Result<Value, ApiError> {
    let kind = action.spec().rest_name();
    let Some(handle) = app.calls.get(id) else {
        return match app.store.call(id).await? {
            Some(_) => Err(ApiError::new(
                409,
                ErrorCode::CallNotLive,
                format!("call {id} has already ended"),
            )),
            None => Err(ApiError::not_found(id)),
        };
    };
    let outcome = handle.act(action).await.map_err(|e| match e {
        CallError::Busy => ApiError::new(409, ErrorCode::CallBusy, e.to_string()),
        CallError::Ended => {
            ApiError::new(409, ErrorCode::CallNotLive, format!("call {id} has ended"))
        }
    })?;
    match outcome {
        ActionOutcome::Done { detail } => {
            Ok(json!({"call_id": id, "action": kind, "outcome": "done", "message": detail}))
        }
        ActionOutcome::Refused { reason } => {
            Err(ApiError::new(422, ErrorCode::ActionRefused, reason))
        }
        ActionOutcome::Failed { reason } => {
            Err(ApiError::new(502, ErrorCode::ActionFailed, reason))
        }
    }
}

async fn hang_up(app: &Arc<App>, id: &str) -> Result<Value, ApiError> {
    match app.calls.get(id) {
        Some(h) => {
            // A call we placed that has not been answered has no media stream to end: cancel it
            // at the carrier.
            let unanswered = app
                .store
                .call(id)
                .await?
                .is_some_and(|c| c.direction == "outbound" && c.answered_at.is_none());
            if unanswered {
                crate::app::dialer::cancel_unanswered(app, &h.carrier_account, id).await;
            }
            h.hang_up("ended through the API")
                .map_err(|e| ApiError::new(409, ErrorCode::CallBusy, e.to_string()))?;
            app.calls.wait_finished(id).await;
            app.store.tx.flush().await?;
            call_json(app, id).await
        }
        None => match app.store.call(id).await? {
            Some(_) => Err(ApiError::new(
                409,
                ErrorCode::CallNotLive,
                format!("call {id} has already ended"),
            )),
            None => Err(ApiError::not_found(id)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `App` with one Twilio account and its data in a fresh temporary directory (kept
    /// alive by the returned guard).
    fn test_app() -> (tempfile::TempDir, std::sync::Arc<App>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let text = format!(
            "[server]\ndata_dir = {:?}\n\n[carriers.tw]\nkind = \"twilio\"\n",
            dir.path().display().to_string()
        );
        let loaded = crate::config::load_str_with_vars(&text, "t.toml", &[]).expect("config");
        let app = App::new(loaded.config).expect("app");
        (dir, app)
    }

    #[tokio::test]
    async fn the_cluster_view_is_for_operators_and_empty_on_sqlite() {
        let (_dir, app) = test_app();
        let get = |grant: Grant, path: &'static str| {
            let app = app.clone();
            async move { dispatch(&app, &grant, &Method::GET, path, "", None).await }
        };
        let (s, v) = get(Grant::operator("t"), "/cluster")
            .await
            .expect("operator");
        assert_eq!(s, 200);
        assert_eq!(
            v,
            json!({"clustered": false, "live_calls": 0, "instances": []})
        );
        let read = Grant {
            scope: Scope::Read,
            name: "dash".into(),
        };
        let e = get(read.clone(), "/cluster").await.expect_err("read");
        assert_eq!((e.status, e.code), (403, ErrorCode::ForbiddenScope));
        // The metrics stay readable, without a cluster part on SQLite.
        let (_, m) = get(read, "/metrics").await.expect("metrics");
        assert_eq!(m.get("cluster"), None);
        let e = dispatch(
            &app,
            &Grant::operator("t"),
            &Method::POST,
            "/cluster",
            "",
            None,
        )
        .await
        .expect_err("post");
        assert_eq!(e.status, 405);
    }

    #[test]
    fn since_never_panics_or_overflows() {
        let now = 1_700_000_000_000;
        assert_eq!(parse_since("1000", now), Some(1000));
        assert_eq!(parse_since("90s", now), Some(now - 90_000));
        assert_eq!(parse_since("2h", now), Some(now - 7_200_000));
        assert_eq!(parse_since("7d", now), Some(now - 604_800_000));
        for bad in [
            "€",
            "5€",
            "€d",
            "",
            "d",
            "-5m",
            "-1",
            "9223372036854775807d",
            "9223372036854775807s",
            "106751991167300d",
            "1x",
        ] {
            assert_eq!(parse_since(bad, now), None, "{bad:?}");
        }
    }

    #[tokio::test]
    async fn since_that_is_not_a_time_is_a_400() {
        let (_dir, app) = test_app();
        for q in ["since=%E2%82%AC", "since=9223372036854775807d", "since=-3m"] {
            let e = dispatch(
                &app,
                &Grant::operator("test"),
                &Method::GET,
                "/calls",
                q,
                None,
            )
            .await
            .expect_err(q);
            assert_eq!((e.status, e.code.as_str()), (400, "invalid_request"), "{q}");
            assert!(e.message.contains("since must be"), "{}", e.message);
        }
    }

    #[tokio::test]
    async fn percent_encoded_call_ids_are_decoded() {
        let (_dir, app) = test_app();
        let id = "v3:abc_DEF-1";
        app.store
            .tx
            .send(crate::store::Write::Call(crate::store::NewCall {
                call_id: id.into(),
                carrier: "telnyx".into(),
                carrier_account: "tx".into(),
                direction: "inbound",
                from: "+15550001111".into(),
                to: "+15550002222".into(),
                agent: "a".into(),
                status: "completed".into(),
            }));
        app.store.tx.flush().await.expect("flush");
        for path in ["/calls/v3%3Aabc_DEF-1", "/calls/v3:abc_DEF-1/transcript"] {
            let (_, v) = dispatch(&app, &Grant::operator("test"), &Method::GET, path, "", None)
                .await
                .expect(path);
            assert_eq!(v["call_id"], json!(id), "{path}");
        }
        let e = dispatch(
            &app,
            &Grant::operator("test"),
            &Method::GET,
            "/calls/%FF",
            "",
            None,
        )
        .await
        .expect_err("not UTF-8");
        assert_eq!(e.status, 400);
    }

    /// The API runs against an `App` built from a configuration, without any listener.
    #[tokio::test]
    async fn operations_run_without_the_listener() {
        let (_dir, app) = test_app();
        let (status, v) = dispatch(
            &app,
            &Grant::operator("test"),
            &Method::GET,
            "/calls",
            "",
            None,
        )
        .await
        .expect("list calls");
        assert_eq!(status, 200);
        assert_eq!(v, json!({"calls": []}));
        let (_, v) = dispatch(
            &app,
            &Grant::operator("test"),
            &Method::GET,
            "/inbound",
            "",
            None,
        )
        .await
        .expect("inbound");
        assert_eq!(v, json!({"overrides": {}}));
        let e = dispatch(
            &app,
            &Grant::operator("test"),
            &Method::GET,
            "/calls/CAnope",
            "",
            None,
        )
        .await
        .expect_err("unknown call");
        assert_eq!((e.status, e.code.as_str()), (404, "not_found"));
        let e = dispatch(
            &app,
            &Grant::operator("test"),
            &Method::POST,
            "/calls",
            "",
            Some(json!({"to": "+15550001234"})),
        )
        .await
        .expect_err("outbound is off");
        assert_eq!((e.status, e.code.as_str()), (403, "outbound_disabled"));
    }
}
