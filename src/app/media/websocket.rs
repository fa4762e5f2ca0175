//! The carriers' media WebSockets as a [`MediaTransport`]: [`WebSocketTransport`] wraps a
//! fastwebsockets socket (the server's upgraded connection, or any stream in tests and
//! benchmarks). The read half joins fragments itself ([`CappedReader`]) so that a message is
//! capped at [`MAX_FRAME`] while it is read; pings are answered and the peer's close echoed
//! through the owed frames the write half writes; writes go to a buffer flushed per burst.
//! A received message is a view of the socket's read buffer: nothing is copied on the way to
//! the codec.

use fastwebsockets::{
    Frame, OpCode, Payload, WebSocket, WebSocketError, WebSocketRead, WebSocketWrite,
};
use tokio::io::{AsyncRead, AsyncWrite, BufWriter, ReadHalf, WriteHalf};
use tokio::sync::mpsc;

use super::MAX_FRAME;
use crate::carrier::transport::{
    CloseCode, MediaReceiver, MediaSender, MediaTransport, Received, TransportError,
};
use crate::carrier::{CodecError, MediaMessage, MessageKind};

/// Beyond this a single frame of an authenticated socket cannot be skipped safely and the
/// socket is closed.
pub(super) const MAX_WIRE_FRAME: usize = 1024 * 1024;
/// The frame limit before authentication: any frame over [`MAX_FRAME`] closes the socket
/// before its payload is read (the reader refuses a payload of this size or more).
pub(super) const PRE_AUTH_WIRE_FRAME: usize = MAX_FRAME + 1;

/// Bytes of outgoing frames buffered before a write to the socket (a flush follows every
/// burst of commands anyway). A pacer top-up (100 ms: five frames and a mark, ≈ 1.6 KiB as
/// Twilio JSON) fits; the 1 s lead at the start of a reply goes in four writes. Every live call
/// holds one.
const WRITE_BUFFER: usize = 4 * 1024;

/// The most one read of the socket takes (see [`ReadChunks`]).
pub(super) const READ_CHUNK: usize = 16 * 1024;

/// Control frames the read half may owe the peer before the write half writes them.
const OWED_QUEUE: usize = 8;

/// A media WebSocket (after the upgrade) as a [`MediaTransport`].
pub struct WebSocketTransport<S> {
    ws: WebSocket<S>,
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> WebSocketTransport<S> {
    /// Takes over `ws`: pings answered and closes echoed by the socket itself; until
    /// [`MediaReceiver::authenticated`], no frame over [`MAX_FRAME`] is read at all (the socket
    /// ends), after it single frames over [`MAX_WIRE_FRAME`] end it.
    pub fn new(mut ws: WebSocket<S>) -> Self {
        ws.set_auto_close(true);
        ws.set_auto_pong(true);
        ws.set_max_message_size(PRE_AUTH_WIRE_FRAME);
        Self { ws }
    }
}

/// The read half of a [`WebSocketTransport`].
pub struct WebSocketReceiver<S> {
    read: CappedReader<ReadChunks<ReadHalf<S>>>,
    owed: mpsc::Sender<Frame<'static>>,
    /// The message last received (what [`MediaReceiver::recv`]'s answer borrows); dropped
    /// before the next read, so the read buffer's space is free again.
    held: Option<Frame<'static>>,
}

/// The write half of a [`WebSocketTransport`].
pub struct WebSocketSender<S> {
    write: WebSocketWrite<BufWriter<WriteHalf<S>>>,
    owed: mpsc::Receiver<Frame<'static>>,
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> MediaTransport for WebSocketTransport<S> {
    type Receiver = WebSocketReceiver<S>;
    type Sender = WebSocketSender<S>;

    fn split(self) -> (WebSocketReceiver<S>, WebSocketSender<S>) {
        // Writes go to a buffer that is flushed once the actor's burst of commands is written
        // (one syscall for a pacer top-up of several frames and its mark).
        let (read, write) = self.ws.split(|s| {
            let (r, w) = tokio::io::split(s);
            (ReadChunks(r), BufWriter::with_capacity(WRITE_BUFFER, w))
        });
        let (owed_tx, owed_rx) = mpsc::channel(OWED_QUEUE);
        (
            WebSocketReceiver {
                read: CappedReader::new(read, MAX_FRAME),
                owed: owed_tx,
                held: None,
            },
            WebSocketSender {
                write,
                owed: owed_rx,
            },
        )
    }
}

/// A socket's read half that reads at most [`READ_CHUNK`] bytes at a time. The WebSocket
/// reader reads into whatever room its buffer has, and its buffer doubles when a frame does
/// not fit behind unread bytes: a peer sending faster than we decode (a flood) would grow it to
/// what the kernel holds for the socket (megabytes). Small reads keep the unread bytes, and so
/// the buffer, near one read and one frame.
pub(crate) struct ReadChunks<R>(R);

impl<R: AsyncRead + Unpin> AsyncRead for ReadChunks<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if buf.remaining() <= READ_CHUNK {
            return std::pin::Pin::new(&mut self.0).poll_read(cx, buf);
        }
        let mut chunk = buf.take(READ_CHUNK);
        std::task::ready!(std::pin::Pin::new(&mut self.0).poll_read(cx, &mut chunk))?;
        let n = chunk.filled().len();
        // SAFETY: `chunk` is a view of `buf`'s unfilled part; the read initialised and filled
        // its first `n` bytes, which are now `buf`'s next `n` bytes.
        unsafe { buf.assume_init(n) };
        buf.advance(n);
        std::task::Poll::Ready(Ok(()))
    }
}

fn transport_error(e: WebSocketError) -> TransportError {
    match e {
        WebSocketError::ConnectionClosed => TransportError::Closed,
        e => TransportError::Failed(e.to_string()),
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> MediaReceiver for WebSocketReceiver<S> {
    async fn recv(&mut self) -> Result<Received<'_>, TransportError> {
        self.held = None;
        loop {
            let message = self
                .read
                .read_message_owing(&self.owed)
                .await
                .map_err(transport_error)?;
            let frame = match message {
                Message::TooLarge(n) => return Ok(Received::Bad(CodecError::TooLarge(n))),
                Message::Frame(f) => f,
            };
            match frame.opcode {
                OpCode::Close => return Ok(Received::Closed),
                OpCode::Text | OpCode::Binary if frame.payload.len() > MAX_FRAME => {
                    return Ok(Received::Bad(CodecError::TooLarge(frame.payload.len())));
                }
                OpCode::Text | OpCode::Binary => {
                    let held = &*self.held.insert(frame);
                    let payload: &[u8] = &held.payload;
                    return Ok(if held.opcode == OpCode::Binary {
                        Received::Message(MediaMessage::Binary(payload))
                    } else {
                        match std::str::from_utf8(payload) {
                            Ok(text) => Received::Message(MediaMessage::Text(text)),
                            Err(_) => Received::Bad(CodecError::BadJson("not UTF-8".into())),
                        }
                    });
                }
                // A pong carries nothing (pings are answered by the socket).
                _ => {}
            }
        }
    }

    async fn close(&mut self, code: CloseCode, reason: &'static [u8]) {
        let _ = self.owed.send(Frame::close(code.websocket(), reason)).await;
    }

    fn authenticated(&mut self) {
        self.read.set_wire_limit(MAX_WIRE_FRAME);
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> MediaSender for WebSocketSender<S> {
    type Owed = Frame<'static>;

    async fn send(&mut self, kind: MessageKind, payload: &[u8]) -> Result<(), TransportError> {
        let payload = Payload::Borrowed(payload);
        let frame = match kind {
            MessageKind::Text => Frame::text(payload),
            MessageKind::Binary => Frame::binary(payload),
        };
        self.write.write_frame(frame).await.map_err(transport_error)
    }

    async fn flush(&mut self) -> Result<(), TransportError> {
        self.write.flush().await.map_err(transport_error)
    }

    async fn next_owed(&mut self) -> Option<Frame<'static>> {
        self.owed.recv().await
    }

    fn try_owed(&mut self) -> Option<Frame<'static>> {
        self.owed.try_recv().ok()
    }

    async fn write_owed(&mut self, owed: Frame<'static>) -> bool {
        let close = owed.opcode == OpCode::Close;
        let _ = self.write.write_frame(owed).await;
        close
    }

    fn is_closed(&self) -> bool {
        self.write.is_closed()
    }

    async fn close(&mut self, code: CloseCode, reason: &[u8]) {
        let _ = self
            .write
            .write_frame(Frame::close(code.websocket(), reason))
            .await;
        let _ = self.write.flush().await;
    }
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

    /// Sets the largest single frame the WebSocket reader accepts (a larger one is an error
    /// before its payload is read).
    pub fn set_wire_limit(&mut self, bytes: usize) {
        self.read.set_max_message_size(bytes);
    }

    /// The most bytes ever held for one message (never more than `max`).
    pub fn peak_buffered(&self) -> usize {
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
    pub async fn read_message<R, E>(
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

#[cfg(test)]
mod tests {
    use super::*;

    /// However much the caller has sent, one read takes at most [`READ_CHUNK`] bytes (the
    /// WebSocket reader's buffer then stays near one read and one frame).
    #[tokio::test]
    async fn reads_take_at_most_a_chunk() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut peer, ours) = tokio::io::duplex(1 << 20);
        peer.write_all(&vec![7u8; 1 << 19]).await.expect("write");
        let mut reader = ReadChunks(ours);
        let mut buf = bytes::BytesMut::with_capacity(1 << 20);
        let mut total = 0;
        while total < 1 << 19 {
            let n = reader.read_buf(&mut buf).await.expect("read");
            assert!(n > 0 && n <= READ_CHUNK, "{n}");
            total += n;
        }
        assert!(buf.iter().all(|b| *b == 7) && buf.len() == 1 << 19);
        // A buffer with less room than a chunk is filled as far as it goes.
        peer.write_all(&[1u8; 100]).await.expect("write");
        let mut small = [0u8; 10];
        assert_eq!(reader.read(&mut small).await.expect("read"), 10);
    }
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

    /// The transport over a socket: whole messages as the codec sees them, a binary message
    /// over the cap refused, a ping answered by the write half, the peer's close echoed.
    #[tokio::test]
    async fn the_websocket_transport_passes_messages_and_owes_the_control_frames() {
        let (server, client) = tokio::io::duplex(1 << 20);
        let transport = WebSocketTransport::new(WebSocket::after_handshake(server, Role::Server));
        let (mut rx, mut tx) = transport.split();
        // Authenticated: an oversized frame is counted, not the end of the socket.
        rx.authenticated();
        let mut client = WebSocket::after_handshake(client, Role::Client);
        client.set_auto_close(false);
        client.set_auto_pong(false);
        client
            .write_frame(Frame::text(Payload::Owned(b"hello".to_vec())))
            .await
            .expect("write");
        client
            .write_frame(Frame::binary(Payload::Owned(vec![0; MAX_FRAME + 1])))
            .await
            .expect("write");
        client
            .write_frame(Frame::new(
                true,
                OpCode::Ping,
                None,
                Payload::Owned(b"p".to_vec()),
            ))
            .await
            .expect("write");
        client
            .write_frame(Frame::binary(Payload::Owned(vec![1, 2])))
            .await
            .expect("write");
        assert_eq!(
            rx.recv().await.expect("text"),
            Received::Message(MediaMessage::Text("hello"))
        );
        assert_eq!(
            rx.recv().await.expect("too large"),
            Received::Bad(CodecError::TooLarge(MAX_FRAME + 1))
        );
        assert_eq!(
            rx.recv().await.expect("binary"),
            Received::Message(MediaMessage::Binary(&[1, 2]))
        );
        let pong = tx.next_owed().await.expect("the pong");
        assert!(!tx.write_owed(pong).await);
        tx.send(MessageKind::Binary, &[7]).await.expect("send");
        tx.flush().await.expect("flush");
        let pong = client.read_frame().await.expect("pong");
        assert_eq!((pong.opcode, &pong.payload[..]), (OpCode::Pong, &b"p"[..]));
        let data = client.read_frame().await.expect("binary");
        assert_eq!((data.opcode, &data.payload[..]), (OpCode::Binary, &[7][..]));

        client
            .write_frame(Frame::close(1000, b"bye"))
            .await
            .expect("write");
        assert_eq!(rx.recv().await.expect("close"), Received::Closed);
        drop(rx);
        let echo = tx.next_owed().await.expect("the close echo");
        assert!(tx.write_owed(echo).await);
        assert!(tx.is_closed());
        assert!(tx.next_owed().await.is_none());
        tx.flush().await.expect("flush");
        let close = client.read_frame().await.expect("close");
        assert_eq!(close.opcode, OpCode::Close);
        assert_eq!(
            &close.payload[..],
            &[&1000u16.to_be_bytes()[..], b"bye"].concat()[..]
        );
    }
}
