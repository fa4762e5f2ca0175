//! One media socket's connection and the stages of serving it: [`MediaConnection`] (framing,
//! the message cap, the owed control frames, bad-frame counting), then [`await_start`],
//! [`authenticate`], [`read_loop`] and [`write_loop`], which [`super::serve`] runs in turn.

use std::sync::Arc;

use fastwebsockets::{Frame, OpCode, Payload, WebSocketError, WebSocketWrite};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::sync::mpsc;
use tracing::{info_span, warn};

use super::{
    BadFrames, CLOSE_NORMAL, CLOSE_POLICY, CappedReader, Decoded, MAX_FRAME, PRE_AUTH_WIRE_FRAME,
    START_TIMEOUT, ServerSocket, WRITE_BUFFER, decode,
};
use crate::app::App;
use crate::app::metrics::Metrics;
use crate::call::ingress::Inbound;
use crate::carrier::port::TokenSource;
use crate::carrier::{
    Leg, MediaCodec, MediaCommand, MediaEvent, MessageKind, SharedCodec, StreamStart,
};

pub(super) type SocketRead = CappedReader<tokio::io::ReadHalf<TokioIo<Upgraded>>>;
pub(super) type SocketWrite =
    WebSocketWrite<tokio::io::BufWriter<tokio::io::WriteHalf<TokioIo<Upgraded>>>>;

/// One media socket's framing: messages capped at [`MAX_FRAME`] while read, writes buffered
/// and flushed per burst, the control frames the reader owes the peer (pong, close echo)
/// handed to the writer, and the count of malformed frames.
pub(super) struct MediaConnection {
    pub(super) read: SocketRead,
    pub(super) write: SocketWrite,
    pub(super) owed_tx: mpsc::Sender<Frame<'static>>,
    pub(super) owed_rx: mpsc::Receiver<Frame<'static>>,
    pub(super) bad: BadFrames,
}

impl MediaConnection {
    pub(super) fn new(mut ws: ServerSocket) -> Self {
        ws.set_auto_close(true);
        ws.set_auto_pong(true);
        // Until the socket is authenticated no frame over MAX_FRAME is read at all.
        ws.set_max_message_size(PRE_AUTH_WIRE_FRAME);
        // Writes go to a buffer that is flushed once the actor's burst of commands is written
        // (one syscall for a pacer top-up of several frames and its mark).
        let (read, write) = ws.split(|s| {
            let (r, w) = tokio::io::split(s);
            (r, tokio::io::BufWriter::with_capacity(WRITE_BUFFER, w))
        });
        let (owed_tx, owed_rx) = mpsc::channel::<Frame<'static>>(8);
        Self {
            read: CappedReader::new(read, MAX_FRAME),
            write,
            owed_tx,
            owed_rx,
            bad: BadFrames::default(),
        }
    }
}

/// Waits up to [`START_TIMEOUT`] for the stream's `start`; `None` when the socket closed, the
/// stream stopped or too many frames were malformed first. Owed control frames go out after.
pub(super) async fn await_start(
    conn: &mut MediaConnection,
    app: &App,
    codec: &mut dyn MediaCodec,
) -> Option<StreamStart> {
    let MediaConnection {
        read,
        write,
        owed_tx,
        owed_rx,
        bad,
    } = conn;
    let start = tokio::time::timeout(START_TIMEOUT, async {
        loop {
            let frame = read.read_message_owing(owed_tx).await;
            match frame {
                Err(_) => return None,
                Ok(f) => match decode(codec, f) {
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
    while let Ok(f) = owed_rx.try_recv() {
        let _ = write.write_frame(f).await;
    }
    let _ = write.flush().await;
    start
}

/// The live call a media socket authenticated for.
pub(super) struct AuthenticatedCall {
    /// Our id for the call (the actor's key).
    pub(super) call_id: String,
    /// The carrier's id for the leg (REST commands use it).
    pub(super) leg_id: String,
    pub(super) span: tracing::Span,
    pub(super) handle: crate::call::CallHandle,
}

/// Checks the media token for the call `start` names and finds the live call; the close
/// reason when the socket is refused.
pub(super) fn authenticate(
    app: &App,
    carrier: &dyn crate::carrier::Carrier,
    token: &TokenSource,
    start: &StreamStart,
) -> Result<AuthenticatedCall, &'static [u8]> {
    let token_value = match token {
        TokenSource::Url(t) => t.clone(),
        TokenSource::StartParameter => start.custom_parameters.get("token").cloned(),
    };
    // The carrier's id for the leg and ours: the carrier says when they differ (Plivo calls
    // we placed are ours by request_uuid).
    let leg_id = start.call_id.clone();
    let call_id = carrier
        .call_id_for_leg(&app.outbound, &leg_id)
        .unwrap_or_else(|| leg_id.clone());
    let span = info_span!(
        "call",
        call_id = %crate::security::truncate_for_log(&call_id, crate::security::LOG_FIELD_MAX)
    );
    if let Err(e) = app.tokens.redeem(&call_id, token_value.as_deref()) {
        if let Some(suppressed) = app.peer_warnings.allow() {
            warn!(parent: &span, error = %e, suppressed, "media socket refused");
        }
        return Err(b"invalid media token");
    }
    let Some(handle) = app.calls.get(&call_id) else {
        warn!(parent: &span, "media socket for a call that is not live");
        return Err(b"unknown call");
    };
    Ok(AuthenticatedCall {
        call_id,
        leg_id,
        span,
        handle,
    })
}

/// The reader's part of a [`MediaConnection`].
pub(super) struct ReadHalfState {
    pub(super) read: SocketRead,
    pub(super) owed_tx: mpsc::Sender<Frame<'static>>,
    pub(super) bad: BadFrames,
    /// Set when the carrier said the stream is over.
    pub(super) saw_stop: Arc<std::sync::atomic::AtomicBool>,
}

/// Decodes caller messages into events for the actor (caller audio through the call's
/// caller-audio stage) until the socket closes, the stream stops or too many frames are bad.
pub(super) async fn read_loop(
    app: Arc<App>,
    mut r: ReadHalfState,
    mut codec: Box<dyn SharedCodec>,
    ingress_rx: tokio::sync::oneshot::Receiver<crate::call::ingress::CallerIngress>,
    ev_tx: mpsc::Sender<Inbound>,
) {
    // Without it (the actor refused this stream) events go on raw, and fail.
    let mut ingress = ingress_rx.await.ok();
    loop {
        let frame = match r.read.read_message_owing(&r.owed_tx).await {
            Ok(f) => f,
            Err(WebSocketError::ConnectionClosed) => return,
            Err(e) => {
                warn!(error = %e, "media socket read failed");
                return;
            }
        };
        match decode(codec.as_mut(), frame) {
            Decoded::Event(ev) => {
                r.bad.ok();
                let stop = ev == MediaEvent::Stop;
                if stop {
                    r.saw_stop.store(true, std::sync::atomic::Ordering::Release);
                }
                // Caller audio goes through the stage; the actor hears its notes.
                let msg = match (ev, ingress.as_mut()) {
                    (MediaEvent::Audio(frame), Some(stage)) => {
                        match stage.frame(frame, tokio::time::Instant::now()) {
                            Some(note) => Inbound::Caller(note),
                            None => continue,
                        }
                    }
                    (ev, _) => Inbound::Media(ev),
                };
                if ev_tx.send(msg).await.is_err() || stop {
                    return;
                }
            }
            Decoded::Nothing => r.bad.ok(),
            Decoded::Closed => {
                // Carriers that end streams by closing the socket (Plivo): that close is the
                // caller hanging up.
                if codec.stop_on_close() {
                    r.saw_stop.store(true, std::sync::atomic::Ordering::Release);
                    let _ = ev_tx.send(MediaEvent::Stop.into()).await;
                }
                return;
            }
            Decoded::Bad(e) => {
                Metrics::inc(&app.metrics.media_frames_bad);
                if r.bad.record(&e) {
                    warn!(
                        bad_total = r.bad.total,
                        "too many malformed media frames; ending this call"
                    );
                    let _ = r
                        .owed_tx
                        .send(Frame::close(CLOSE_POLICY, b"malformed frames"))
                        .await;
                    return;
                }
            }
        }
    }
}

/// The writer's part of a [`MediaConnection`], and the actor's commands.
pub(super) struct WriteHalfState {
    pub(super) write: SocketWrite,
    pub(super) owed_rx: mpsc::Receiver<Frame<'static>>,
    pub(super) cmd_rx: mpsc::Receiver<MediaCommand>,
}

/// Writes the actor's commands (and the call's progress, for a client that shows it) until
/// the actor drops its command channel or the socket fails, then closes the socket. True when
/// the actor refused this stream while its call goes on.
pub(super) async fn write_loop(
    app: &App,
    mut w: WriteHalfState,
    mut encoder: Box<dyn SharedCodec>,
    call: &AuthenticatedCall,
    leg: &Leg,
) -> bool {
    // A client that shows the call's progress (the browser phone) gets it on this socket.
    // (The channel only then: its first block would be 2.5 KiB of every call.)
    let (progress, mut progress_rx) = if encoder.wants_progress() {
        let (tx, rx) = mpsc::channel(crate::app::progress::QUEUE);
        let watch = tokio::spawn(crate::app::progress::watch(call.handle.clone(), tx));
        (Some(crate::util::TaskGuard::new(watch)), Some(rx))
    } else {
        (None, None)
    };
    // The outgoing frame being built (reused: no allocation per frame).
    let mut out = Vec::with_capacity(1024);
    // Frames written to the buffer and not yet flushed to the socket.
    let mut unflushed = false;
    let mut refused = false;
    loop {
        tokio::select! {
            cmd = w.cmd_rx.recv() => match cmd {
                None => {
                    // The actor dropped our command channel: the call ended (its leg was hung
                    // up), or, while the call is still live, the actor refused this stream
                    // (the call has another one) and its leg must not be hung up.
                    refused = !leg.is_hung_up() && app.calls.get(&call.call_id).is_some();
                    break;
                }
                Some(cmd) => {
                    if encoder.encode_into(&cmd, &mut out) {
                        let payload = Payload::Borrowed(&out);
                        let frame = match encoder.encodes_command(&cmd) {
                            MessageKind::Text => Frame::text(payload),
                            MessageKind::Binary => Frame::binary(payload),
                        };
                        if w.write.write_frame(frame).await.is_err() {
                            break;
                        }
                        unflushed = true;
                    }
                }
            },
            Some(p) = async { progress_rx.as_mut()?.recv().await }, if progress.is_some() => {
                if let Some(text) = encoder.encode_progress(&p) {
                    if w.write.write_frame(Frame::text(Payload::Owned(text.into_bytes()))).await.is_err() {
                        break;
                    }
                    unflushed = true;
                }
            }
            f = w.owed_rx.recv() => match f {
                Some(f) => {
                    let close = f.opcode == OpCode::Close;
                    let _ = w.write.write_frame(f).await;
                    unflushed = true;
                    if close { break; }
                }
                None => break,
            },
        }
        // The rest of a burst is already queued: write it before flushing.
        if unflushed && w.cmd_rx.is_empty() {
            if w.write.flush().await.is_err() {
                break;
            }
            unflushed = false;
        }
    }
    if !w.write.is_closed() {
        let reason: &[u8] = if leg.is_hung_up() { b"call ended" } else { b"" };
        let _ = w
            .write
            .write_frame(Frame::close(CLOSE_NORMAL, reason))
            .await;
    }
    let _ = w.write.flush().await;
    refused
}
