//! The carrier-neutral media socket pump. A carrier's media route hands its upgrade request
//! here (through [`crate::carrier::port::Host::accept_media`]) with its codec: we wait for the
//! stream's `start`, map the carrier's leg id to our call id through the carrier, check the
//! per-call media token before anything else, attach the socket to the call's actor, then
//! shuttle decoded [`MediaEvent`]s to the actor and encoded [`MediaCommand`]s back. Malformed
//! frames are counted and logged; a flood of them ends that call only. A stream that ends
//! without the carrier's `stop` has its leg hung up through the carrier.

use std::sync::Arc;
use std::time::Duration;

use fastwebsockets::{Frame, OpCode, Payload, WebSocket, WebSocketError};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::sync::mpsc;
use tracing::{Instrument, info, info_span, warn};

use super::App;
use super::metrics::Metrics;
use crate::call::MediaAttach;
use crate::carrier::port::{MediaSocket, TokenSource};
use crate::carrier::{CodecError, MediaCodec, MediaCommand, MediaEvent, SharedCodec, StreamStart};
use crate::net::http::{Body, text};

pub type ServerSocket = WebSocket<TokioIo<Upgraded>>;

/// Largest media frame accepted as a frame (larger ones are counted as bad and dropped).
pub const MAX_FRAME: usize = 64 * 1024;
/// Beyond this a frame cannot be skipped safely and the socket is closed.
const MAX_WIRE_FRAME: usize = 1024 * 1024;
/// How long a carrier has to send `start` after connecting.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Bad frames tolerated in a row / in total before the call is ended.
const MAX_BAD_IN_A_ROW: u32 = 50;
const MAX_BAD_TOTAL: u32 = 500;

/// WebSocket close codes we use.
const CLOSE_NORMAL: u16 = 1000;
const CLOSE_POLICY: u16 = 1008;

/// Upgrades a carrier's media WebSocket request and serves it with `codec` in the background.
/// `subprotocol`, when the client offers it in `Sec-WebSocket-Protocol`, is selected in the
/// response (Plivo's `audio.drachtio.org`). Answers 400 to anything that is not an upgrade.
pub fn accept(
    app: Arc<App>,
    mut req: hyper::Request<hyper::body::Incoming>,
    socket: MediaSocket,
) -> hyper::Response<Body> {
    let MediaSocket {
        carrier,
        codec,
        token,
        subprotocol,
    } = socket;
    let path = req.uri().path().to_string();
    if !fastwebsockets::upgrade::is_upgrade_request(&req) {
        return text(400, "expected a WebSocket upgrade\n");
    }
    let offered = subprotocol.filter(|want| {
        req.headers()
            .get_all(hyper::header::SEC_WEBSOCKET_PROTOCOL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|p| p.trim().eq_ignore_ascii_case(want))
    });
    let (resp, fut) = match fastwebsockets::upgrade::upgrade(&mut req) {
        Ok(x) => x,
        Err(e) => {
            warn!(%path, error = %e, "bad WebSocket upgrade");
            return text(400, "bad WebSocket upgrade\n");
        }
    };
    tokio::spawn(async move {
        match fut.await {
            Ok(ws) => serve(app, ws, carrier, codec, token).await,
            Err(e) => warn!(%path, error = %e, "WebSocket upgrade failed"),
        }
    });
    let (mut parts, _) = resp.into_parts();
    if let Some(p) = offered {
        parts.headers.insert(
            hyper::header::SEC_WEBSOCKET_PROTOCOL,
            hyper::header::HeaderValue::from_static(p),
        );
    }
    hyper::Response::from_parts(parts, Body::default())
}

/// Runs one media socket to its end.
pub async fn serve(
    app: Arc<App>,
    mut ws: ServerSocket,
    carrier: Arc<dyn crate::carrier::Carrier>,
    mut codec: Box<dyn SharedCodec>,
    token: TokenSource,
) {
    ws.set_auto_close(true);
    ws.set_auto_pong(true);
    ws.set_max_message_size(MAX_WIRE_FRAME);
    let (read, mut write) = ws.split(tokio::io::split);
    let mut read = fastwebsockets::FragmentCollectorRead::new(read);
    let (obligated_tx, mut obligated_rx) = mpsc::channel::<Frame<'static>>(8);
    let mut bad = BadFrames::default();

    // 1. Wait for `start`.
    let start = tokio::time::timeout(START_TIMEOUT, async {
        loop {
            let frame = read
                .read_frame(&mut |f: Frame<'_>| {
                    let tx = obligated_tx.clone();
                    let owned = own(f);
                    async move { tx.send(owned).await.map_err(|_| "writer gone") }
                })
                .await;
            match frame {
                Err(_) => return None,
                Ok(f) => match decode(codec.as_mut(), f) {
                    Decoded::Event(MediaEvent::Start(s)) => return Some(s),
                    Decoded::Event(MediaEvent::Stop) | Decoded::Closed => return None,
                    Decoded::Event(_) | Decoded::Nothing => {}
                    Decoded::Bad(e) => {
                        Metrics::inc(&app.metrics.media_frames_bad);
                        if bad.record(&e) {
                            return None;
                        }
                    }
                },
            }
        }
    })
    .await
    .ok()
    .flatten();
    // Any control frame the reader owed (pong, close echo) goes out now.
    while let Ok(f) = obligated_rx.try_recv() {
        let _ = write.write_frame(f).await;
    }
    let Some(start) = start else {
        Metrics::inc(&app.metrics.media_rejected);
        warn!("media socket closed before a valid start frame");
        let _ = write
            .write_frame(Frame::close(CLOSE_POLICY, b"expected start"))
            .await;
        return;
    };

    // 2. The token must be valid for this call, and the call must be ours, before anything
    //    else happens.
    let token_value = match &token {
        TokenSource::Url(t) => t.clone(),
        TokenSource::StartParameter => start.custom_parameters.get("token").cloned(),
    };
    // The carrier's id for the leg (REST hang-ups use it) and ours (the actor's key): the
    // carrier says when they differ (Plivo calls we placed are ours by request_uuid).
    let leg_id = start.call_id.clone();
    let call_id = carrier
        .call_id_for_leg(&app.outbound, &leg_id)
        .unwrap_or_else(|| leg_id.clone());
    let span = info_span!("call", call_id = %call_id);
    if let Err(e) = app.tokens.redeem(&call_id, token_value.as_deref()) {
        Metrics::inc(&app.metrics.media_rejected);
        warn!(parent: &span, error = %e, "media socket refused");
        let _ = write
            .write_frame(Frame::close(CLOSE_POLICY, b"invalid media token"))
            .await;
        return;
    }
    let Some(handle) = app.calls.get(&call_id) else {
        Metrics::inc(&app.metrics.media_rejected);
        warn!(parent: &span, "media socket for a call that is not live");
        let _ = write
            .write_frame(Frame::close(CLOSE_POLICY, b"unknown call"))
            .await;
        return;
    };

    let account = handle.carrier_account.to_string();
    let control = carrier.has_account(&account).then_some(carrier);

    // 3. Attach to the actor and pump.
    let (ev_tx, ev_rx) = mpsc::channel::<MediaEvent>(64);
    let (cmd_tx, mut cmd_rx) = mpsc::channel::<MediaCommand>(512);
    let attach = MediaAttach {
        start: StreamStart { ..start },
        events: ev_rx,
        commands: cmd_tx,
    };
    if handle.attach(attach).is_err() {
        let _ = write
            .write_frame(Frame::close(CLOSE_POLICY, b"call ended"))
            .await;
        return;
    }

    // The encoder is a copy of the codec as it stands after `start` (it knows the stream id);
    // the original moves into the reader.
    let mut encoder = codec.clone_box();
    let reader_app = app.clone();
    // Set when the carrier said the stream is over (`stop`, or a clean close for carriers that
    // end streams that way). A stream that ends any other way may leave the carrier's call leg
    // up (and billing), so it is hung up through the carrier's REST API.
    let caller_ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader_saw_stop = caller_ended.clone();
    let reader = tokio::spawn(
        async move {
            loop {
                let frame = read
                    .read_frame(&mut |f: Frame<'_>| {
                        let tx = obligated_tx.clone();
                        let owned = own(f);
                        async move { tx.send(owned).await.map_err(|_| "writer gone") }
                    })
                    .await;
                let frame = match frame {
                    Ok(f) => f,
                    Err(WebSocketError::ConnectionClosed) => return,
                    Err(e) => {
                        warn!(error = %e, "media socket read failed");
                        return;
                    }
                };
                match decode(codec.as_mut(), frame) {
                    Decoded::Event(ev) => {
                        bad.ok();
                        let stop = ev == MediaEvent::Stop;
                        if stop {
                            reader_saw_stop.store(true, std::sync::atomic::Ordering::Release);
                        }
                        if ev_tx.send(ev).await.is_err() || stop {
                            return;
                        }
                    }
                    Decoded::Nothing => bad.ok(),
                    Decoded::Closed => {
                        // Carriers that end streams by closing the socket (Plivo): that close
                        // is the caller hanging up.
                        if codec.stop_on_close() {
                            reader_saw_stop.store(true, std::sync::atomic::Ordering::Release);
                            let _ = ev_tx.send(MediaEvent::Stop).await;
                        }
                        return;
                    }
                    Decoded::Bad(e) => {
                        Metrics::inc(&reader_app.metrics.media_frames_bad);
                        if bad.record(&e) {
                            warn!(
                                bad_total = bad.total,
                                "too many malformed media frames; ending this call"
                            );
                            let _ = obligated_tx
                                .send(Frame::close(CLOSE_POLICY, b"malformed frames"))
                                .await;
                            return;
                        }
                    }
                }
            }
        }
        .instrument(span.clone()),
    );

    async move {
        let mut hung_up = false;
        let hang_up_leg = |why: &'static str| {
            if let Some(c) = &control {
                let hang_up = c.hang_up(&account, &leg_id);
                // The REST call must not hold up closing the socket.
                tokio::spawn(
                    async move {
                        if let Err(e) = hang_up.await {
                            warn!(error = %e, why, "carrier hang-up request failed");
                        }
                    }
                    .in_current_span(),
                );
            }
        };
        loop {
            tokio::select! {
                cmd = cmd_rx.recv() => match cmd {
                    None => break,
                    Some(MediaCommand::HangUp) => {
                        hung_up = true;
                        hang_up_leg("the call ended");
                        break;
                    }
                    Some(cmd) => {
                        if let Some(text) = encoder.encode(&cmd)
                            && write.write_frame(Frame::text(Payload::Owned(text.into_bytes()))).await.is_err()
                        {
                            break;
                        }
                    }
                },
                f = obligated_rx.recv() => match f {
                    Some(f) => {
                        let close = f.opcode == OpCode::Close;
                        let _ = write.write_frame(f).await;
                        if close { break; }
                    }
                    None => break,
                },
            }
        }
        if !write.is_closed() {
            let _ = write
                .write_frame(Frame::close(CLOSE_NORMAL, if hung_up { b"call ended" } else { b"" }))
                .await;
        }
        reader.abort();
        if !hung_up && !caller_ended.load(std::sync::atomic::Ordering::Acquire) {
            warn!("media stream ended without a stop from the carrier; hanging up the call leg");
            hang_up_leg("the media stream dropped");
        }
        info!("media socket closed");
    }
    .instrument(span)
    .await;
}

enum Decoded {
    Event(MediaEvent),
    Nothing,
    Closed,
    Bad(CodecError),
}

fn decode(codec: &mut dyn MediaCodec, frame: Frame<'_>) -> Decoded {
    match frame.opcode {
        OpCode::Text => {
            if frame.payload.len() > MAX_FRAME {
                return Decoded::Bad(CodecError::TooLarge(frame.payload.len()));
            }
            match std::str::from_utf8(&frame.payload) {
                Ok(s) => match codec.decode(s) {
                    Ok(Some(ev)) => Decoded::Event(ev),
                    Ok(None) => Decoded::Nothing,
                    Err(e) => Decoded::Bad(e),
                },
                Err(_) => Decoded::Bad(CodecError::BadJson("not UTF-8".into())),
            }
        }
        OpCode::Binary => Decoded::Bad(CodecError::Binary),
        OpCode::Close => Decoded::Closed,
        _ => Decoded::Nothing,
    }
}

fn own(f: Frame<'_>) -> Frame<'static> {
    Frame::new(true, f.opcode, None, Payload::Owned(f.payload.to_vec()))
}

#[derive(Default)]
struct BadFrames {
    in_a_row: u32,
    total: u32,
}

impl BadFrames {
    fn ok(&mut self) {
        self.in_a_row = 0;
    }

    /// Counts a bad frame; true when the socket should be closed.
    fn record(&mut self, e: &CodecError) -> bool {
        self.in_a_row += 1;
        self.total += 1;
        if self.total <= 5 || self.total.is_power_of_two() {
            warn!(error = %e, total = self.total, "malformed media frame");
        }
        self.in_a_row >= MAX_BAD_IN_A_ROW || self.total >= MAX_BAD_TOTAL
    }
}
