//! The one session loop of the streaming speech-to-text kinds (Deepgram v1 and Flux,
//! AssemblyAI, OpenAI Realtime): [`open`] returns the [`SttStream`] at once and a task
//! connects (10 s budget) while audio waits in the bounded input channel, then runs one
//! `select!` over the call's input, the vendor's frames, the keep-alive timer, the wait for the
//! vendor's confirmation and the drain after a close. What differs per vendor — the URL and
//! headers, how input becomes frames, how frames become [`SttEvent`]s, the texts of its
//! failures — is its [`SttWire`], which only answers with [`Step`]s; the loop does the I/O.
//!
//! The rules every vendor shares: a handshake failure is one fatal error (the vendor's
//! message); [`SttEvent::Connected`] goes out when the vendor is ready (at the handshake, or
//! at [`Step::Ready`]), and input is read only from then on; a failed send is fatal; after a
//! [`Step::Close`] that drains, the vendor's last results are read for up to 5 s and its
//! normal close (1000) or a dropped socket is the end, not an error; any other close, or a
//! lost socket, is fatal. [`SttEvent::Closed`] always ends the stream.

use std::borrow::Cow;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{SttEvent, SttInput, SttStream};
use crate::net::ws_client::{self, WsConnectError};
use crate::net::ws_pump::{self, WsIn};
use crate::util::TaskGuard;

/// The handshake's budget (and, for a vendor that confirms later, the confirmation's).
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// After a draining close, how long to wait for the vendor's last results and close.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Input queue: about 20 s of 20 ms carrier frames, enough to cover the connect.
const INPUT_QUEUE: usize = 1024;
const EVENT_QUEUE: usize = 256;

/// A frame for the vendor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame {
    Text(Cow<'static, str>),
    Binary(Bytes),
}

/// What the loop is to do, in order, for one input or one vendor frame.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    /// Send this frame (a failure ends the session with "{NAME} send failed").
    Send(Frame),
    /// Report this event to the call.
    Event(SttEvent),
    /// The vendor confirmed the session: report [`SttEvent::Connected`] and read input.
    Ready,
    /// The session is ending: with `drain`, stop reading input and wait for the vendor's
    /// close; without, close the socket now and end.
    Close { drain: bool },
    /// A fatal error: report it and end (the socket is dropped).
    Fail(String),
}

/// One streaming vendor's framing and parsing for [`open`]. Its `&mut self` is the session's
/// vendor state (request id, pending audio, partial transcripts, …).
pub(crate) trait SttWire: Send + 'static {
    /// The vendor as messages name it ("Deepgram", "OpenAI Realtime").
    const NAME: &'static str;
    fn url(&self) -> &str;
    /// The handshake's request headers.
    fn headers(&self) -> Vec<(&'static str, String)>;
    /// The fatal error for a failed handshake, saying what to check.
    fn handshake_message(&self, e: &WsConnectError) -> String;
    /// The handshake's response headers (a request id to name in later errors).
    fn connected(&mut self, _headers: &http::HeaderMap) {}
    /// False when the vendor confirms the session later ([`Step::Ready`]); input waits.
    fn ready_at_connect(&self) -> bool {
        true
    }
    /// A frame to send after this long without audio, while the session is open.
    fn keepalive(&self) -> Option<(Duration, &'static str)> {
        None
    }
    /// What the call's input becomes (`Close` also stands for a dropped input channel).
    fn input(&mut self, input: SttInput, out: &mut Vec<Step>);
    /// What one vendor text frame becomes.
    fn text(&mut self, text: &str, out: &mut Vec<Step>);
    /// The fatal error for a close the session did not ask for.
    fn close_message(&self, code: u16, reason: &str) -> String;
    /// The fatal error for a socket lost without a close frame.
    fn lost_message(&self, error: &str) -> String;
    /// The fatal error when the vendor did not confirm within [`CONNECT_TIMEOUT`].
    fn unconfirmed_message(&self) -> String {
        format!(
            "{} did not confirm the session within {} s",
            Self::NAME,
            CONNECT_TIMEOUT.as_secs()
        )
    }
    /// A tag for the logs (the vendor's request or session id).
    fn log_id(&self) -> &str {
        "-"
    }
}

/// Opens a session at once: the task connects and runs the loop while audio queues.
pub(crate) fn open<W: SttWire>(wire: W, call_id: &str) -> SttStream {
    let (in_tx, in_rx) = mpsc::channel(INPUT_QUEUE);
    let (ev_tx, ev_rx) = mpsc::channel(EVENT_QUEUE);
    let call_id = call_id.to_string();
    let task = tokio::spawn(async move {
        run(wire, &call_id, in_rx, &ev_tx).await;
        let _ = ev_tx.send(SttEvent::Closed).await;
    });
    SttStream {
        input: in_tx,
        events: ev_rx,
        guard: TaskGuard::new(task),
    }
}

fn fatal(message: String) -> SttEvent {
    SttEvent::Error {
        message,
        fatal: true,
    }
}

/// Where the session is.
struct State {
    ready: bool,
    closing: Option<Instant>,
    last_audio: Instant,
}

/// What carrying out steps left the session at.
enum Flow {
    Go,
    End,
}

async fn run<W: SttWire>(
    mut wire: W,
    call_id: &str,
    mut input: mpsc::Receiver<SttInput>,
    ev: &mpsc::Sender<SttEvent>,
) {
    let confirm_by = Instant::now() + CONNECT_TIMEOUT;
    let headers = wire.headers();
    let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (ws, resp_headers) = match ws_client::connect(wire.url(), &headers, CONNECT_TIMEOUT).await {
        Ok(x) => x,
        Err(e) => {
            let message = wire.handshake_message(&e);
            tracing::warn!(call = %call_id, vendor = W::NAME, error = %message, "STT connect failed");
            let _ = ev.send(fatal(message)).await;
            return;
        }
    };
    wire.connected(&resp_headers);
    tracing::debug!(call = %call_id, vendor = W::NAME, id = %wire.log_id(), "STT connected");
    let mut st = State {
        ready: wire.ready_at_connect(),
        closing: None,
        last_audio: Instant::now(),
    };
    if st.ready && ev.send(SttEvent::Connected).await.is_err() {
        return;
    }
    let (mut incoming, sender, _reader) = ws_pump::split(ws);
    let keepalive = wire.keepalive();
    let mut steps = Vec::with_capacity(4);
    loop {
        let open = st.ready && st.closing.is_none();
        let keepalive_at = st.last_audio + keepalive.map_or(Duration::ZERO, |k| k.0);
        let drain_at = st.closing.unwrap_or_else(Instant::now) + DRAIN_TIMEOUT;
        tokio::select! {
            msg = input.recv(), if open => {
                let msg = msg.unwrap_or(SttInput::Close);
                if matches!(&msg, SttInput::Audio(b) if !b.is_empty()) {
                    st.last_audio = Instant::now();
                }
                wire.input(msg, &mut steps);
            }
            _ = tokio::time::sleep_until(keepalive_at), if open && keepalive.is_some() => {
                st.last_audio = Instant::now();
                if let Some((_, frame)) = keepalive {
                    steps.push(Step::Send(Frame::Text(Cow::Borrowed(frame))));
                }
            }
            _ = tokio::time::sleep_until(confirm_by), if !st.ready => {
                steps.push(Step::Fail(wire.unconfirmed_message()));
            }
            _ = tokio::time::sleep_until(drain_at), if st.closing.is_some() => {
                tracing::debug!(call = %call_id, vendor = W::NAME, id = %wire.log_id(), "STT did not close in time after the close was asked");
                steps.push(Step::Close { drain: false });
            }
            msg = incoming.recv() => match msg {
                Some(WsIn::Text(t)) => wire.text(&t, &mut steps),
                Some(WsIn::Binary(_)) => {}
                Some(WsIn::Close { code, reason }) => {
                    let code = code.unwrap_or(1005);
                    tracing::info!(call = %call_id, vendor = W::NAME, code, reason = %reason, id = %wire.log_id(), "the STT vendor closed the stream");
                    if code != 1000 || st.closing.is_none() {
                        let _ = ev.send(fatal(wire.close_message(code, &reason))).await;
                    }
                    return;
                }
                Some(WsIn::Failed(e)) => {
                    tracing::info!(call = %call_id, vendor = W::NAME, error = %e, id = %wire.log_id(), "the STT connection ended");
                    if st.closing.is_none() {
                        let _ = ev.send(fatal(wire.lost_message(&e))).await;
                    }
                    return;
                }
                None => return,
            }
        }
        if let Flow::End = carry_out::<W, _>(&mut steps, &mut st, &sender, ev).await {
            return;
        }
    }
}

/// Carries out `steps` in order (and empties it).
async fn carry_out<W: SttWire, S>(
    steps: &mut Vec<Step>,
    st: &mut State,
    sender: &ws_pump::WsSender<S>,
    ev: &mpsc::Sender<SttEvent>,
) -> Flow
where
    S: tokio::io::AsyncWrite + Unpin,
{
    for step in steps.drain(..) {
        match step {
            Step::Send(frame) => {
                let res = match &frame {
                    Frame::Text(t) => sender.text(t).await,
                    Frame::Binary(b) => sender.binary(b).await,
                };
                if let Err(e) = res {
                    let _ = ev
                        .send(fatal(format!("{} send failed: {e}", W::NAME)))
                        .await;
                    return Flow::End;
                }
            }
            Step::Event(e) => {
                if ev.send(e).await.is_err() {
                    return Flow::End;
                }
            }
            Step::Ready => {
                if !st.ready {
                    st.ready = true;
                    if ev.send(SttEvent::Connected).await.is_err() {
                        return Flow::End;
                    }
                }
            }
            Step::Close { drain: true } => st.closing = Some(Instant::now()),
            Step::Close { drain: false } => {
                let _ = sender.close(1000, "").await;
                return Flow::End;
            }
            Step::Fail(message) => {
                let _ = ev.send(fatal(message)).await;
                return Flow::End;
            }
        }
    }
    Flow::Go
}
