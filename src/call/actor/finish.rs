//! The end of a call in the actor: streams dropped or closed gracefully, usage totalled, the
//! transcript persisted and the final record handed to the registry.

use super::*;

impl Actor {
    /// Adds the open brain turn's tokens to the call's usage.
    pub(super) fn end_brain_turn(&mut self) {
        let t = std::mem::take(&mut self.turn_tokens);
        self.usage.llm_prompt_tokens += t.prompt_tokens;
        self.usage.llm_completion_tokens += t.completion_tokens;
        self.llm_requested = None;
    }

    pub(super) fn finish(mut self, reason: EndReason) {
        self.llm = None;
        let _ = self.mouth.clear(Instant::now());
        self.tts.clear();
        // What is batched goes first; then nothing more reaches the session.
        self.caller.stt.send(SttInput::Close);
        self.caller.stt.set_input(None);
        (self.usage.stt_audio_ms, self.stt_frames_dropped) = self.caller.stt.totals();
        if let Some(stt) = self.stt.take() {
            // Let the session close gracefully, but never for long.
            tokio::spawn(async move {
                let SttStream {
                    input,
                    mut events,
                    guard,
                } = stt;
                let _ = tokio::time::timeout(Duration::from_secs(2), async {
                    while events.recv().await.is_some() {}
                })
                .await;
                drop((input, guard));
            });
        }
        self.media_tx = None;
        self.media_rx = None;
        // Dropping the recorder lets its writer finish the file.
        self.recorder = None;
        if self.answered.is_some() {
            (0..self.policy.transcript().len()).for_each(|i| self.persist(i));
        }
        self.end_brain_turn();
        self.usage.carrier_ms = self.answered.map_or(0, |a| a.elapsed().as_millis() as u64);
        self.event(EventKind::CallEnd, reason.log_text());
        if let Some(trace) = self.trace.take() {
            trace.finish(&reason, Instant::now());
        }
        if let Some(store) = &self.setup.log {
            store.usage(&self.setup.call_id, &self.usage);
            store.ended(&self.setup.call_id, &reason);
        }
        let duration = self
            .answered
            .map(|a| a.elapsed().as_secs_f64())
            .unwrap_or(0.0);
        info!(
            from = %mask_number(&self.setup.from),
            to = %mask_number(&self.setup.to),
            reason = %reason.log_text(),
            duration_s = format!("{duration:.1}"),
            turns = self.policy.turns(),
            transcript_entries = self.policy.transcript().len(),
            frames_dropped = self.frames_dropped,
            stt_frames_dropped = self.stt_frames_dropped,
            dtmf_dropped = self.policy.dtmf_dropped(),
            wakes = self.wakes,
            "call ended"
        );
        let record = self.record(&reason);
        self.registry.finish(record);
    }
}
