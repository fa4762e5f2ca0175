//! The call actor's carrier side: handle messages (attach, hang up, say, act, snapshot), the
//! media stream's events and the caller-audio stage's notes turned into policy inputs, the
//! commands sent to the carrier (what the carrier accepted is recorded) and the pacer that
//! feeds it the agent's audio.

use super::*;

impl Actor {
    pub(super) fn on_msg(&mut self, msg: CallMsg) -> Option<EndReason> {
        match msg {
            CallMsg::Attach(m) => return self.attach(m),
            CallMsg::HangUp { reason } => {
                self.event(EventKind::HangUp, reason.as_str());
                self.hang_up_leg();
                return Some(EndReason::HungUp(reason));
            }
            CallMsg::Say(text) => return self.step(Input::Say(text)),
            CallMsg::Machine { message, machine } => {
                use crate::carrier::dial::Machine;
                let greeting_over = match machine {
                    Machine::Greeting => false,
                    Machine::GreetingEnded => true,
                    Machine::Fax => {
                        return self.on_msg(CallMsg::HangUp {
                            reason: "a fax machine answered".into(),
                        });
                    }
                };
                let end = self.step(Input::Machine {
                    message,
                    greeting_over,
                });
                // The beep detector listens from the next frame on.
                self.caller.beep.set(self.policy.awaits_beep());
                return end;
            }
            CallMsg::Snapshot(tx) => {
                let _ = tx.send(self.record(&EndReason::InProgress));
            }
            CallMsg::Progress(cursor, tx) => {
                let _ = tx.send(self.events.delta(self.policy.transcript(), cursor));
            }
            CallMsg::Act { action, reply } => {
                if self.media_tx.is_none() {
                    let _ = reply.send(ActionOutcome::Refused {
                        reason: "the call has not been answered yet".into(),
                    });
                    return None;
                }
                self.next_act += 1;
                let id = self.next_act;
                self.replies.insert(id, reply);
                return self.step(Input::Act { id, action });
            }
        }
        None
    }

    fn attach(&mut self, m: MediaAttach) -> Option<EndReason> {
        if self.media_tx.is_some() {
            warn!("a second media stream for this call was refused");
            return None;
        }
        let now = Instant::now();
        self.answered = Some(now);
        self.last_media = now;
        self.media_tx = Some(m.commands);
        self.media_rx = Some(m.events);
        self.leg = Some(m.leg);
        self.recorder = self.setup.recording.clone().map(|path| {
            let log = self.setup.log.clone();
            let call_id = self.setup.call_id.clone();
            Recorder::start(
                path,
                log.map(|log| -> Box<dyn FnOnce(u64) + Send> {
                    Box::new(move |bytes| log.recording_ready(&call_id, bytes))
                }),
            )
        });
        // The caller-audio stage goes to the media pump; kept here when nobody asked for it.
        if let Some(vad) = self.vad.take() {
            let ingress = self
                .caller
                .stage(vad, self.stt_tail_ms)
                .with_recorder(self.recorder.as_ref().map(Recorder::caller_track))
                .with_log(self.setup.log.clone(), &self.setup.call_id);
            self.ingress = match m.ingress {
                Some(to_pump) => to_pump.send(ingress).err().map(CallerIngress::every_frame),
                None => Some(ingress.every_frame()),
            };
        }
        let end = self.step(Input::Answered);
        self.event(EventKind::MediaStart, m.start.stream_id.clone());
        if let Some(store) = &self.setup.log {
            store.answered(&self.setup.call_id);
        }
        info!(stream_id = %m.start.stream_id, "media stream started");
        end.or(self.pump_step())
    }

    pub(super) fn on_media(&mut self, ev: MediaEvent) -> Option<EndReason> {
        let now = Instant::now();
        self.last_media = now;
        match ev {
            MediaEvent::Start(_) => None,
            MediaEvent::Audio(frame) => {
                let note = self.ingress.as_mut()?.frame(frame, now)?;
                self.on_caller(note)
            }
            MediaEvent::Dtmf(d) => self.step(Input::Dtmf(d)),
            MediaEvent::MarkPlayed(name) => self.step(Input::Mark(name)),
            MediaEvent::Stop => {
                self.event(EventKind::CarrierStop, "");
                // A transfer ends the stream (Twilio, Plivo) before or after its REST answer.
                self.step(Input::StreamStopped)
                    .or(Some(EndReason::CallerHungUp))
            }
        }
    }

    /// What the caller-audio stage took in since its last note: the detector's events, then
    /// the voiced run (barge-in), as each frame used to be.
    pub(super) fn on_caller(&mut self, note: CallerNote) -> Option<EndReason> {
        self.last_media = Instant::now();
        let mut ended = None;
        for (event, audio_ms) in note.vad {
            ended = ended.or(self.step(Input::Vad { event, audio_ms }));
        }
        if let Some(path) = note.echo_path {
            let detail = match path {
                Some(p) => format!(
                    "delay_ms={} gain_db={:.1} spread_db={:.1}",
                    p.delay_ms, p.gain_db, p.spread_db
                ),
                None => "lost".to_string(),
            };
            self.event(EventKind::EchoPath, detail);
        }
        if let Some(beep) = note.beep {
            ended = ended.or(self.step(Input::Beep {
                freq_hz: beep.freq_hz,
                length_ms: beep.length_ms(),
            }));
        }
        ended.or(self.step(Input::CallerAudio {
            speech_run_ms: note.speech_run_ms,
            span_ms: note.speech_span_ms,
            pitched_ms: note.pitched_ms,
            echo_ms: note.echo_ms,
        }))
    }

    pub(super) fn send(&mut self, cmd: MediaCommand) {
        let Some(tx) = &self.media_tx else {
            return;
        };
        // What the recording hears of it, known before the command is handed over.
        let heard = match &cmd {
            MediaCommand::Audio(frame) => Some(Some(frame.clone())),
            MediaCommand::Clear => Some(None),
            _ => None,
        };
        if tx.try_send(cmd).is_err() {
            self.frames_dropped += 1;
            if let Some(log) = &self.setup.log {
                log.frame_dropped(&self.setup.call_id, Dropped::ToCarrier);
            }
            return;
        }
        // Only audio the carrier accepted is recorded; a clear withdraws what it flushes.
        let recorded = match (&self.recorder, heard) {
            (Some(rec), Some(Some(frame))) => rec.agent(frame),
            (Some(rec), Some(None)) => rec.clear(),
            _ => true,
        };
        if !recorded && let Some(log) = &self.setup.log {
            log.frame_dropped(&self.setup.call_id, Dropped::ToRecording);
        }
    }

    /// Sends what the pacer allows; returns the input saying which utterances started (for
    /// the policy, at once).
    pub(super) fn pump(&mut self) -> Option<Input> {
        self.media_tx.as_ref()?;
        let mut out = std::mem::take(&mut self.pumped);
        self.mouth.pump_into(Instant::now(), &mut out);
        let started =
            (!out.started.is_empty()).then(|| Input::Started(std::mem::take(&mut out.started)));
        for cmd in out.commands.drain(..) {
            self.send(cmd);
        }
        self.pumped = out;
        started
    }

    /// [`Actor::pump`] outside a step: what started goes to the policy as its own step.
    pub(super) fn pump_step(&mut self) -> Option<EndReason> {
        let started = self.pump()?;
        self.step(started)
    }
}
