//! A Server-Sent Events decoder for streamed chat completions, following the SSE format:
//! lines end with `\n`, `\r\n` or `\r` (a `\r\n` pair may straddle two chunks); an empty line
//! ends an event; `data:` lines accumulate and are joined with `\n`; one optional space after
//! the colon is stripped; `event:` names the event (Hermes uses `hermes.tool.progress`); lines
//! starting with `:` are comments (`: keepalive`) and are dropped; unknown fields are ignored.
//! Bytes are decoded per complete line, so a UTF-8 character split across network chunks is
//! reassembled. Interpreting `[DONE]` and the JSON payloads is the client's job.
//!
//! Memory is bounded whatever the server sends: a line longer than [`MAX_LINE_BYTES`] or an
//! event whose data grows past [`MAX_EVENT_BYTES`] is not kept; the parser drops the excess and
//! reports [`SseParser::overflowed`], which the client treats as a broken stream.

/// The longest line kept (a chat-completion chunk is a few hundred bytes).
pub(crate) const MAX_LINE_BYTES: usize = 256 * 1024;
/// The most `data:` one event may accumulate.
pub const MAX_EVENT_BYTES: usize = 1024 * 1024;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` name, if any (absent means the default "message").
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// The last `id:` seen in this event, if any.
    pub id: Option<String>,
}

impl SseEvent {
    /// True when the data payload starts with `[DONE]` (the end-of-stream sentinel).
    pub fn is_done(&self) -> bool {
        self.data.starts_with("[DONE]")
    }
}

/// Incremental decoder: feed it body chunks as they arrive.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    /// The previous chunk ended in `\r`; a leading `\n` in the next one belongs to it.
    skip_lf: bool,
    event: Option<String>,
    data: Vec<String>,
    id: Option<String>,
    has_fields: bool,
    /// Bytes of `data` held for the current event.
    data_bytes: usize,
    /// A line or an event went over its limit; its excess was dropped.
    overflowed: bool,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one chunk of the body and returns every event it completed.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        let mut out = Vec::new();
        for &b in chunk {
            if self.skip_lf {
                self.skip_lf = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\n' => self.end_line(&mut out),
                b'\r' => {
                    self.end_line(&mut out);
                    self.skip_lf = true;
                }
                _ if self.line.len() >= MAX_LINE_BYTES => self.overflowed = true,
                _ => self.line.push(b),
            }
        }
        out
    }

    /// True once a line or an event went over its limit ([`MAX_LINE_BYTES`],
    /// [`MAX_EVENT_BYTES`]): the stream is not what a chat server sends and should be dropped.
    pub(crate) fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// Ends the body: a last line without terminator is processed, and an event that was not
    /// closed by an empty line is still dispatched (servers that stop without a blank line).
    pub fn finish(&mut self) -> Option<SseEvent> {
        let mut out = Vec::new();
        if !self.line.is_empty() {
            self.end_line(&mut out);
        }
        self.dispatch(&mut out);
        out.pop()
    }

    fn end_line(&mut self, out: &mut Vec<SseEvent>) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line[0] == b':' {
            return; // comment / keep-alive
        }
        let line = String::from_utf8_lossy(&line);
        let (field, value) = match line.find(':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (&line[..], ""),
        };
        match field {
            "data" => {
                self.data_bytes += value.len() + 1;
                if self.data_bytes > MAX_EVENT_BYTES {
                    self.overflowed = true;
                } else {
                    self.data.push(value.to_string());
                }
                self.has_fields = true;
            }
            "event" => {
                self.event = Some(value.to_string());
                self.has_fields = true;
            }
            "id" => {
                if !value.contains('\0') {
                    self.id = Some(value.to_string());
                }
                self.has_fields = true;
            }
            _ => {} // `retry` and unknown fields
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        if !self.has_fields {
            return;
        }
        self.has_fields = false;
        self.data_bytes = 0;
        let data = std::mem::take(&mut self.data).join("\n");
        let event = self.event.take();
        let id = self.id.take();
        if data.is_empty() && event.is_none() {
            return;
        }
        out.push(SseEvent { event, data, id });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        let mut v = Vec::new();
        for c in chunks {
            v.extend(p.push(c));
        }
        v.extend(p.finish());
        v
    }

    fn data(s: &str) -> SseEvent {
        SseEvent {
            data: s.into(),
            ..Default::default()
        }
    }

    #[test]
    fn an_endless_line_is_not_kept() {
        let mut p = SseParser::new();
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..64 {
            assert!(p.push(&chunk).is_empty());
        }
        assert!(p.overflowed());
        assert!(p.line.len() <= MAX_LINE_BYTES);
    }

    #[test]
    fn an_endless_event_is_not_kept() {
        let mut p = SseParser::new();
        let line = format!("data: {}\n", "y".repeat(1000));
        for _ in 0..4096 {
            assert!(p.push(line.as_bytes()).is_empty());
        }
        assert!(p.overflowed());
        assert!(p.data.iter().map(|d| d.len() + 1).sum::<usize>() <= MAX_EVENT_BYTES);
        // Normal events after a bounded one still parse.
        let mut p = SseParser::new();
        assert_eq!(p.push(line.as_bytes()).len(), 0);
        assert_eq!(p.push(b"\n").len(), 1);
        assert!(!p.overflowed());
    }

    #[test]
    fn line_endings() {
        assert_eq!(all(&[b"data: a\n\n"]), vec![data("a")]);
        assert_eq!(all(&[b"data: a\r\n\r\n"]), vec![data("a")]);
        assert_eq!(
            all(&[b"data: a\r\rdata: b\r\r"]),
            vec![data("a"), data("b")]
        );
        assert_eq!(
            all(&[b"data: a\n\ndata: b\r\n\r\ndata: c\r\r"]),
            vec![data("a"), data("b"), data("c")]
        );
    }

    #[test]
    fn crlf_split_across_chunks() {
        // "\r" ends a chunk and "\n" starts the next: one line ending, not two.
        assert_eq!(
            all(&[b"data: a\r", b"\n", b"data: b\r\n\r\n"]),
            vec![data("a\nb")]
        );
        assert_eq!(
            all(&[b"data: a\r\n\r", b"\ndata: b\n\n"]),
            vec![data("a"), data("b")]
        );
    }

    #[test]
    fn multi_line_data_joined() {
        assert_eq!(
            all(&[b"data: one\ndata: two\ndata:three\n\n"]),
            vec![data("one\ntwo\nthree")]
        );
    }

    #[test]
    fn only_one_space_stripped() {
        assert_eq!(all(&[b"data:  x \n\n"]), vec![data(" x ")]);
        assert_eq!(all(&[b"data:x\n\n"]), vec![data("x")]);
        assert_eq!(all(&[b"data\n\n"]), Vec::<SseEvent>::new());
        assert_eq!(all(&[b"data\ndata: y\n\n"]), vec![data("\ny")]);
    }

    #[test]
    fn comments_and_unknown_fields_ignored() {
        let ev = all(&[b": keepalive\n\n:comment\nfoo: bar\nretry: 10\ndata: z\n\n"]);
        assert_eq!(ev, vec![data("z")]);
    }

    #[test]
    fn event_names_and_ids() {
        let ev = all(&[b"event: hermes.tool.progress\ndata: {\"x\":1}\nid: 7\n\ndata: plain\n\n"]);
        assert_eq!(
            ev,
            vec![
                SseEvent {
                    event: Some("hermes.tool.progress".into()),
                    data: "{\"x\":1}".into(),
                    id: Some("7".into()),
                },
                data("plain"),
            ]
        );
    }

    #[test]
    fn done_sentinel() {
        let ev = all(&[b"data: [DONE]\n\n"]);
        assert!(ev[0].is_done());
        assert!(!data("{\"a\":\"[DONE]\"}").is_done());
    }

    #[test]
    fn utf8_split_across_chunks() {
        let s = "data: héllo – ✓ 😀\n\n".as_bytes();
        for cut in 1..s.len() {
            let ev = all(&[&s[..cut], &s[cut..]]);
            assert_eq!(ev, vec![data("héllo – ✓ 😀")], "cut at {cut}");
        }
    }

    #[test]
    fn byte_by_byte() {
        let s = b"event: e\r\ndata: a\r\ndata: b\r\n\r\n: ka\r\ndata: [DONE]\r\n\r\n";
        let mut p = SseParser::new();
        let mut v = Vec::new();
        for b in s.iter() {
            v.extend(p.push(std::slice::from_ref(b)));
        }
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].event.as_deref(), Some("e"));
        assert_eq!(v[0].data, "a\nb");
        assert!(v[1].is_done());
        assert_eq!(p.finish(), None);
    }

    #[test]
    fn unterminated_last_event_flushed_at_eof() {
        assert_eq!(
            all(&[b"data: a\n\ndata: [DONE]"]),
            vec![data("a"), data("[DONE]")]
        );
        assert_eq!(all(&[b"data: a\n"]), vec![data("a")]);
    }

    #[test]
    fn blank_lines_alone_dispatch_nothing() {
        assert_eq!(all(&[b"\n\n\r\n\r\r"]), Vec::<SseEvent>::new());
    }
}
