//! The carrier-neutral media pump. A carrier's media route hands its upgrade request here
//! (through [`crate::carrier::port::Host::accept_media`]) with its codec; [`serve`] runs the
//! stream on any [`MediaTransport`] (the upgraded socket is a [`WebSocketTransport`]): we wait
//! for the stream's `start`, map the carrier's leg id to our call id through the carrier,
//! check the per-call media token before anything else, attach the stream to the call's actor,
//! then shuttle decoded [`MediaEvent`]s to the actor and encoded [`MediaCommand`]s back.
//! Malformed messages are counted and logged; a flood of them ends that call only. A stream
//! that ends without the carrier's `stop` has its leg hung up through the carrier — unless the
//! call's actor refused this stream (a second stream for a live call), which never touches the
//! call.
//!
//! Before authentication a socket costs little: a URL token (Telnyx, Plivo) is checked before
//! the upgrade (401/403 without upgrading), every media socket holds a permit of
//! [`super::App::media_sockets`] (upgraded sockets leave the listener's connection count), a
//! frame larger than [`MAX_FRAME`] closes the socket before its payload is read, a message is
//! capped at [`MAX_FRAME`] while its fragments are read ([`CappedReader`]), and `start` must
//! come within [`START_TIMEOUT`]. Once authenticated, a frame up to 1 MiB is skipped and
//! counted as bad instead (the call goes on).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{Instrument, info, warn};

use super::App;
use super::metrics::Metrics;
use crate::call::MediaAttach;
use crate::call::ingress::MediaInput;
use crate::carrier::port::{MediaSocket, TokenSource};
use crate::carrier::transport::{CloseCode, MediaReceiver, MediaSender, MediaTransport, Received};
use crate::carrier::{
    CodecError, Leg, MediaCodec, MediaCommand, MediaEvent, SharedCodec, StreamStart,
};
use crate::net::http::{Body, text};
use crate::security::LogLimiter;
use crate::security::token::TokenError;
use connection::{
    MediaConnection, ReadHalfState, WriteHalfState, authenticate, await_start, read_loop,
    write_loop,
};
pub use websocket::{CappedReader, Message, WebSocketTransport};

mod connection;
mod pace;
#[cfg(test)]
mod tests;
mod websocket;

/// Largest media message accepted (larger ones are counted as bad and dropped; a fragmented
/// one stops being buffered as soon as its fragments pass this size).
pub use crate::carrier::MAX_MEDIA_MESSAGE as MAX_FRAME;
/// How long a carrier has to send `start` after connecting (carriers send it at once).
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(5);
/// Bad frames tolerated in a row / in total before the call is ended.
const MAX_BAD_IN_A_ROW: u32 = 50;
const MAX_BAD_TOTAL: u32 = 500;

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
    let app_for_log = app.clone();
    tokio::spawn(async move {
        match fut.await {
            Ok(ws) => serve(app, WebSocketTransport::new(ws), carrier, codec, token).await,
            Err(e) => app_for_log.log_limited(&format!("WebSocket upgrade failed on {path}: {e}")),
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

/// Runs one media stream to its end: wait for `start`, authenticate, attach to the call's
/// actor, then the read loop (in its own task) and the write loop until either ends.
pub async fn serve<T: MediaTransport>(
    app: Arc<App>,
    transport: T,
    carrier: Arc<dyn crate::carrier::Carrier>,
    mut codec: Box<dyn SharedCodec>,
    token: TokenSource,
) {
    let mut conn = MediaConnection::new(transport);
    let Some(start) = await_start(&mut conn, &app, codec.as_mut()).await else {
        Metrics::inc(&app.metrics.media_rejected);
        app.log_limited("media socket closed before a valid start frame");
        close_policy(&mut conn.sender, b"expected start").await;
        return;
    };
    let call = match authenticate(&app, carrier.as_ref(), &token, &start) {
        Ok(call) => call,
        Err(reason) => {
            Metrics::inc(&app.metrics.media_rejected);
            close_policy(&mut conn.sender, reason).await;
            return;
        }
    };
    conn.receiver.authenticated();
    let leg = Leg::new(
        carrier,
        &call.handle.carrier_account,
        &call.leg_id,
        // Transfer documents are fetched from this instance, the call's owner.
        crate::carrier::port::Host::callback_base(app.as_ref()),
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
        close_policy(&mut conn.sender, b"call ended").await;
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
        receiver,
        sender,
        bad,
    } = conn;
    let reader = ReadHalfState {
        receiver,
        bad,
        saw_stop: caller_ended.clone(),
    };
    let reader = tokio::spawn(
        read_loop(app.clone(), reader, codec, ingress_rx, ev_tx).instrument(call.span.clone()),
    );
    let writer = WriteHalfState { sender, cmd_rx };
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

enum Decoded {
    Event(MediaEvent),
    Nothing,
    Closed,
    Bad(CodecError),
}

fn decode(codec: &mut dyn MediaCodec, received: Received<'_>) -> Decoded {
    match received {
        Received::Message(message) => match codec.decode_message(message) {
            Ok(Some(ev)) => Decoded::Event(ev),
            Ok(None) => Decoded::Nothing,
            Err(e) => Decoded::Bad(e),
        },
        Received::Bad(e) => Decoded::Bad(e),
        Received::Closed => Decoded::Closed,
    }
}

/// Closes the transport with a policy-violation close (the stream is refused or done).
async fn close_policy(sender: &mut impl MediaSender, reason: &'static [u8]) {
    sender.close(CloseCode::Policy, reason).await;
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

    /// Counts a bad frame; true when the socket should be closed. Its warning (the first five
    /// of a socket, then at powers of two) goes through `limit`, shared by every socket (a
    /// peer sends bad frames before authentication, from as many sockets as it likes), and
    /// its error text, which may quote the peer, is cut and escaped.
    fn record(&mut self, e: &CodecError, limit: &LogLimiter) -> bool {
        self.in_a_row += 1;
        self.total += 1;
        if (self.total <= 5 || self.total.is_power_of_two())
            && let Some(suppressed) = limit.allow()
        {
            let error = crate::security::truncate_for_log(&e.to_string(), 160);
            warn!(%error, total = self.total, suppressed, "malformed media frame");
        }
        self.in_a_row >= MAX_BAD_IN_A_ROW || self.total >= MAX_BAD_TOTAL
    }
}

#[cfg(test)]
mod log_tests {
    use super::*;
    use std::sync::Mutex;

    /// A log sink for one test's subscriber.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    /// 200 sockets each sending one frame whose event name forges a log line: at most the
    /// limit's 20 lines are written, each one line (the peer's newline and escape sequence
    /// escaped), and the rest are counted.
    #[test]
    fn bad_frame_warnings_are_escaped_and_limited_across_sockets() {
        let sink = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(sink.clone())
            .with_ansi(false)
            .finish();
        let limit = LogLimiter::new(20, Duration::from_secs(3600));
        let forged = "x\n2026-12-02T00:00:00Z ERROR patterd: forged\u{1b}[2J";
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..200 {
                let e = crate::carrier::codec_util::unknown_event(forged);
                assert!(!BadFrames::default().record(&e, &limit));
            }
        });
        let text = String::from_utf8(sink.0.lock().expect("sink").clone()).expect("utf-8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 20, "{text}");
        for l in &lines {
            assert!(
                l.contains("malformed media frame") && l.contains("\\n2026"),
                "{l}"
            );
            assert!(!l.contains('\u{1b}'), "{l:?}");
        }
        let later = std::time::Instant::now() + Duration::from_secs(3601);
        assert_eq!(
            limit.allow_at(later),
            Some(180),
            "the suppressed lines are counted"
        );
    }
}

#[cfg(test)]
mod binary_tests {
    use super::*;
    use crate::carrier::{MediaMessage, MessageKind};
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

    #[test]
    fn a_binary_message_reaches_a_codec_that_speaks_binary() {
        let mut codec = RawAudio;
        match decode(
            &mut codec,
            Received::Message(MediaMessage::Binary(&[1, 2, 3])),
        ) {
            Decoded::Event(MediaEvent::Audio(a)) => assert_eq!(&a[..], &[1, 2, 3]),
            _ => panic!("binary audio was not decoded"),
        }
        assert!(matches!(
            decode(&mut codec, Received::Message(MediaMessage::Text("stop"))),
            Decoded::Event(MediaEvent::Stop)
        ));
    }

    #[test]
    fn a_text_codec_refuses_binary_messages() {
        let mut codec = TextOnly;
        assert!(matches!(
            decode(
                &mut codec,
                Received::Message(MediaMessage::Binary(&[0; 160]))
            ),
            Decoded::Bad(CodecError::Binary)
        ));
        assert_eq!(codec.encodes(), MessageKind::Text);
    }
}
