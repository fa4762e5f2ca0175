//! A fake provider's server side of one WebSocket, read and written by the session's own task
//! ([`WsConn`]): no reader task and no channel between the socket and the session, so an
//! incoming frame costs one task wake instead of two (the fake Deepgram sees every audio frame
//! of every call in a load run). [`WsConn::recv`] returns whole (defragmented) messages as
//! [`WsIn`], answers pings and echoes the peer's close frame itself (the obligated frames are
//! written right after the read that produced them, before anything else), and reports
//! `None` once no data frame arrived for the idle timeout. The idle timer is one pinned sleep
//! per connection, re-armed only when it fires early, and it never cancels a read that is
//! still owed bytes unless the connection really went idle (fastwebsockets' read is not
//! cancel-safe between a frame's header and its payload). Writes after a close frame was sent
//! are dropped, as [`patterd::net::ws_pump::WsSender`] does.

use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use fastwebsockets::{Frame, OpCode, Payload, WebSocket, WebSocketError};
use patterd::net::ws_pump::WsIn;
use tokio::time::{Instant, Sleep};

use crate::ws::{WsIo, WsRead, WsWrite, split};

/// One server-side WebSocket owned by one task.
pub struct WsConn {
    rd: WsRead,
    wr: WsWrite,
    idle_timeout: Duration,
    deadline: Instant,
    idle: Pin<Box<Sleep>>,
    /// Frames the protocol obliges us to send (pong, close echo), collected during a read.
    owed: Vec<(OpCode, Vec<u8>)>,
}

impl WsConn {
    /// Takes over an upgraded socket; it goes idle after `idle_timeout` without a data frame.
    pub fn new(ws: WebSocket<WsIo>, idle_timeout: Duration) -> Self {
        let (rd, wr) = split(ws);
        let deadline = Instant::now() + idle_timeout;
        Self {
            rd,
            wr,
            idle_timeout,
            deadline,
            idle: Box::pin(tokio::time::sleep_until(deadline)),
            owed: Vec::new(),
        }
    }

    /// The next message, or `None` when no text or binary frame arrived for the idle timeout.
    /// After [`WsIn::Close`] or [`WsIn::Failed`] nothing more comes.
    pub async fn recv(&mut self) -> Option<WsIn> {
        let Self {
            rd,
            wr,
            idle_timeout,
            deadline,
            idle,
            owed,
        } = self;
        let msg = {
            let read = read_msg(rd, owed);
            tokio::pin!(read);
            loop {
                tokio::select! {
                    biased;
                    m = &mut read => break Some(m),
                    () = idle.as_mut() => {
                        if Instant::now() < *deadline {
                            // Data came since the timer was armed: push it back.
                            idle.as_mut().reset(*deadline);
                            continue;
                        }
                        break None;
                    }
                }
            }
        };
        write_owed(wr, owed).await;
        if matches!(msg, Some(WsIn::Text(_) | WsIn::Binary(_))) {
            *deadline = Instant::now() + *idle_timeout;
        }
        msg
    }

    /// The next message without the idle timeout (draining after a close).
    pub async fn recv_any(&mut self) -> WsIn {
        let m = read_msg(&mut self.rd, &mut self.owed).await;
        write_owed(&mut self.wr, &mut self.owed).await;
        m
    }

    /// Writes one text frame (dropped after a close frame was sent).
    pub async fn text(&mut self, s: &str) -> Result<(), WebSocketError> {
        self.send(Frame::text(Payload::Borrowed(s.as_bytes())))
            .await
    }

    /// Writes one binary frame (dropped after a close frame was sent).
    pub async fn binary(&mut self, b: &[u8]) -> Result<(), WebSocketError> {
        self.send(Frame::binary(Payload::Borrowed(b))).await
    }

    /// Sends a close frame with `code` and `reason`.
    pub async fn close(&mut self, code: u16, reason: &str) -> Result<(), WebSocketError> {
        self.send(Frame::close(code, reason.as_bytes())).await
    }

    async fn send(&mut self, frame: Frame<'_>) -> Result<(), WebSocketError> {
        if self.wr.is_closed() {
            return Ok(());
        }
        self.wr.write_frame(frame).await?;
        self.wr.flush().await
    }
}

/// Reads one whole message; the obligated frames go to `owed`.
async fn read_msg(rd: &mut WsRead, owed: &mut Vec<(OpCode, Vec<u8>)>) -> WsIn {
    let mut obligated = |f: Frame<'_>| {
        owed.push((f.opcode, f.payload.to_vec()));
        std::future::ready(Ok::<(), std::io::Error>(()))
    };
    loop {
        return match rd.read_frame(&mut obligated).await {
            Ok(frame) => match frame.opcode {
                OpCode::Text => match String::from_utf8(frame.payload.to_vec()) {
                    Ok(s) => WsIn::Text(s),
                    Err(_) => WsIn::Failed("invalid UTF-8 in a text frame".into()),
                },
                OpCode::Binary => WsIn::Binary(match frame.payload {
                    Payload::Bytes(b) => b.freeze(),
                    p => Bytes::from(p.to_vec()),
                }),
                OpCode::Close => {
                    let p: &[u8] = &frame.payload;
                    let (code, reason) = match p {
                        [a, b, rest @ ..] => (
                            Some(u16::from_be_bytes([*a, *b])),
                            String::from_utf8_lossy(rest).into_owned(),
                        ),
                        _ => (None, String::new()),
                    };
                    WsIn::Close { code, reason }
                }
                _ => continue,
            },
            Err(e) => WsIn::Failed(e.to_string()),
        };
    }
}

/// Sends the frames a read obliged us to (errors ignored: the next read or write reports a
/// broken socket).
async fn write_owed(wr: &mut WsWrite, owed: &mut Vec<(OpCode, Vec<u8>)>) {
    for (op, payload) in owed.drain(..) {
        if wr.is_closed() {
            continue;
        }
        let _ = wr
            .write_frame(Frame::new(true, op, None, Payload::Owned(payload)))
            .await;
        let _ = wr.flush().await;
    }
}
