//! One media stream's connection and the stages of serving it: [`MediaConnection`] (the
//! transport's two halves and the bad-message count), then [`await_start`],
//! [`authenticate`], [`read_loop`] and [`write_loop`], which [`super::serve`] runs in turn.
//! Every stage is generic over the [`MediaTransport`]: it reads whole messages and writes
//! them, the transport keeps its framing and control traffic.

use std::sync::Arc;

use tokio::sync::mpsc;
use tracing::{info_span, warn};

use super::pace::{CallerPace, Paced};
use super::{BadFrames, Decoded, START_TIMEOUT, decode};
use crate::app::App;
use crate::app::metrics::Metrics;
use crate::call::ingress::MediaInput;
use crate::carrier::port::TokenSource;
use crate::carrier::transport::{
    CloseCode, MediaReceiver, MediaSender, MediaTransport, TransportError,
};
use crate::carrier::{
    Leg, MediaCodec, MediaCommand, MediaEvent, MessageKind, SharedCodec, StreamStart,
};

/// One media stream's transport, split, and the count of malformed messages.
pub(super) struct MediaConnection<T: MediaTransport> {
    pub(super) receiver: T::Receiver,
    pub(super) sender: T::Sender,
    pub(super) bad: BadFrames,
}

impl<T: MediaTransport> MediaConnection<T> {
    pub(super) fn new(transport: T) -> Self {
        let (receiver, sender) = transport.split();
        Self {
            receiver,
            sender,
            bad: BadFrames::default(),
        }
    }
}

/// Waits up to [`START_TIMEOUT`] for the stream's `start`; `None` when the socket closed, the
/// stream stopped or too many frames were malformed first. Owed control frames go out after.
pub(super) async fn await_start<T: MediaTransport>(
    conn: &mut MediaConnection<T>,
    app: &App,
    codec: &mut dyn MediaCodec,
) -> Option<StreamStart> {
    let MediaConnection {
        receiver,
        sender,
        bad,
    } = conn;
    let start = tokio::time::timeout(START_TIMEOUT, async {
        loop {
            match receiver.recv().await {
                Err(_) => return None,
                Ok(received) => match decode(codec, received) {
                    Decoded::Event(MediaEvent::Start(s)) => return Some(s),
                    Decoded::Event(MediaEvent::Stop) | Decoded::Closed => return None,
                    Decoded::Event(_) | Decoded::Nothing => {}
                    Decoded::Bad(e) => {
                        Metrics::inc(&app.metrics.media_frames_bad);
                        if bad.record(&e, &app.peer_warnings) {
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
    // Anything the receiver owed the peer (pong, close echo) goes out now.
    while let Some(owed) = sender.try_owed() {
        sender.write_owed(owed).await;
    }
    let _ = sender.flush().await;
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
pub(super) struct ReadHalfState<R> {
    pub(super) receiver: R,
    pub(super) bad: BadFrames,
    /// Set when the carrier said the stream is over.
    pub(super) saw_stop: Arc<std::sync::atomic::AtomicBool>,
}

/// Decodes caller messages into events for the actor (caller audio through the call's
/// caller-audio stage, paced against the clock by a [`CallerPace`]) until the socket closes,
/// the stream stops, too many frames are bad or the caller keeps flooding the socket with
/// audio (the call is then hung up and the socket closed with a policy close).
pub(super) async fn read_loop<R: MediaReceiver>(
    app: Arc<App>,
    mut r: ReadHalfState<R>,
    mut codec: Box<dyn SharedCodec>,
    ingress_rx: tokio::sync::oneshot::Receiver<crate::call::ingress::CallerIngress>,
    ev_tx: mpsc::Sender<MediaInput>,
) {
    // Without it (the actor refused this stream) events go on raw, and fail.
    let mut ingress = ingress_rx.await.ok();
    let mut pace = CallerPace::new(tokio::time::Instant::now());
    loop {
        let received = match r.receiver.recv().await {
            Ok(received) => received,
            Err(TransportError::Closed) => return,
            Err(e) => {
                warn!(error = %e, "media socket read failed");
                return;
            }
        };
        match decode(codec.as_mut(), received) {
            Decoded::Event(ev) => {
                r.bad.ok();
                let stop = ev == MediaEvent::Stop;
                if stop {
                    r.saw_stop.store(true, std::sync::atomic::Ordering::Release);
                }
                // Caller audio goes through the stage; the actor hears its notes.
                let msg = match (ev, ingress.as_mut()) {
                    (MediaEvent::Audio(frame), Some(stage)) => {
                        let now = tokio::time::Instant::now();
                        match pace.admit(frame.len(), now) {
                            Paced::Pass => {}
                            Paced::Drop => {
                                Metrics::inc(&app.metrics.media_frames_paced);
                                let n = pace.dropped();
                                if n == 1 || (n.is_power_of_two() && n >= 1024) {
                                    warn!(
                                        dropped = n,
                                        "caller audio faster than real time; frames dropped"
                                    );
                                    let _ = ev_tx.try_send(MediaInput::Paced { dropped: n });
                                }
                                continue;
                            }
                            Paced::Close => {
                                Metrics::inc(&app.metrics.media_frames_paced);
                                Metrics::inc(&app.metrics.media_floods);
                                warn!(
                                    dropped = pace.dropped(),
                                    "the caller kept sending audio faster than real time; ending the call"
                                );
                                // The policy close is queued first: the writer sends it
                                // before the close of the call's end, which the actor hears
                                // of before the media channel closes.
                                r.receiver
                                    .close(CloseCode::Policy, b"audio faster than real time")
                                    .await;
                                let dropped = pace.dropped();
                                let _ = ev_tx.send(MediaInput::Flooded { dropped }).await;
                                return;
                            }
                        }
                        match stage.frame(frame, now) {
                            Some(note) => MediaInput::Caller(note),
                            None => continue,
                        }
                    }
                    (ev, _) => MediaInput::Media(ev),
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
                if r.bad.record(&e, &app.peer_warnings) {
                    warn!(
                        bad_total = r.bad.total,
                        "too many malformed media frames; ending this call"
                    );
                    r.receiver
                        .close(CloseCode::Policy, b"malformed frames")
                        .await;
                    return;
                }
            }
        }
    }
}

/// The writer's part of a [`MediaConnection`], and the actor's commands.
pub(super) struct WriteHalfState<S> {
    pub(super) sender: S,
    pub(super) cmd_rx: mpsc::Receiver<MediaCommand>,
}

/// Writes the actor's commands (and the call's progress, for a client that shows it) until
/// the actor drops its command channel or the socket fails, then closes the socket. True when
/// the actor refused this stream while its call goes on.
pub(super) async fn write_loop<S: MediaSender>(
    app: &App,
    mut w: WriteHalfState<S>,
    mut encoder: Box<dyn SharedCodec>,
    call: &AuthenticatedCall,
    leg: &Leg,
) -> bool {
    // A client that shows the call's progress (the browser phone) gets it on this socket.
    // (The channel only then: its first block would be 2.5 KiB of every call.)
    let (progress, mut progress_rx) = if encoder.wants_progress() {
        let (tx, rx) = mpsc::channel(crate::app::progress::QUEUE);
        let view = encoder.progress_view();
        let watch = tokio::spawn(crate::app::progress::watch(call.handle.clone(), view, tx));
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
                        let kind = encoder.encodes_command(&cmd);
                        if w.sender.send(kind, &out).await.is_err() {
                            break;
                        }
                        unflushed = true;
                    }
                }
            },
            Some(p) = async { progress_rx.as_mut()?.recv().await }, if progress.is_some() => {
                if let Some(text) = encoder.encode_progress(&p) {
                    if w.sender.send(MessageKind::Text, text.as_bytes()).await.is_err() {
                        break;
                    }
                    unflushed = true;
                }
            }
            owed = w.sender.next_owed() => match owed {
                Some(owed) => {
                    let closed = w.sender.write_owed(owed).await;
                    unflushed = true;
                    if closed { break; }
                }
                // The receiver is gone: the peer left or the stream stopped.
                None => break,
            },
        }
        // The rest of a burst is already queued: write it before flushing.
        if unflushed && w.cmd_rx.is_empty() {
            if w.sender.flush().await.is_err() {
                break;
            }
            unflushed = false;
        }
    }
    // What the receiver still owes the peer goes first (a close it asked for: the reason the
    // socket ends, when the read side ended it).
    while !w.sender.is_closed()
        && let Some(owed) = w.sender.try_owed()
    {
        w.sender.write_owed(owed).await;
    }
    if w.sender.is_closed() {
        let _ = w.sender.flush().await;
    } else {
        let reason: &[u8] = if leg.is_hung_up() { b"call ended" } else { b"" };
        w.sender.close(CloseCode::Normal, reason).await;
    }
    refused
}
