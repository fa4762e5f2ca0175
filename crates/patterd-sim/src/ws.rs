//! The simulated caller's side of a media WebSocket, shared by the carrier stream driver
//! ([`crate::stream`]) and the load generator's lean caller: [`split`] an upgraded socket into
//! a defragmenting read half and a write half, and [`spawn_reader`], the one read loop. The
//! reader never writes: frames the protocol obliges us to send (pong, the close reply) come
//! out as [`WsFrame::Obligated`] so that the driver, the only owner of the write half, sends
//! them in order with its own frames. The loop ends after the peer's close frame or a socket
//! error, or when the driver stops listening.

use std::sync::Arc;

use fastwebsockets::{FragmentCollectorRead, Frame, OpCode, WebSocket, WebSocketWrite};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use patterd::util::TaskGuard;
use tokio::io::{ReadHalf, WriteHalf};
use tokio::sync::mpsc;

/// The upgraded client socket.
pub type WsIo = TokioIo<Upgraded>;
/// The read half, reassembling fragmented messages.
pub type WsRead = FragmentCollectorRead<ReadHalf<WsIo>>;
/// The write half; the driver owns it.
pub type WsWrite = WebSocketWrite<WriteHalf<WsIo>>;

/// What the reader saw, handed to the driver's mapping function.
#[derive(Debug)]
pub enum WsFrame<'a> {
    /// A frame the driver must send in reply (pong, close echo): opcode and payload.
    Obligated(OpCode, Vec<u8>),
    Text(&'a [u8]),
    Binary(&'a [u8]),
    /// The peer's close frame (code and reason when present); nothing follows.
    Close(Option<u16>, String),
    /// The socket failed or ended without a close frame; nothing follows.
    Error(String),
}

/// Splits `ws` into its defragmenting read half and its write half.
pub fn split(ws: WebSocket<WsIo>) -> (WsRead, WsWrite) {
    let (rd, wr) = ws.split(tokio::io::split);
    (FragmentCollectorRead::new(rd), wr)
}

/// Spawns the read loop: every frame goes through `map`, and what it returns (if anything) to
/// `tx`. Pings, pongs and continuation frames are not handed over (fastwebsockets answers
/// pings through [`WsFrame::Obligated`]). The guard owns the task.
pub fn spawn_reader<T, F>(mut rd: WsRead, tx: mpsc::UnboundedSender<T>, map: F) -> TaskGuard
where
    T: Send + 'static,
    F: Fn(WsFrame<'_>) -> Option<T> + Send + Sync + 'static,
{
    let map = Arc::new(map);
    let obligated = (tx.clone(), map.clone());
    TaskGuard::new(tokio::spawn(async move {
        let mut send_fn = move |f: Frame<'_>| {
            let (tx, map) = &obligated;
            if let Some(m) = map(WsFrame::Obligated(f.opcode, f.payload.to_vec())) {
                let _ = tx.send(m);
            }
            std::future::ready(Ok::<(), std::io::Error>(()))
        };
        loop {
            let (seen, last) = match rd.read_frame(&mut send_fn).await {
                Ok(frame) => match frame.opcode {
                    OpCode::Text => (map(WsFrame::Text(&frame.payload)), false),
                    OpCode::Binary => (map(WsFrame::Binary(&frame.payload)), false),
                    OpCode::Close => {
                        let p: &[u8] = &frame.payload;
                        let code = (p.len() >= 2).then(|| u16::from_be_bytes([p[0], p[1]]));
                        let reason = p.get(2..).map(String::from_utf8_lossy).unwrap_or_default();
                        (map(WsFrame::Close(code, reason.into_owned())), true)
                    }
                    _ => continue,
                },
                Err(e) => (map(WsFrame::Error(e.to_string())), true),
            };
            if let Some(m) = seen
                && tx.send(m).is_err()
            {
                return;
            }
            if last {
                return;
            }
        }
    }))
}
