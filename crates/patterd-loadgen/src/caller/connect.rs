//! Connecting one load-generator call: at its start time [`connect_call`] posts the signed
//! voice webhook, opens the Media Streams socket named in the TwiML answer, sends `connected`
//! and `start`, and hands the call to its shard as a [`Driver`] (then the socket's reader task,
//! whose messages follow the driver on the shard's channel). A call that fails to connect goes
//! to the shard as its [`CallResult`], with the reason.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use fastwebsockets::{Frame, Payload};
use tokio::sync::mpsc;
use tokio::time::Instant;

use patterd::net::ws_client::connect;
use patterd_sim::twilio::call::map_stream_url;
use patterd_sim::twilio::{new_sid, parse_twiml};
use patterd_sim::ws::spawn_reader;

use super::wire::{incoming, tag_frame};
use super::{CallCtx, CallPlan, CallResult, Driver, Phase};
use crate::shard::ShardMsg;

/// Sets up one call at its start time (webhook, media socket, `connected` + `start`) and
/// hands it to its shard as `slot`: first the [`Driver`], then the reader task, whose
/// messages come after the driver on the same channel. A call that failed to connect goes to
/// the shard as its result.
pub async fn connect_call(
    ctx: Arc<CallCtx>,
    plan: CallPlan,
    slot: u32,
    shard: mpsc::UnboundedSender<ShardMsg>,
) {
    tokio::time::sleep_until(plan.start_at).await;
    let msg = match setup(ctx, plan, slot, &shard).await {
        Ok(()) => return,
        Err(res) => ShardMsg::Failed(Box::new(res)),
    };
    let _ = shard.send(msg);
}

async fn setup(
    ctx: Arc<CallCtx>,
    plan: CallPlan,
    slot: u32,
    shard: &mpsc::UnboundedSender<ShardMsg>,
) -> Result<(), CallResult> {
    let mut res = CallResult {
        idx: plan.idx,
        ..Default::default()
    };
    let from = format!("+1555{:07}", plan.idx);
    let t = Instant::now();
    let (call_sid, resp) = match ctx
        .twilio
        .incoming_call(&ctx.voice_path, &from, &ctx.to)
        .await
    {
        Ok(x) => x,
        Err(e) => {
            res.error = Some(format!("webhook: {e}"));
            return Err(res);
        }
    };
    res.webhook = Some(t.elapsed());
    if resp.status != 200 {
        res.error = Some(format!("webhook answered {}", resp.status));
        return Err(res);
    }
    let Some(answer) = parse_twiml(&resp.body).ok() else {
        res.error = Some("TwiML without <Stream url>".into());
        return Err(res);
    };
    let Some(stream_url) = answer.stream_url else {
        res.error = Some("TwiML without <Stream url>".into());
        return Err(res);
    };
    res.call_sid = Some(call_sid.clone());
    res.media_host = stream_url
        .split_once("://")
        .map(|(_, r)| r.split('/').next().unwrap_or(r).to_string());
    let base = if ctx.ws_base.is_empty() {
        format!("ws://{}", res.media_host.as_deref().unwrap_or_default())
    } else {
        ctx.ws_base.clone()
    };
    let url = match map_stream_url(&stream_url, &base) {
        Ok(u) => u,
        Err(e) => {
            res.error = Some(e.to_string());
            return Err(res);
        }
    };
    let ws = match connect(
        &url,
        &[("User-Agent", "Twilio.TmeWs/1.0")],
        Duration::from_secs(10),
    )
    .await
    {
        Ok((ws, _)) => ws,
        Err(e) => {
            res.error = Some(format!("media socket: {e}"));
            return Err(res);
        }
    };
    let (rd, mut wr) = patterd_sim::ws::split(ws);
    let stream_sid = new_sid("MZ");
    let connected = r#"{"event":"connected","protocol":"Call","version":"1.0.0"}"#;
    let start = serde_json::json!({
        "event": "start", "sequenceNumber": "1",
        "start": {
            "accountSid": ctx.twilio.account_sid, "streamSid": stream_sid, "callSid": call_sid,
            "tracks": ["inbound"],
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
            "customParameters": answer.parameters,
        },
        "streamSid": stream_sid,
    });
    for text in [connected.to_string(), start.to_string()] {
        if wr
            .write_frame(Frame::text(Payload::Owned(text.into_bytes())))
            .await
            .is_err()
        {
            res.error = Some("media socket closed at start".into());
            return Err(res);
        }
    }
    let t0 = Instant::now();
    res.started_at = Some(t0);
    let sid = stream_sid.clone();
    let d = Driver {
        ctx: ctx.clone(),
        wr,
        reader: None,
        stream_sid,
        call_sid,
        seq: 1,
        chunk: 0,
        t0,
        end_at: plan.end_at,
        hard_stop: plan.end_at + Duration::from_secs(15),
        tag_b64: STANDARD.encode(tag_frame(plan.idx)),
        buf: Vec::with_capacity(512),
        res,
        phase: Phase::Greeting { since: t0 },
        turn_idx: 0,
        queued_until: t0,
        pending_marks: Default::default(),
        utt_frames: 0,
        barging: false,
        onset: None,
        onset_clear: None,
        last_media: t0,
        last_activity: t0,
    };
    if shard.send(ShardMsg::Join(slot, Box::new(d))).is_err() {
        return Ok(()); // the run is over
    }
    let reader = spawn_reader(rd, shard.clone(), move |f| {
        incoming(f, &sid).map(|m| ShardMsg::In(slot, m))
    });
    let _ = shard.send(ShardMsg::Reader(slot, reader));
    Ok(())
}
