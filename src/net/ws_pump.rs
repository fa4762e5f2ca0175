//! Full-duplex use of a fastwebsockets socket: [`split`] hands back a receiver of whole
//! (defragmented) incoming messages, fed by a reader task that also answers pings and echoes
//! close frames, and a cloneable [`WsSender`] that writes and flushes frames from anywhere.
//! Used by the Deepgram client and by the simulators, which must read and write at once.

use std::sync::Arc;

use bytes::Bytes;
use fastwebsockets::{
    FragmentCollectorRead, Frame, OpCode, Payload, WebSocket, WebSocketError, WebSocketWrite,
};
use tokio::io::{AsyncRead, AsyncWrite, WriteHalf};
use tokio::sync::{Mutex, mpsc};

use crate::util::TaskGuard;

/// One incoming message, or the end of the socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WsIn {
    Text(String),
    Binary(Bytes),
    /// The peer's close frame (already answered). Nothing follows.
    Close {
        code: Option<u16>,
        reason: String,
    },
    /// The socket failed or ended without a close frame. Nothing follows.
    Failed(String),
}

/// The writing half; clones share one socket.
pub struct WsSender<W> {
    inner: Arc<Mutex<Writer<W>>>,
}

struct Writer<W> {
    ws: WebSocketWrite<W>,
    /// [`WsSender::text`] and [`WsSender::binary`] copy their payload here: a client masks
    /// what it sends in place, which would otherwise copy a borrowed payload into a new
    /// allocation on every frame.
    scratch: Vec<u8>,
}

impl<W> Clone for WsSender<W> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<W: AsyncWrite + Unpin> WsSender<W> {
    /// Writes and flushes one frame. After a close frame was sent, further frames are
    /// silently dropped (the close handshake may still be answering the peer).
    pub async fn send(&self, frame: Frame<'_>) -> Result<(), WebSocketError> {
        let mut w = self.inner.lock().await;
        if w.ws.is_closed() {
            return Ok(());
        }
        w.ws.write_frame(frame).await?;
        w.ws.flush().await
    }

    /// Writes and flushes one data frame of `payload`, copied into the writer's reused buffer.
    async fn send_copy(&self, opcode: OpCode, payload: &[u8]) -> Result<(), WebSocketError> {
        let mut guard = self.inner.lock().await;
        let w = &mut *guard;
        if w.ws.is_closed() {
            return Ok(());
        }
        w.scratch.clear();
        w.scratch.extend_from_slice(payload);
        let frame = Frame::new(true, opcode, None, Payload::BorrowedMut(&mut w.scratch));
        w.ws.write_frame(frame).await?;
        w.ws.flush().await
    }

    pub async fn text(&self, s: &str) -> Result<(), WebSocketError> {
        self.send_copy(OpCode::Text, s.as_bytes()).await
    }

    pub async fn binary(&self, b: &[u8]) -> Result<(), WebSocketError> {
        self.send_copy(OpCode::Binary, b).await
    }

    pub async fn close(&self, code: u16, reason: &str) -> Result<(), WebSocketError> {
        self.send(Frame::close(code, reason.as_bytes())).await
    }

    pub async fn is_closed(&self) -> bool {
        self.inner.lock().await.ws.is_closed()
    }
}

/// Splits `ws` into incoming messages and a sender. The returned guard owns the reader task.
pub fn split<S>(ws: WebSocket<S>) -> (mpsc::Receiver<WsIn>, WsSender<WriteHalf<S>>, TaskGuard)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (r, w) = ws.split(tokio::io::split);
    let sender = WsSender {
        inner: Arc::new(Mutex::new(Writer {
            ws: w,
            scratch: Vec::new(),
        })),
    };
    let mut reader = FragmentCollectorRead::new(r);
    let (tx, rx) = mpsc::channel(64);
    let obligated = sender.clone();
    let task = tokio::spawn(async move {
        let mut send_fn = |f: Frame<'static>| {
            let s = obligated.clone();
            async move { s.send(f).await }
        };
        loop {
            let msg = match reader.read_frame(&mut send_fn).await {
                Ok(frame) => match frame.opcode {
                    OpCode::Text => match String::from_utf8(frame.payload.to_vec()) {
                        Ok(s) => WsIn::Text(s),
                        Err(_) => WsIn::Failed("invalid UTF-8 in a text frame".into()),
                    },
                    OpCode::Binary => WsIn::Binary(Bytes::from(Vec::from(frame.payload))),
                    OpCode::Close => {
                        let p = &frame.payload[..];
                        let (code, reason) = if p.len() >= 2 {
                            (
                                Some(u16::from_be_bytes([p[0], p[1]])),
                                String::from_utf8_lossy(&p[2..]).into_owned(),
                            )
                        } else {
                            (None, String::new())
                        };
                        WsIn::Close { code, reason }
                    }
                    _ => continue,
                },
                Err(e) => WsIn::Failed(e.to_string()),
            };
            let end = matches!(msg, WsIn::Close { .. } | WsIn::Failed(_));
            if tx.send(msg).await.is_err() || end {
                break;
            }
        }
    });
    (rx, sender, TaskGuard::new(task))
}
