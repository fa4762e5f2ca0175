//! The carrier's side of one simulated media stream once it is open: the [`Driver`] task that
//! paces caller audio in 20 ms frames, plays agent audio into a queue drained in real time,
//! acknowledges marks (or Plivo checkpoints), handles `clear`, validates every frame the app
//! sends against the dialect and records what it saw in the shared [`SimState`].

use super::*;

mod vonage;

pub(super) async fn write_text(
    wr: &mut WsWrite,
    text: String,
) -> Result<(), fastwebsockets::WebSocketError> {
    wr.write_frame(Frame::text(Payload::Owned(text.into_bytes())))
        .await
}

pub(super) struct Driver {
    pub(super) dialect: Dialect,
    /// Swap every tenth pair of media frames (Telnyx).
    pub(super) reorder: bool,
    /// A media frame held back to be sent after the next one.
    pub(super) held_frame: Option<Value>,
    pub(super) wr: WsWrite,
    pub(super) state: watch::Sender<SimState>,
    pub(super) t0: Instant,
    pub(super) stream_sid: String,
    pub(super) account_sid: String,
    pub(super) call_sid: String,
    /// Last `sequenceNumber` used.
    pub(super) seq: u64,
    /// Last media `chunk` used.
    pub(super) chunk: u64,
    pub(super) inbound: VecDeque<(Vec<u8>, bool)>,
    pub(super) in_speech: bool,
    /// Agent audio bytes ever queued for playback.
    pub(super) enqueued: u64,
    /// Agent audio bytes played or dropped.
    pub(super) played: u64,
    pub(super) pending_marks: VecDeque<(String, u64)>,
    pub(super) open_utterance: Option<usize>,
    /// Decodes in-band DTMF in the agent audio.
    pub(super) dtmf: crate::dtmf::DtmfReceiver,
    /// Background noise mixed into every caller frame, and the position in its loop.
    pub(super) background: Option<(Vec<i16>, usize)>,
    /// The live echo and the agent audio queued at the carrier since it was switched on.
    pub(super) echo: Option<(super::EchoPath, VecDeque<u8>)>,
    pub(super) _reader: TaskGuard,
}

impl Driver {
    fn ms(&self) -> u64 {
        self.t0.elapsed().as_millis() as u64
    }

    /// The next sequence number: a string for Twilio/Telnyx, a number for Plivo.
    fn next_seq(&mut self) -> Value {
        self.seq += 1;
        if self.dialect.is_plivo() {
            json!(self.seq)
        } else {
            json!(self.seq.to_string())
        }
    }

    pub(super) async fn run(
        mut self,
        mut cmds: mpsc::UnboundedReceiver<Cmd>,
        mut incoming: mpsc::UnboundedReceiver<Incoming>,
    ) {
        let mut tick = tokio::time::interval_at(
            self.t0 + Duration::from_millis(FRAME_MS),
            Duration::from_millis(FRAME_MS),
        );
        tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
        loop {
            let keep_going = tokio::select! {
                biased;
                msg = incoming.recv() => match msg {
                    Some(m) => self.on_incoming(m).await,
                    None => {
                        self.set_closed(ClosedBy::Transport, None, "reader ended".into());
                        false
                    }
                },
                cmd = cmds.recv() => match cmd {
                    Some(c) => self.on_cmd(c).await,
                    None => false,
                },
                _ = tick.tick() => self.on_tick().await,
            };
            if !keep_going {
                // A write fails when patterd has already closed the socket: let its close
                // frame, which the reader may still be holding, be recorded first.
                let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
                while self.state.borrow().closed.is_none() {
                    match tokio::time::timeout_at(deadline, incoming.recv()).await {
                        Ok(Some(m @ Incoming::Close(..))) => {
                            self.on_incoming(m).await;
                        }
                        Ok(Some(_)) => {}
                        Ok(None) | Err(_) => break,
                    }
                }
                self.set_closed(ClosedBy::Transport, None, "connection lost".into());
                return;
            }
        }
    }

    fn set_closed(&mut self, by: ClosedBy, code: Option<u16>, reason: String) {
        let at_ms = self.ms();
        self.state.send_modify(|s| {
            if s.closed.is_none() {
                s.closed = Some(CloseInfo {
                    at_ms,
                    by,
                    code,
                    reason,
                });
                s.push(at_ms, TimelineEvent::Closed(code));
            }
        });
    }

    /// Writes a frame; on failure records a transport close and returns false.
    async fn send(&mut self, v: Value) -> bool {
        match write_text(&mut self.wr, v.to_string()).await {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(error = %e, "simulated Twilio: write failed");
                false
            }
        }
    }

    async fn on_tick(&mut self) -> bool {
        // Playback: 20 ms of agent audio.
        let before = self.played;
        self.played = (self.played + FRAME_BYTES as u64).min(self.enqueued);
        if let Some((path, queue)) = &mut self.echo {
            let n = ((self.played - before) as usize).min(queue.len());
            let frame: Vec<u8> = queue.drain(..n).collect();
            path.played((!frame.is_empty()).then_some(&frame[..]));
        }
        if !self.echo_played_marks().await {
            return false;
        }
        // Caller audio: one frame, queued or filler silence.
        let (frame, speech) = self
            .inbound
            .pop_front()
            .unwrap_or_else(|| (vec![SILENCE_ULAW; FRAME_BYTES], false));
        let frame = self.mix_background(frame);
        let frame = match &mut self.echo {
            Some((path, _)) => path.mix(&frame),
            None => frame,
        };
        self.chunk += 1;
        let at = self.ms();
        let seq = self.next_seq();
        let msg = match self.dialect {
            Dialect::Vonage => {
                // Binary L16 16 kHz: each 8 kHz sample twice.
                let pcm: Vec<u8> = frame
                    .iter()
                    .flat_map(|&u| {
                        let b = patterd::audio::g711::ulaw_to_linear(u).to_le_bytes();
                        [b[0], b[1], b[0], b[1]]
                    })
                    .collect();
                if self
                    .wr
                    .write_frame(Frame::binary(Payload::Owned(pcm)))
                    .await
                    .is_err()
                {
                    return false;
                }
                Value::Null
            }
            Dialect::Twilio => json!({
                "event": "media",
                "sequenceNumber": seq,
                "media": {
                    "track": "inbound",
                    "chunk": self.chunk.to_string(),
                    "timestamp": at.to_string(),
                    "payload": STANDARD.encode(&frame),
                },
                "streamSid": self.stream_sid,
            }),
            Dialect::Telnyx => json!({
                "event": "media",
                "sequence_number": seq,
                "media": {
                    "track": "inbound",
                    "chunk": self.chunk.to_string(),
                    "timestamp": at.to_string(),
                    "payload": STANDARD.encode(&frame),
                },
                "stream_id": self.stream_sid,
            }),
            Dialect::PlivoMulaw | Dialect::PlivoL16 => {
                let payload = if self.dialect == Dialect::PlivoL16 {
                    frame
                        .iter()
                        .flat_map(|&u| patterd::audio::g711::ulaw_to_linear(u).to_le_bytes())
                        .collect::<Vec<u8>>()
                } else {
                    frame.clone()
                };
                json!({
                    "event": "media",
                    "sequenceNumber": seq,
                    "streamId": self.stream_sid,
                    "media": {
                        "track": "inbound",
                        "timestamp": at.to_string(),
                        "chunk": self.chunk,
                        "payload": STANDARD.encode(payload),
                    },
                })
            }
        };
        if msg.is_null() {
            // Already sent (binary).
        } else if self.reorder && self.held_frame.is_none() && self.chunk % 10 == 5 {
            // Hold this frame back; it goes out after the next one.
            self.held_frame = Some(msg);
        } else {
            if !self.send(msg).await {
                return false;
            }
            if let Some(held) = self.held_frame.take()
                && !self.send(held).await
            {
                return false;
            }
        }
        let was_speech = self.in_speech;
        self.in_speech = speech;
        let (played, enqueued) = (self.played, self.enqueued);
        let queued = self.inbound.iter().filter(|(_, s)| *s).count();
        self.state.send_modify(|s| {
            s.frames_sent += 1;
            s.sent_audio.extend_from_slice(&frame);
            s.played_bytes = played;
            s.playback_queued_bytes = enqueued - played;
            s.speech_frames_queued = queued;
            if speech {
                s.speech_frames_sent += 1;
                s.last_speech_frame_ms = Some(at);
                if !was_speech {
                    s.push(at, TimelineEvent::SentSpeechStart);
                    s.speech_start_played.push((at, played));
                }
            } else if was_speech {
                s.push(at, TimelineEvent::SentSpeechEnd);
            }
        });
        true
    }

    /// `frame` with the next 20 ms of background noise added (unchanged without one).
    fn mix_background(&mut self, frame: Vec<u8>) -> Vec<u8> {
        use patterd::audio::g711::{linear_to_ulaw, ulaw_to_linear};
        let Some((bed, pos)) = &mut self.background else {
            return frame;
        };
        frame
            .iter()
            .map(|&u| {
                let n = bed[*pos % bed.len()];
                *pos = (*pos + 1) % bed.len();
                let s = i32::from(ulaw_to_linear(u)) + i32::from(n);
                linear_to_ulaw(s.clamp(-32768, 32767) as i16)
            })
            .collect()
    }

    /// Echoes pending marks whose audio has all played.
    async fn echo_played_marks(&mut self) -> bool {
        while let Some((_, pos)) = self.pending_marks.front() {
            if *pos > self.played {
                break;
            }
            let Some((name, _)) = self.pending_marks.pop_front() else {
                break;
            };
            if !self.echo_mark(name).await {
                return false;
            }
        }
        true
    }

    async fn echo_mark(&mut self, name: String) -> bool {
        let seq = self.next_seq();
        let msg = match self.dialect {
            Dialect::Twilio => json!({
                "event": "mark",
                "sequenceNumber": seq,
                "streamSid": self.stream_sid,
                "mark": {"name": name},
            }),
            Dialect::Telnyx => json!({
                "event": "mark",
                "sequence_number": seq,
                "stream_id": self.stream_sid,
                "mark": {"name": name},
            }),
            Dialect::PlivoMulaw | Dialect::PlivoL16 => json!({
                "event": "playedStream",
                "sequenceNumber": seq,
                "streamId": self.stream_sid,
                "name": name,
            }),
            Dialect::Vonage => json!({"event": "websocket:notify", "payload": {"mark": name}}),
        };
        if !self.send(msg).await {
            return false;
        }
        let at = self.ms();
        self.state.send_modify(|s| {
            s.push(at, TimelineEvent::EchoedMark(name.clone()));
            s.marks_echoed.push((at, name));
        });
        true
    }

    async fn on_cmd(&mut self, cmd: Cmd) -> bool {
        match cmd {
            Cmd::Audio(frame, speech) => {
                self.inbound.push_back((frame, speech));
                let queued = self.inbound.iter().filter(|(_, s)| *s).count();
                self.state.send_modify(|s| s.speech_frames_queued = queued);
                true
            }
            Cmd::Words(track, words) => {
                // The clip's frames are queued right after this command, behind the frames
                // already queued: its first sample goes out at this stream time.
                let at = (self.chunk + self.inbound.len() as u64) * FRAME_MS;
                track.add(words.into_iter().map(|w| crate::words::TimedWord {
                    start_ms: at + w.start_ms,
                    end_ms: at + w.end_ms,
                    word: w.word,
                }));
                true
            }
            Cmd::Background(pcm) => {
                self.background = pcm.map(|p| (p, 0));
                true
            }
            Cmd::Echo(cfg) => {
                self.echo = cfg.map(|c| (super::EchoPath::new(c), VecDeque::new()));
                true
            }
            Cmd::Dtmf(digit) => {
                let seq = self.next_seq();
                let msg = match self.dialect {
                    Dialect::Twilio => json!({
                        "event": "dtmf",
                        "streamSid": self.stream_sid,
                        "sequenceNumber": seq,
                        "dtmf": {"track": "inbound_track", "digit": digit.to_string()},
                    }),
                    Dialect::Telnyx => json!({
                        "event": "dtmf",
                        "stream_id": self.stream_sid,
                        "occurred_at": "2026-01-01T00:00:00.000000Z",
                        "sequence_number": seq,
                        "dtmf": {"digit": digit.to_string()},
                    }),
                    Dialect::PlivoMulaw | Dialect::PlivoL16 => json!({
                        "event": "dtmf",
                        "sequenceNumber": seq,
                        "streamId": self.stream_sid,
                        "dtmf": {"track": "inbound", "digit": digit.to_string(), "timestamp": self.ms().to_string()},
                    }),
                    Dialect::Vonage => {
                        json!({"event": "websocket:dtmf", "digit": digit.to_string(), "duration": 250})
                    }
                };
                let ok = self.send(msg).await;
                let at = self.ms();
                self.state.send_modify(|s| {
                    s.dtmf_sent.push(digit);
                    s.push(at, TimelineEvent::SentDtmf(digit));
                });
                ok
            }
            Cmd::Raw(text) => {
                let ok = write_text(&mut self.wr, text).await.is_ok();
                let at = self.ms();
                self.state
                    .send_modify(|s| s.push(at, TimelineEvent::SentRaw));
                ok
            }
            Cmd::HangUp(done) => {
                let seq = self.next_seq();
                let stop = match self.dialect {
                    Dialect::Twilio => Some(json!({
                        "event": "stop",
                        "sequenceNumber": seq,
                        "stop": {"accountSid": self.account_sid, "callSid": self.call_sid},
                        "streamSid": self.stream_sid,
                    })),
                    Dialect::Telnyx => Some(json!({
                        "event": "stop",
                        "sequence_number": seq,
                        "stream_id": self.stream_sid,
                        "stop": {"user_id": self.account_sid, "call_control_id": self.call_sid},
                    })),
                    // Plivo and Vonage end a stream by closing the socket.
                    Dialect::PlivoMulaw | Dialect::PlivoL16 | Dialect::Vonage => None,
                };
                if let Some(stop) = stop {
                    let _ = self.send(stop).await;
                    let at = self.ms();
                    self.state
                        .send_modify(|s| s.push(at, TimelineEvent::SentStop));
                }
                let _ = self
                    .wr
                    .write_frame(Frame::close(1000, b"caller hung up"))
                    .await;
                self.set_closed(ClosedBy::Client, Some(1000), "caller hung up".into());
                let _ = done.send(());
                false
            }
        }
    }

    async fn on_incoming(&mut self, msg: Incoming) -> bool {
        match msg {
            Incoming::Text(text) => self.on_text(&text).await,
            Incoming::Binary(b) if self.dialect == Dialect::Vonage => {
                self.on_vonage_audio(&b);
                true
            }
            Incoming::Binary(b) => {
                self.protocol_error(format!(
                    "binary frame of {} bytes (this dialect expects JSON text)",
                    b.len()
                ));
                true
            }
            Incoming::Obligated(op, payload) => {
                let _ = self
                    .wr
                    .write_frame(Frame::new(true, op, None, Payload::Owned(payload)))
                    .await;
                true
            }
            Incoming::Close(code, reason) => {
                self.set_closed(ClosedBy::Server, code, reason);
                false
            }
            Incoming::Error(e) => {
                self.set_closed(ClosedBy::Transport, None, e);
                false
            }
        }
    }

    fn protocol_error(&mut self, err: String) {
        let at = self.ms();
        self.state.send_modify(|s| {
            s.push(at, TimelineEvent::ProtocolError(err.clone()));
            s.protocol_errors.push(err);
        });
    }

    async fn on_text(&mut self, text: &str) -> bool {
        let short: String = text.chars().take(120).collect();
        let v: Value = match serde_json::from_str(text) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => {
                self.protocol_error(format!("frame is not a JSON object: {short}"));
                return true;
            }
            Err(e) => {
                self.protocol_error(format!("invalid JSON ({e}): {short}"));
                return true;
            }
        };
        let event = v.get("event").and_then(Value::as_str).unwrap_or("");
        match self.dialect {
            Dialect::Twilio => self.on_twilio_frame(event, &v, &short).await,
            Dialect::Telnyx => self.on_telnyx_frame(event, &v, &short).await,
            Dialect::PlivoMulaw | Dialect::PlivoL16 => self.on_plivo_frame(event, &v, &short).await,
            Dialect::Vonage => self.on_vonage_frame(&v, &short).await,
        }
    }

    /// Checks an id field: `required` ones must be present; present ones must be this stream's.
    fn check_stream_id(&mut self, event: &str, v: &Value, key: &str, required: bool) -> bool {
        match v.get(key).and_then(Value::as_str) {
            Some(sid) if sid == self.stream_sid => true,
            Some(sid) => {
                let msg = format!(
                    "{event}: {key} `{sid}` is not this stream's `{}`",
                    self.stream_sid
                );
                self.protocol_error(msg);
                false
            }
            None if required => {
                self.protocol_error(format!("{event}: missing {key}"));
                false
            }
            None => true,
        }
    }

    /// Decodes `media.payload`, recording what is wrong with it.
    fn payload(&mut self, event: &str, v: &Value) -> Option<Vec<u8>> {
        let payload = v
            .get("media")
            .and_then(|m| m.get("payload"))
            .and_then(Value::as_str);
        let Some(payload) = payload else {
            self.protocol_error(format!("{event}: missing media.payload string"));
            return None;
        };
        match STANDARD.decode(payload) {
            Ok(audio) if audio.starts_with(b"RIFF") => {
                self.protocol_error(format!(
                    "{event}: payload has a WAV header (played as noise)"
                ));
                None
            }
            Ok(audio) => Some(audio),
            Err(e) => {
                self.protocol_error(format!("{event}: payload is not base64 ({e})"));
                None
            }
        }
    }

    async fn on_twilio_frame(&mut self, event: &str, v: &Value, short: &str) -> bool {
        if !matches!(event, "media" | "mark" | "clear") {
            self.protocol_error(format!("unknown or missing event `{event}`: {short}"));
            return true;
        }
        if !self.check_stream_id(event, v, "streamSid", true) {
            return true;
        }
        match event {
            "media" => {
                if let Some(audio) = self.payload(event, v) {
                    self.on_agent_audio(&audio);
                }
                true
            }
            "mark" => self.on_mark_frame(v).await,
            _ => self.on_clear().await,
        }
    }

    /// A `mark` frame (Twilio, Telnyx): `{"mark": {"name": …}}`.
    async fn on_mark_frame(&mut self, v: &Value) -> bool {
        let name = v
            .get("mark")
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str);
        let Some(name) = name else {
            self.protocol_error("mark: missing mark.name string".into());
            return true;
        };
        self.on_mark(name.to_string()).await
    }

    async fn on_telnyx_frame(&mut self, event: &str, v: &Value, short: &str) -> bool {
        if !matches!(event, "media" | "mark" | "clear") {
            self.protocol_error(format!("unknown or missing event `{event}`: {short}"));
            return true;
        }
        if !self.check_stream_id(event, v, "stream_id", false) {
            return true;
        }
        match event {
            "media" => {
                if let Some(audio) = self.payload(event, v) {
                    // RTP mode: each message carries 20 ms to 30 s of PCMU.
                    if audio.len() < FRAME_BYTES || audio.len() > 30 * 8000 {
                        self.protocol_error(format!(
                            "media: {} bytes is outside 20 ms..30 s of PCMU",
                            audio.len()
                        ));
                    } else {
                        self.on_agent_audio(&audio);
                    }
                }
                true
            }
            "mark" => self.on_mark_frame(v).await,
            _ => self.on_clear().await,
        }
    }

    async fn on_plivo_frame(&mut self, event: &str, v: &Value, short: &str) -> bool {
        match event {
            "playAudio" => {
                if !self.check_stream_id(event, v, "streamId", false) {
                    return true;
                }
                let media = v.get("media");
                let ct = media
                    .and_then(|m| m.get("contentType"))
                    .and_then(Value::as_str);
                let rate = media.and_then(|m| m.get("sampleRate")).and_then(|r| {
                    r.as_u64()
                        .or_else(|| r.as_str().and_then(|s| s.parse().ok()))
                });
                let want = if self.dialect == Dialect::PlivoL16 {
                    "audio/x-l16"
                } else {
                    "audio/x-mulaw"
                };
                if ct != Some(want) || rate != Some(8000) {
                    self.protocol_error(format!(
                        "playAudio: contentType {ct:?} / sampleRate {rate:?} does not match the stream ({want}, 8000)"
                    ));
                    return true;
                }
                if let Some(audio) = self.payload(event, v) {
                    if self.dialect == Dialect::PlivoL16 {
                        if audio.len() % 2 != 0 {
                            self.protocol_error("playAudio: odd L16 byte count".into());
                            return true;
                        }
                        let ulaw: Vec<u8> = audio
                            .chunks_exact(2)
                            .map(|b| {
                                patterd::audio::g711::linear_to_ulaw(i16::from_le_bytes([
                                    b[0], b[1],
                                ]))
                            })
                            .collect();
                        self.on_agent_audio(&ulaw);
                    } else {
                        self.on_agent_audio(&audio);
                    }
                }
                true
            }
            "checkpoint" => {
                if !self.check_stream_id(event, v, "streamId", true) {
                    return true;
                }
                let Some(name) = v.get("name").and_then(Value::as_str) else {
                    self.protocol_error("checkpoint: missing name string".into());
                    return true;
                };
                self.on_mark(name.to_string()).await
            }
            "clearAudio" => {
                if !self.check_stream_id(event, v, "streamId", true) {
                    return true;
                }
                self.on_clear().await
            }
            _ => {
                self.protocol_error(format!("unknown or missing event `{event}`: {short}"));
                true
            }
        }
    }

    fn on_agent_audio(&mut self, audio: &[u8]) {
        let at = self.ms();
        let heard = self.dtmf.push_ulaw(audio);
        self.enqueued += audio.len() as u64;
        if let Some((_, queue)) = &mut self.echo {
            queue.extend(audio.iter().copied());
        }
        let end_pos = self.enqueued;
        let energy_sum = u64::from(ulaw_energy(audio)) * audio.len() as u64;
        let mut open = self.open_utterance;
        self.state.send_modify(|s| {
            s.agent_audio_bytes += audio.len() as u64;
            s.received_audio.extend_from_slice(audio);
            s.dtmf_heard.extend(heard.iter());
            s.first_agent_audio_ms.get_or_insert(at);
            s.last_agent_audio_ms = Some(at);
            s.playback_queued_bytes = end_pos - s.played_bytes.min(end_pos);
            s.push(at, TimelineEvent::ReceivedMedia { bytes: audio.len() });
            let idx = match open {
                Some(i) if i < s.utterances.len() => i,
                _ => {
                    s.utterances.push(Utterance {
                        start_ms: at,
                        ..Default::default()
                    });
                    s.utterances.len() - 1
                }
            };
            let u = &mut s.utterances[idx];
            u.last_ms = at;
            u.bytes += audio.len() as u64;
            u.energy_sum += energy_sum;
            u.mean_energy = u.energy_sum.checked_div(u.bytes).unwrap_or(0) as u32;
            u.end_pos = end_pos;
            open = Some(idx);
        });
        self.open_utterance = open;
    }

    async fn on_mark(&mut self, name: String) -> bool {
        let at = self.ms();
        let open = self.open_utterance.take();
        self.state.send_modify(|s| {
            s.push(at, TimelineEvent::ReceivedMark(name.clone()));
            s.marks_received.push((at, name.clone()));
            if let Some(u) = open.and_then(|i| s.utterances.get_mut(i)) {
                u.mark = Some(name.clone());
            }
        });
        if self.played >= self.enqueued {
            // Nothing queued: flush anything due, then echo this one at once.
            if !self.echo_played_marks().await {
                return false;
            }
            self.echo_mark(name).await
        } else {
            self.pending_marks.push_back((name, self.enqueued));
            true
        }
    }

    async fn on_clear(&mut self) -> bool {
        let at = self.ms();
        let played_before = self.played;
        self.played = self.enqueued;
        if let Some((_, queue)) = &mut self.echo {
            queue.clear();
        }
        self.open_utterance = None;
        let enqueued = self.enqueued;
        self.state.send_modify(|s| {
            s.push(at, TimelineEvent::ReceivedClear);
            s.clears.push(at);
            s.cleared_at_pos.push(played_before);
            for u in s.utterances.iter_mut().rev() {
                if u.end_pos <= played_before {
                    break;
                }
                u.cleared = true;
            }
            s.played_bytes = enqueued;
            s.playback_queued_bytes = 0;
        });
        if self.dialect == Dialect::Vonage {
            // Cleared notifies are not acknowledged; the clear itself is.
            self.pending_marks.clear();
            return self.send(json!({"event": "websocket:cleared"})).await;
        }
        if self.dialect.is_plivo() {
            // Cleared checkpoints are never acknowledged; the clear itself is.
            self.pending_marks.clear();
            let seq = self.next_seq();
            return self
                .send(json!({"event": "clearedAudio", "sequenceNumber": seq, "streamId": self.stream_sid}))
                .await;
        }
        while let Some((name, _)) = self.pending_marks.pop_front() {
            if !self.echo_mark(name).await {
                return false;
            }
        }
        true
    }
}
