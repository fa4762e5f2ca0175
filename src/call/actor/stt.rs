//! The call actor's speech-to-text side: the session's events turned into policy inputs, a
//! fallback chain's switch on the timeline, and the one reopen of a session that died
//! mid-call (the caller-audio stage's [`SttFeed`](crate::call::ingress::SttFeed), in the
//! shared [`CallerShared`](crate::call::ingress::CallerShared), follows the session the actor
//! sets).

use super::*;

impl Actor {
    pub(super) fn on_stt(&mut self, ev: Option<SttEvent>) -> Option<EndReason> {
        let Some(ev) = ev else {
            self.set_stt(None);
            return None;
        };
        match ev {
            SttEvent::Connected => self.event(EventKind::SttConnected, ""),
            SttEvent::SpeechStarted => {}
            SttEvent::Interim(text) => return self.step(Input::Interim(text)),
            SttEvent::Final {
                text,
                speech_final,
                from_finalize,
            } => {
                return self.step(Input::Final {
                    text,
                    speech_final,
                    from_finalize,
                });
            }
            SttEvent::UtteranceEnd => return self.step(Input::UtteranceEnd),
            SttEvent::EagerEndOfTurn(text) => return self.step(Input::EagerEndOfTurn(text)),
            SttEvent::TurnResumed => return self.step(Input::TurnResumed),
            SttEvent::EndOfTurn(text) => return self.step(Input::EndOfTurn(text)),
            SttEvent::Error { message, fatal } => {
                warn!(%message, fatal, "speech-to-text error");
                self.event(EventKind::SttError, message);
                if fatal {
                    self.set_stt(None);
                    self.reopen_stt();
                }
            }
            SttEvent::Closed => {
                self.set_stt(None);
                if self.answered.is_some() {
                    self.reopen_stt();
                }
            }
            SttEvent::Switched {
                from,
                to,
                reason,
                message,
                ends_turns,
            } => return self.stt_switched(&from, &to, reason, &message, ends_turns),
        }
        None
    }

    /// The agent's STT chain moved this call to its next STT: on the timeline, and the turn
    /// model follows the new STT's.
    pub(super) fn stt_switched(
        &mut self,
        from: &str,
        to: &str,
        reason: crate::provider::fallback_stt::SttSwitchReason,
        message: &str,
        ends_turns: bool,
    ) -> Option<EndReason> {
        warn!(%from, %to, %reason, %message, "speech-to-text switched");
        self.event(
            EventKind::SttSwitched,
            EventDetail::SttSwitched {
                reason,
                from: from.to_string(),
                to: to.to_string(),
                message: message.to_string(),
            },
        );
        self.step(Input::SttChanged { ends_turns })
    }

    /// A speech-to-text session that dies mid-call is reopened once; after that the caller is
    /// told and the call ends when they hang up or the media times out.
    pub(super) fn reopen_stt(&mut self) {
        if self.stt_reopened {
            return;
        }
        self.stt_reopened = true;
        self.event(EventKind::SttReopen, "");
        let stt = self.open_stt();
        self.set_stt(Some(stt));
    }

    /// The STT session from now on; the caller-audio stage writes to it too.
    pub(super) fn set_stt(&mut self, stt: Option<SttStream>) {
        self.caller
            .stt
            .set_input(stt.as_ref().map(|s| s.input.clone()));
        self.stt = stt;
    }

    pub(super) fn open_stt(&self) -> SttStream {
        let call_id = self.setup.call_id.clone();
        self.setup.providers.stt.open(&SttContext {
            call_id,
            fallback: false,
        })
    }
}
