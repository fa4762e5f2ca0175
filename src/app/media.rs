//! The carrier-neutral media socket pump. A carrier's media route hands its upgrade request
//! here (through [`crate::carrier::port::Host::accept_media`]) with its codec: we wait for the
//! stream's `start`, map the carrier's leg id to our call id through the carrier, check the
//! per-call media token before anything else, attach the socket to the call's actor, then
//! shuttle decoded [`MediaEvent`]s to the actor and encoded [`MediaCommand`]s back. Malformed
//! frames are counted and logged; a flood of them ends that call only. A stream that ends
//! without the carrier's `stop` has its leg hung up through the carrier — unless the call's
//! actor refused this stream (a second stream for a live call), which never touches the call.
//!
//! Before authentication a socket costs little: a URL token (Telnyx, Plivo) is checked before
//! the upgrade (401/403 without upgrading), every media socket holds a permit of
//! [`super::App::media_sockets`] (upgraded sockets leave the listener's connection count), a
//! message is capped at [`MAX_FRAME`] while its fragments are read ([`CappedReader`]), and
//! `start` must come within [`START_TIMEOUT`].

use std::sync::Arc;
use std::time::Duration;

use fastwebsockets::{
    Frame, OpCode, Payload, WebSocket, WebSocketError, WebSocketRead, WebSocketWrite,
};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::sync::mpsc;
use tracing::{Instrument, info, warn};

use super::App;
use super::metrics::Metrics;
use crate::call::MediaAttach;
use crate::call::ingress::MediaInput;
use crate::carrier::port::{MediaSocket, TokenSource};
use crate::carrier::{
    CodecError, Leg, MediaCodec, MediaCommand, MediaEvent, SharedCodec, StreamStart,
};
use crate::net::http::{Body, text};
use crate::security::token::TokenError;
use connection::{
    MediaConnection, ReadHalfState, WriteHalfState, authenticate, await_start, read_loop,
    write_loop,
};

mod connection;

pub(crate) type ServerSocket = WebSocket<TokioIo<Upgraded>>;

/// Largest media message accepted (larger ones are counted as bad and dropped; a fragmented
/// one stops being buffered as soon as its fragments pass this size).
pub use crate::carrier::MAX_MEDIA_MESSAGE as MAX_FRAME;
/// Beyond this a single frame cannot be skipped safely and the socket is closed.
const MAX_WIRE_FRAME: usize = 1024 * 1024;
/// How long a carrier has to send `start` after connecting (carriers send it at once).
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(5);
/// Bad frames tolerated in a row / in total before the call is ended.
const MAX_BAD_IN_A_ROW: u32 = 50;
const MAX_BAD_TOTAL: u32 = 500;

/// Bytes of outgoing frames buffered before a write to the socket (a flush follows every
/// burst of commands anyway). A pacer top-up (100 ms: five frames and a mark, ≈ 1.6 KiB as
/// Twilio JSON) fits; the 1 s lead at the start of a reply goes in four writes. Every live call
/// holds one.
const WRITE_BUFFER: usize = 4 * 1024;

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
    let path = crate::security::truncate_for_log(req.uri().path(), 64);
    if !fastwebsockets::upgrade::is_upgrade_request(&req) {
        return text(400, "expected a WebSocket upgrade\n");
    }
    // A token in the URL is checked before anything is upgraded.
    if let TokenSource::Url(t) = &token
        && let Err(e) = app.tokens.precheck(t.as_deref())
    {
        Metrics::inc(&app.metrics.media_rejected);
        app.log_limited(&format!("media socket refused before the upgrade: {e}"));
        return match e {
            TokenError::Missing | TokenError::Malformed => text(401, "media token required\n"),
            _ => text(403, "invalid media token\n"),
        };
    }
    // Every media socket holds a permit until it ends.
    let Ok(permit) = app.media_sockets.clone().try_acquire_owned() else {
        Metrics::inc(&app.metrics.media_rejected);
        app.log_limited("media socket refused: too many media sockets open");
        return text(503, "too many media sockets\n");
    };
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
            app.log_limited(&format!("bad WebSocket upgrade on {path}: {e}"));
            return text(400, "bad WebSocket upgrade\n");
        }
    };
    tokio::spawn(async move {
        match fut.await {
            Ok(ws) => serve(app, ws, carrier, codec, token).await,
            Err(e) => warn!(%path, error = %e, "WebSocket upgrade failed"),
        }
        drop(permit);
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

/// Runs one media socket to its end: wait for `start`, authenticate, attach to the call's
/// actor, then the read loop (in its own task) and the write loop until either ends.
pub async fn serve(
    app: Arc<App>,
    ws: ServerSocket,
    carrier: Arc<dyn crate::carrier::Carrier>,
    mut codec: Box<dyn SharedCodec>,
    token: TokenSource,
) {
    let mut conn = MediaConnection::new(ws);
    let Some(start) = await_start(&mut conn, &app, codec.as_mut()).await else {
        Metrics::inc(&app.metrics.media_rejected);
        app.log_limited("media socket closed before a valid start frame");
        close_policy(&mut conn.write, b"expected start").await;
        return;
    };
    let call = match authenticate(&app, carrier.as_ref(), &token, &start) {
        Ok(call) => call,
        Err(reason) => {
            Metrics::inc(&app.metrics.media_rejected);
            close_policy(&mut conn.write, reason).await;
            return;
        }
    };
    let leg = Leg::new(
        carrier,
        &call.handle.carrier_account,
        &call.leg_id,
        &app.server.public_url,
    );

    let (ev_tx, ev_rx) = mpsc::channel::<MediaInput>(64);
    let (cmd_tx, cmd_rx) = mpsc::channel::<MediaCommand>(512);
    // The actor hands back the call's caller-audio stage, run here on every frame.
    let (ingress_tx, ingress_rx) = tokio::sync::oneshot::channel();
    let attach = MediaAttach {
        start: StreamStart { ..start },
        events: ev_rx,
        commands: cmd_tx,
        leg: leg.clone(),
        ingress: Some(ingress_tx),
    };
    if call.handle.attach(attach).is_err() {
        close_policy(&mut conn.write, b"call ended").await;
        return;
    }

    // The encoder is a copy of the codec as it stands after `start` (it knows the stream id);
    // the original moves into the reader.
    let encoder = codec.clone_box();
    // Set when the carrier said the stream is over (`stop`, or a clean close for carriers that
    // end streams that way). A stream that ends any other way may leave the carrier's call leg
    // up (and billing), so it is hung up through the carrier's REST API.
    let caller_ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let MediaConnection {
        read,
        write,
        owed_tx,
        owed_rx,
        bad,
    } = conn;
    let reader = ReadHalfState {
        read,
        owed_tx,
        bad,
        saw_stop: caller_ended.clone(),
    };
    let reader = tokio::spawn(
        read_loop(app.clone(), reader, codec, ingress_rx, ev_tx).instrument(call.span.clone()),
    );
    let writer = WriteHalfState {
        write,
        owed_rx,
        cmd_rx,
    };
    let span = call.span.clone();
    async move {
        let refused = write_loop(&app, writer, encoder, &call, &leg).await;
        reader.abort();
        if leg.is_transferred() {
            info!("the call was transferred; its leg is the carrier's now");
        } else if refused {
            warn!("the call's actor refused this media stream; the call goes on");
        } else if !leg.is_hung_up() && !caller_ended.load(std::sync::atomic::Ordering::Acquire) {
            warn!("media stream ended without a stop from the carrier; hanging up the call leg");
            leg.hang_up("the media stream dropped");
        }
        info!("media socket closed");
    }
    .instrument(span)
    .await;
}

/// Reads whole messages from a media socket's read half, joining fragments itself so that a
/// message's size is capped while it is read: once the fragments of one message pass `max`
/// bytes the rest are read and discarded (never buffered), and the message is reported as
/// [`CodecError::TooLarge`]. Control frames (ping, pong, close) pass through between fragments.
pub struct CappedReader<S> {
    read: WebSocketRead<S>,
    max: usize,
    /// The message being joined: its opcode, bytes so far (empty once discarding) and its
    /// total size.
    partial: Option<(OpCode, Vec<u8>, usize)>,
    /// The most bytes ever held for one message.
    peak: usize,
}

/// What a [`CappedReader`] yields.
pub enum Message {
    Frame(Frame<'static>),
    TooLarge(usize),
}

impl<S: tokio::io::AsyncRead + Unpin> CappedReader<S> {
    pub fn new(read: WebSocketRead<S>, max: usize) -> Self {
        Self {
            read,
            max,
            partial: None,
            peak: 0,
        }
    }

    /// The most bytes ever held for one message (never more than `max`).
    #[cfg(test)]
    pub(crate) fn peak_buffered(&self) -> usize {
        self.peak
    }

    /// Bytes held for the message being joined (never more than `max`).
    pub fn buffered(&self) -> usize {
        self.partial.as_ref().map_or(0, |(_, b, _)| b.len())
    }

    /// [`Self::read_message`], the frames the protocol obliges us to send (pong, close echo)
    /// queued on `owed` for whoever holds the writer.
    pub async fn read_message_owing(
        &mut self,
        owed: &mpsc::Sender<Frame<'static>>,
    ) -> Result<Message, WebSocketError> {
        self.read_message(&mut |f: Frame<'_>| {
            let tx = owed.clone();
            let owned = own(f);
            async move { tx.send(owned).await.map_err(|_| "writer gone") }
        })
        .await
    }

    /// The next whole message (or control frame); `send_fn` gets the frames the protocol
    /// obliges us to send (pong, close echo).
    pub(crate) async fn read_message<R, E>(
        &mut self,
        send_fn: &mut impl FnMut(Frame<'_>) -> R,
    ) -> Result<Message, WebSocketError>
    where
        E: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
        R: std::future::Future<Output = Result<(), E>>,
    {
        loop {
            let frame = self.read.read_frame(send_fn).await?;
            match frame.opcode {
                OpCode::Text | OpCode::Binary => {
                    if self.partial.is_some() {
                        return Err(WebSocketError::InvalidFragment);
                    }
                    if frame.fin {
                        return Ok(Message::Frame(own(frame)));
                    }
                    let n = frame.payload.len();
                    let bytes = if n > self.max {
                        Vec::new()
                    } else {
                        frame.payload.to_vec()
                    };
                    self.peak = self.peak.max(bytes.len());
                    self.partial = Some((frame.opcode, bytes, n));
                }
                OpCode::Continuation => {
                    let Some((opcode, mut bytes, total)) = self.partial.take() else {
                        return Err(WebSocketError::InvalidContinuationFrame);
                    };
                    let total = total.saturating_add(frame.payload.len());
                    if total > self.max {
                        // Over the cap: stop buffering, keep reading to the end of the message.
                        bytes = Vec::new();
                    } else {
                        bytes.extend_from_slice(&frame.payload);
                        self.peak = self.peak.max(bytes.len());
                    }
                    if !frame.fin {
                        self.partial = Some((opcode, bytes, total));
                        continue;
                    }
                    if total > self.max {
                        return Ok(Message::TooLarge(total));
                    }
                    return Ok(Message::Frame(Frame::new(
                        true,
                        opcode,
                        None,
                        Payload::Owned(bytes),
                    )));
                }
                _ => return Ok(Message::Frame(own(frame))),
            }
        }
    }
}

enum Decoded {
    Event(MediaEvent),
    Nothing,
    Closed,
    Bad(CodecError),
}

fn decode(codec: &mut dyn MediaCodec, message: Message) -> Decoded {
    let frame = match message {
        Message::Frame(f) => f,
        Message::TooLarge(n) => return Decoded::Bad(CodecError::TooLarge(n)),
    };
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
        OpCode::Binary => match codec.decode_binary(&frame.payload) {
            Ok(Some(ev)) => Decoded::Event(ev),
            Ok(None) => Decoded::Nothing,
            Err(e) => Decoded::Bad(e),
        },
        OpCode::Close => Decoded::Closed,
        _ => Decoded::Nothing,
    }
}

/// Closes the socket with a policy-violation close (the socket is refused or done).
async fn close_policy<S: tokio::io::AsyncWrite + Unpin>(
    write: &mut WebSocketWrite<S>,
    reason: &'static [u8],
) {
    let _ = write.write_frame(Frame::close(CLOSE_POLICY, reason)).await;
    let _ = write.flush().await;
}

/// A frame that no longer borrows the reader. The reader hands out its payload as a view of
/// its own buffer (no copy, no allocation); only a borrowed payload is copied.
fn own(f: Frame<'_>) -> Frame<'static> {
    let Frame {
        opcode, payload, ..
    } = f;
    let payload = match payload {
        Payload::Bytes(b) => Payload::Bytes(b),
        Payload::Owned(v) => Payload::Owned(v),
        other => Payload::Owned(other.to_vec()),
    };
    Frame::new(true, opcode, None, payload)
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

#[cfg(test)]
mod tests {
    use super::*;
    use fastwebsockets::Role;

    async fn pair() -> (
        CappedReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>,
        WebSocket<tokio::io::DuplexStream>,
    ) {
        let (server, client) = tokio::io::duplex(1 << 16);
        let mut ws = WebSocket::after_handshake(server, Role::Server);
        ws.set_max_message_size(MAX_WIRE_FRAME);
        let (read, _write) = ws.split(tokio::io::split);
        let client = WebSocket::after_handshake(client, Role::Client);
        (CappedReader::new(read, MAX_FRAME), client)
    }

    /// A frame of a message (`fin` on its last).
    fn part(fin: bool, opcode: OpCode, payload: Vec<u8>) -> Frame<'static> {
        Frame::new(fin, opcode, None, Payload::Owned(payload))
    }

    async fn next(r: &mut CappedReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>) -> Message {
        r.read_message(&mut |_f: Frame<'_>| async { Ok::<_, &'static str>(()) })
            .await
            .expect("message")
    }

    #[tokio::test]
    async fn fragments_are_joined() {
        let (mut r, mut c) = pair().await;
        let w = tokio::spawn(async move {
            c.write_frame(part(false, OpCode::Text, b"ab".to_vec()))
                .await
                .expect("write");
            c.write_frame(part(true, OpCode::Continuation, b"cd".to_vec()))
                .await
                .expect("write");
            c
        });
        match next(&mut r).await {
            Message::Frame(f) => {
                assert_eq!(f.opcode, OpCode::Text);
                assert_eq!(&f.payload[..], b"abcd");
            }
            Message::TooLarge(n) => panic!("too large: {n}"),
        }
        drop(w.await);
    }

    /// Many fragments under the per-frame limit add up to far more than 64 KiB: the reader
    /// stops buffering at the cap (memory stays bounded while reading) and reports the
    /// message as too large; the socket goes on.
    #[tokio::test]
    async fn joined_message_is_capped_while_reading() {
        let (mut r, mut c) = pair().await;
        let w = tokio::spawn(async move {
            let chunk = vec![b'A'; 32 * 1024];
            c.write_frame(part(false, OpCode::Text, chunk.clone()))
                .await
                .expect("write");
            for _ in 0..62 {
                c.write_frame(part(false, OpCode::Continuation, chunk.clone()))
                    .await
                    .expect("write");
            }
            c.write_frame(part(true, OpCode::Continuation, chunk))
                .await
                .expect("write");
            c.write_frame(Frame::text(Payload::Owned(b"next".to_vec())))
                .await
                .expect("write");
            c
        });
        match next(&mut r).await {
            Message::TooLarge(n) => assert_eq!(n, 64 * 32 * 1024),
            Message::Frame(f) => panic!("joined {} bytes", f.payload.len()),
        }
        assert!(r.peak_buffered() <= MAX_FRAME, "held {}", r.peak_buffered());
        match next(&mut r).await {
            Message::Frame(f) => assert_eq!(&f.payload[..], b"next"),
            Message::TooLarge(n) => panic!("too large: {n}"),
        }
        drop(w.await);
    }
}

#[cfg(test)]
mod binary_tests {
    use super::*;
    use crate::carrier::MessageKind;
    use bytes::Bytes;

    /// A codec whose socket carries raw audio as binary messages and JSON as text.
    struct RawAudio;

    impl MediaCodec for RawAudio {
        fn decode(&mut self, frame: &str) -> Result<Option<MediaEvent>, CodecError> {
            match frame {
                "stop" => Ok(Some(MediaEvent::Stop)),
                other => Err(CodecError::UnknownEvent(other.to_string())),
            }
        }
        fn decode_binary(&mut self, frame: &[u8]) -> Result<Option<MediaEvent>, CodecError> {
            Ok(Some(MediaEvent::Audio(Bytes::copy_from_slice(frame))))
        }
    }

    /// A text-only codec (every carrier but Vonage).
    struct TextOnly;

    impl MediaCodec for TextOnly {
        fn decode(&mut self, _frame: &str) -> Result<Option<MediaEvent>, CodecError> {
            Ok(None)
        }
    }

    fn message(opcode: OpCode, payload: &[u8]) -> Message {
        Message::Frame(Frame::new(
            true,
            opcode,
            None,
            Payload::Owned(payload.to_vec()),
        ))
    }

    #[test]
    fn a_binary_message_reaches_a_codec_that_speaks_binary() {
        let mut codec = RawAudio;
        match decode(&mut codec, message(OpCode::Binary, &[1, 2, 3])) {
            Decoded::Event(MediaEvent::Audio(a)) => assert_eq!(&a[..], &[1, 2, 3]),
            _ => panic!("binary audio was not decoded"),
        }
        assert!(matches!(
            decode(&mut codec, message(OpCode::Text, b"stop")),
            Decoded::Event(MediaEvent::Stop)
        ));
    }

    #[test]
    fn a_text_codec_refuses_binary_messages() {
        let mut codec = TextOnly;
        assert!(matches!(
            decode(&mut codec, message(OpCode::Binary, &[0; 160])),
            Decoded::Bad(CodecError::Binary)
        ));
        assert_eq!(codec.encodes(), MessageKind::Text);
    }
}
