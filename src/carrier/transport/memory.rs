//! A media transport in memory: two bounded channels between the pump and a [`MemoryPeer`]
//! that plays the carrier, for tests of a whole call's media path without a socket (on
//! tokio's paused clock too). It keeps a WebSocket's rules that the pump relies on: messages
//! over [`MAX_MEDIA_MESSAGE`] are refused, the peer's close is echoed, nothing but a close
//! goes out after a close, and close codes are the WebSocket's.

use tokio::sync::mpsc;

use super::{CloseCode, MediaReceiver, MediaSender, MediaTransport, Received, TransportError};
use crate::carrier::{CodecError, MAX_MEDIA_MESSAGE, MediaMessage, MessageKind};

/// One message on a [`MemoryTransport`], either way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryMessage {
    Text(String),
    Binary(Vec<u8>),
    /// A close: its WebSocket code and reason.
    Close(u16, Vec<u8>),
}

impl MemoryMessage {
    /// The text of a text message.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Self::Text(t) => Some(t),
            _ => None,
        }
    }
}

/// The pump's end of an in-memory transport.
pub struct MemoryTransport {
    from_peer: mpsc::Receiver<MemoryMessage>,
    to_peer: mpsc::Sender<MemoryMessage>,
}

/// The carrier's end of an in-memory transport.
pub struct MemoryPeer {
    to_pump: mpsc::Sender<MemoryMessage>,
    from_pump: mpsc::Receiver<MemoryMessage>,
}

impl MemoryTransport {
    /// A transport and its peer, each direction a channel of `capacity` messages.
    pub fn pair(capacity: usize) -> (Self, MemoryPeer) {
        let (to_pump, from_peer) = mpsc::channel(capacity);
        let (to_peer, from_pump) = mpsc::channel(capacity);
        (
            Self { from_peer, to_peer },
            MemoryPeer { to_pump, from_pump },
        )
    }
}

impl MemoryPeer {
    /// Sends a text message; false once the pump's end is gone.
    pub async fn send_text(&self, text: impl Into<String>) -> bool {
        self.send(MemoryMessage::Text(text.into())).await
    }

    /// Sends a binary message; false once the pump's end is gone.
    pub async fn send_binary(&self, bytes: impl Into<Vec<u8>>) -> bool {
        self.send(MemoryMessage::Binary(bytes.into())).await
    }

    /// Sends any message; false once the pump's end is gone.
    pub async fn send(&self, message: MemoryMessage) -> bool {
        self.to_pump.send(message).await.is_ok()
    }

    /// The pump's next message; `None` once its end is gone and everything was read.
    pub async fn recv(&mut self) -> Option<MemoryMessage> {
        self.from_pump.recv().await
    }

    /// The peer's two channels, to drive both directions at once (e.g. in one `select!`).
    pub fn into_parts(self) -> (mpsc::Sender<MemoryMessage>, mpsc::Receiver<MemoryMessage>) {
        (self.to_pump, self.from_pump)
    }

    /// A peer from the parts [`Self::into_parts`] gave.
    pub fn from_parts(
        to_pump: mpsc::Sender<MemoryMessage>,
        from_pump: mpsc::Receiver<MemoryMessage>,
    ) -> Self {
        Self { to_pump, from_pump }
    }

    /// The pump's next message if one is queued.
    pub fn try_recv(&mut self) -> Option<MemoryMessage> {
        self.from_pump.try_recv().ok()
    }
}

/// A close the receiving half owes the peer: its code and reason.
pub struct OwedClose(u16, Vec<u8>);

/// The receiving half of a [`MemoryTransport`].
pub struct MemoryReceiver {
    from_peer: mpsc::Receiver<MemoryMessage>,
    owed: mpsc::Sender<OwedClose>,
    /// The message last received (what [`MediaReceiver::recv`]'s answer borrows).
    held: Option<MemoryMessage>,
}

/// The sending half of a [`MemoryTransport`].
pub struct MemorySender {
    to_peer: mpsc::Sender<MemoryMessage>,
    owed: mpsc::Receiver<OwedClose>,
    closed: bool,
}

impl MediaTransport for MemoryTransport {
    type Receiver = MemoryReceiver;
    type Sender = MemorySender;

    fn split(self) -> (MemoryReceiver, MemorySender) {
        let (owed_tx, owed_rx) = mpsc::channel(8);
        (
            MemoryReceiver {
                from_peer: self.from_peer,
                owed: owed_tx,
                held: None,
            },
            MemorySender {
                to_peer: self.to_peer,
                owed: owed_rx,
                closed: false,
            },
        )
    }
}

impl MediaReceiver for MemoryReceiver {
    async fn recv(&mut self) -> Result<Received<'_>, TransportError> {
        let message = self.from_peer.recv().await.ok_or(TransportError::Closed)?;
        if let MemoryMessage::Close(code, reason) = &message {
            let echo = OwedClose(*code, reason.clone());
            self.owed
                .send(echo)
                .await
                .map_err(|_| TransportError::Closed)?;
            return Ok(Received::Closed);
        }
        let held = &*self.held.insert(message);
        Ok(match held {
            MemoryMessage::Text(t) if t.len() > MAX_MEDIA_MESSAGE => {
                Received::Bad(CodecError::TooLarge(t.len()))
            }
            MemoryMessage::Binary(b) if b.len() > MAX_MEDIA_MESSAGE => {
                Received::Bad(CodecError::TooLarge(b.len()))
            }
            MemoryMessage::Text(t) => Received::Message(MediaMessage::Text(t)),
            MemoryMessage::Binary(b) => Received::Message(MediaMessage::Binary(b)),
            MemoryMessage::Close(..) => Received::Closed,
        })
    }

    async fn close(&mut self, code: CloseCode, reason: &'static [u8]) {
        let _ = self
            .owed
            .send(OwedClose(code.websocket(), reason.to_vec()))
            .await;
    }
}

impl MediaSender for MemorySender {
    type Owed = OwedClose;

    async fn send(&mut self, kind: MessageKind, payload: &[u8]) -> Result<(), TransportError> {
        if self.closed {
            return Err(TransportError::Closed);
        }
        let message = match kind {
            MessageKind::Text => match std::str::from_utf8(payload) {
                Ok(t) => MemoryMessage::Text(t.to_string()),
                Err(_) => return Err(TransportError::Failed("text that is not UTF-8".into())),
            },
            MessageKind::Binary => MemoryMessage::Binary(payload.to_vec()),
        };
        self.to_peer
            .send(message)
            .await
            .map_err(|_| TransportError::Closed)
    }

    async fn flush(&mut self) -> Result<(), TransportError> {
        Ok(())
    }

    async fn next_owed(&mut self) -> Option<OwedClose> {
        self.owed.recv().await
    }

    fn try_owed(&mut self) -> Option<OwedClose> {
        self.owed.try_recv().ok()
    }

    async fn write_owed(&mut self, owed: OwedClose) -> bool {
        let OwedClose(code, reason) = owed;
        self.closed = true;
        let _ = self.to_peer.send(MemoryMessage::Close(code, reason)).await;
        true
    }

    fn is_closed(&self) -> bool {
        self.closed
    }

    async fn close(&mut self, code: CloseCode, reason: &[u8]) {
        self.closed = true;
        let _ = self
            .to_peer
            .send(MemoryMessage::Close(code.websocket(), reason.to_vec()))
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn messages_pass_both_ways_and_the_cap_holds() {
        let (transport, mut peer) = MemoryTransport::pair(4);
        let (mut rx, mut tx) = transport.split();
        assert!(peer.send_binary(vec![1, 2]).await);
        assert!(peer.send_text("x".repeat(MAX_MEDIA_MESSAGE + 1)).await);
        assert_eq!(
            rx.recv().await.expect("binary"),
            Received::Message(MediaMessage::Binary(&[1, 2]))
        );
        assert_eq!(
            rx.recv().await.expect("too large"),
            Received::Bad(CodecError::TooLarge(MAX_MEDIA_MESSAGE + 1))
        );
        tx.send(MessageKind::Text, b"hello").await.expect("send");
        assert_eq!(peer.recv().await, Some(MemoryMessage::Text("hello".into())));
    }

    /// The peer's close comes back as the echo; afterwards nothing but a close goes out, and
    /// the sender hears that the receiver is gone.
    #[tokio::test]
    async fn the_peers_close_is_echoed_and_ends_the_sending() {
        let (transport, mut peer) = MemoryTransport::pair(4);
        let (mut rx, mut tx) = transport.split();
        assert!(peer.send(MemoryMessage::Close(1000, b"bye".to_vec())).await);
        assert_eq!(rx.recv().await.expect("close"), Received::Closed);
        drop(rx);
        let owed = tx.next_owed().await.expect("the echo");
        assert!(tx.write_owed(owed).await);
        assert!(tx.is_closed());
        assert!(tx.next_owed().await.is_none());
        assert!(tx.send(MessageKind::Text, b"late").await.is_err());
        assert_eq!(
            peer.recv().await,
            Some(MemoryMessage::Close(1000, b"bye".to_vec()))
        );
        assert_eq!(peer.try_recv(), None);
    }
}
