//! The seam between the media pump and the wire a call's media travels on. A
//! [`MediaTransport`] carries whole [`MediaMessage`]s (text or binary) both ways and handles
//! its own control traffic (a WebSocket's pings, pongs and close handshake); the pump
//! (`app::media`) decodes and encodes them with the carrier's [`super::MediaCodec`] and never
//! sees the wire. The carriers' media WebSockets are `app::media::WebSocketTransport`;
//! [`memory::MemoryTransport`] is a pair of bounded channels for tests. Another wire (an RTP leg
//! of a SIP call, say) is another implementation of these three traits.
//!
//! A transport is split once into its [`MediaReceiver`] (read in its own task) and its
//! [`MediaSender`] (the pump's write loop). What the receiver owes the peer (a pong, the echo of
//! a close, a close it asked for) reaches the sender as the transport's `Owed` values, which
//! the write loop writes between its own messages; the sender's [`MediaSender::next_owed`]
//! ends when the receiver is gone, which is how the write loop learns that the peer left.

use std::future::Future;

use super::{CodecError, MediaMessage, MessageKind};

pub mod memory;

/// What [`MediaReceiver::recv`] yields.
#[derive(Debug, PartialEq, Eq)]
pub enum Received<'a> {
    /// One whole message, at most [`super::MAX_MEDIA_MESSAGE`] bytes.
    Message(MediaMessage<'a>),
    /// A message the transport does not pass on (over [`super::MAX_MEDIA_MESSAGE`], text
    /// that is not UTF-8): the pump counts it as a malformed frame and the transport goes on.
    Bad(CodecError),
    /// The peer closed the transport (its close is echoed through the sender).
    Closed,
}

/// Why a transport could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The transport is closed (by us or by the peer): nothing more will come or go.
    #[error("the transport is closed")]
    Closed,
    /// The transport failed (a protocol violation, a reset connection).
    #[error("{0}")]
    Failed(String),
}

/// How the daemon closes a transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseCode {
    /// The stream is over (WebSocket 1000).
    Normal,
    /// The peer is refused: no valid start, a bad token, a flood of malformed messages
    /// (WebSocket 1008, policy violation).
    Policy,
}

impl CloseCode {
    /// The WebSocket close code.
    pub const fn websocket(self) -> u16 {
        match self {
            Self::Normal => 1000,
            Self::Policy => 1008,
        }
    }
}

/// A call's media wire, both ways. The pump splits it once, before anything is read.
pub trait MediaTransport: Send + 'static {
    type Receiver: MediaReceiver;
    type Sender: MediaSender;
    /// The receiving half (read in its own task) and the sending half.
    fn split(self) -> (Self::Receiver, Self::Sender);
}

/// The receiving half of a [`MediaTransport`].
pub trait MediaReceiver: Send + 'static {
    /// The next whole message (borrowed until the next call), a message refused by the
    /// transport, or the peer's close; control traffic is the transport's. An error ends the
    /// transport ([`TransportError::Closed`] when it ended cleanly).
    fn recv(&mut self) -> impl Future<Output = Result<Received<'_>, TransportError>> + Send;
    /// Asks the sending half to close the transport with `code` and `reason` (it is written
    /// after what the sender has already queued).
    fn close(&mut self, code: CloseCode, reason: &'static [u8]) -> impl Future<Output = ()> + Send;
    /// The peer has proved who it is (its `start` carried a valid media token). Before this a
    /// transport refuses anything over [`crate::carrier::MAX_MEDIA_MESSAGE`] unread and ends;
    /// after it, one that can skip a larger frame safely may count it as bad instead.
    fn authenticated(&mut self) {}
}

/// The sending half of a [`MediaTransport`]. Writes may be buffered until [`Self::flush`].
pub trait MediaSender: Send + 'static {
    /// What the receiving half owes the peer (a pong, a close echo, a close it asked for).
    type Owed: Send;
    /// Writes one message of `kind`.
    fn send(
        &mut self,
        kind: MessageKind,
        payload: &[u8],
    ) -> impl Future<Output = Result<(), TransportError>> + Send;
    /// Writes what was buffered.
    fn flush(&mut self) -> impl Future<Output = Result<(), TransportError>> + Send;
    /// Waits for the next thing the receiving half owes the peer; `None` once the receiving
    /// half is gone. Cancel-safe (a branch of the write loop's `select!`).
    fn next_owed(&mut self) -> impl Future<Output = Option<Self::Owed>> + Send;
    /// What the receiving half owes the peer now, without waiting.
    fn try_owed(&mut self) -> Option<Self::Owed>;
    /// Writes what the receiving half owed (errors are the next write's); true when it closed
    /// the transport.
    fn write_owed(&mut self, owed: Self::Owed) -> impl Future<Output = bool> + Send;
    /// True once a close went out: nothing but another close may follow.
    fn is_closed(&self) -> bool;
    /// Writes a close with `code` and `reason` and flushes (errors ignored: the transport is
    /// done either way).
    fn close(&mut self, code: CloseCode, reason: &[u8]) -> impl Future<Output = ()> + Send;
}
