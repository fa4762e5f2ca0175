//! The call log the composition root plugs into each call: [`CallObserver`] forwards everything
//! to the store and derives the daemon's call metrics from the same typed reports — stage
//! latencies from the timeline's events (turn end → brain request, brain first token, TTS first
//! audio, turn end → reply first frame, barge-in onset → clear), turns, barge-ins, provider
//! errors, dropped frames and call outcomes — and prices the call's usage with `[pricing]`
//! ([`Prices`]) when it ends; and the call's webhook events for the outbox
//! (`app::webhooks::CallHooks`), queued with the writes they report. Each method is a few
//! relaxed atomic operations and queue pushes, so the actor that calls it never waits.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::call::{
    CallEvent, CallLog, CallSetup, Dropped, EndReason, EventDetail, EventKind, TranscriptEntry,
    Usage,
};
use crate::carrier::CarrierKind;
use crate::config::Config;
use crate::store::{CallCost, StoreTx, Write};

use super::metrics::{BargeIn, FrameDrop, Metrics, Outcome, Provider, ProviderErrorKind, Stage};

/// No time noted.
const NONE: u64 = u64::MAX;

/// The prices (US dollars) of the providers and carrier account one call uses; 0 when
/// `[pricing]` names none.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Prices {
    pub(crate) stt_per_minute: f64,
    pub(crate) tts_per_1k_characters: f64,
    pub(crate) llm_per_1m_input_tokens: f64,
    pub(crate) llm_per_1m_output_tokens: f64,
    pub(crate) carrier_per_minute: f64,
}

impl Prices {
    pub(crate) fn for_call(config: &Config, setup: &CallSetup) -> Self {
        let p = &config.pricing;
        let a = &setup.agent;
        // A fallback chain is priced (and labelled) by its first member.
        let llm = a.llm.names().first().and_then(|n| p.llm.get(n));
        let tts = a.tts.names().first().and_then(|n| p.tts.get(n));
        Self {
            stt_per_minute: a
                .stt
                .names()
                .first()
                .and_then(|n| p.stt.get(n))
                .map_or(0.0, |x| x.usd_per_minute),
            tts_per_1k_characters: tts.map_or(0.0, |x| x.usd_per_1k_characters),
            llm_per_1m_input_tokens: llm.map_or(0.0, |x| x.usd_per_1m_input_tokens),
            llm_per_1m_output_tokens: llm.map_or(0.0, |x| x.usd_per_1m_output_tokens),
            carrier_per_minute: p
                .carriers
                .get(&setup.carrier_account)
                .map_or(0.0, |x| x.usd_per_minute),
        }
    }

    /// `usage` priced.
    pub(crate) fn cost(&self, usage: &Usage) -> CallCost {
        let minutes = |ms: u64| ms as f64 / 60_000.0;
        let stt_usd = minutes(usage.stt_audio_ms) * self.stt_per_minute;
        let tts_usd = usage.tts_characters as f64 / 1000.0 * self.tts_per_1k_characters;
        let llm_usd = usage.llm_prompt_tokens as f64 / 1e6 * self.llm_per_1m_input_tokens
            + usage.llm_completion_tokens as f64 / 1e6 * self.llm_per_1m_output_tokens;
        let carrier_usd = minutes(usage.carrier_ms) * self.carrier_per_minute;
        CallCost {
            usage: *usage,
            stt_usd,
            tts_usd,
            llm_usd,
            carrier_usd,
            total_usd: stt_usd + tts_usd + llm_usd + carrier_usd,
        }
    }
}

/// One call's log: the store plus the metrics derived on the way.
pub(crate) struct CallObserver {
    store: StoreTx,
    prices: Prices,
    metrics: Arc<Metrics>,
    carrier: CarrierKind,
    stt: Option<Provider>,
    /// The kinds of the agent's STTs by `[stt.NAME]` (the chain's members).
    stt_kinds: Vec<(String, Provider)>,
    tts: Option<Provider>,
    llm: Option<Provider>,
    /// `t_ms` of the caller's latest turn end, until the brain request that answers it.
    turn_end_ms: AtomicU64,
    /// `t_ms` of the caller's latest speech onset, until a barge-in stop follows.
    speech_start_ms: AtomicU64,
    /// This turn's wait for the brain's first token and for the first synthesis after it
    /// (µs; [`NONE`] until known): what the reply's first frame waited on the providers.
    brain_us: AtomicU64,
    tts_us: AtomicU64,
    /// The call's webhook receivers (`[[webhooks]]`), if any wants its events.
    hooks: Option<super::webhooks::CallHooks>,
    /// The call's summary, when its agent has `[agents.X.summary]`.
    summary: Option<Arc<super::webhooks::SummaryJob>>,
}

impl CallObserver {
    pub(crate) fn new(
        config: &Config,
        providers: &crate::provider::Providers,
        store: StoreTx,
        metrics: Arc<Metrics>,
        setup: &CallSetup,
    ) -> Self {
        let a = &setup.agent;
        Self {
            store,
            prices: Prices::for_call(config, setup),
            metrics,
            carrier: setup.carrier,
            stt: a
                .stt
                .names()
                .first()
                .and_then(|n| config.stt.get(n))
                .map(|c| Provider::from(c.kind)),
            stt_kinds: a
                .stt
                .names()
                .into_iter()
                .filter_map(|n| config.stt.get(&n).map(|c| (n, Provider::from(c.kind))))
                .collect(),
            tts: a
                .tts
                .names()
                .first()
                .and_then(|n| config.tts.get(n))
                .map(|c| Provider::from(c.kind)),
            llm: a
                .llm
                .names()
                .first()
                .and_then(|n| config.llm.get(n))
                .map(|c| Provider::from(c.kind)),
            turn_end_ms: AtomicU64::new(NONE),
            speech_start_ms: AtomicU64::new(NONE),
            brain_us: AtomicU64::new(NONE),
            tts_us: AtomicU64::new(NONE),
            hooks: super::webhooks::CallHooks::new(config, setup),
            summary: super::webhooks::SummaryJob::new(providers, setup),
        }
    }

    /// The reply's first frame went out `reply_us` after the turn ended: patterd's own share
    /// is that less the brain's first token and the first synthesis after it (the
    /// `patterd_own` stage; turns without both are not counted).
    fn observe_own(&self, reply_us: Option<u64>) {
        let brain = self.brain_us.swap(NONE, Ordering::Relaxed);
        let tts = self.tts_us.swap(NONE, Ordering::Relaxed);
        if let Some(reply) = reply_us
            && brain != NONE
            && tts != NONE
        {
            let own = reply.saturating_sub(brain).saturating_sub(tts);
            self.metrics
                .stage_seconds
                .observe(Stage::PatterdOwn, Duration::from_micros(own));
        }
    }

    fn remember_us(slot: &AtomicU64, us: Option<u64>) {
        if let Some(us) = us {
            slot.store(us, Ordering::Relaxed);
        }
    }

    fn observe_since(&self, mark: &AtomicU64, now_ms: u64, stage: Stage) {
        let then = mark.swap(NONE, Ordering::Relaxed);
        if then != NONE && now_ms >= then {
            self.metrics
                .stage_seconds
                .observe(stage, Duration::from_millis(now_ms - then));
        }
    }

    fn observe_us(&self, us: Option<u64>, stage: Stage) {
        if let Some(us) = us {
            self.metrics
                .stage_seconds
                .observe(stage, Duration::from_micros(us));
        }
    }

    /// An `stt_switched` event counted by the kind left and why.
    fn stt_switched(&self, detail: &EventDetail) {
        let EventDetail::SttSwitched { reason, from, .. } = detail else {
            return;
        };
        if let Some((_, kind)) = self.stt_kinds.iter().find(|(n, _)| n == from) {
            self.metrics.stt_switches.inc((*kind, *reason));
        }
    }

    fn provider_error(&self, p: Option<Provider>, kind: ProviderErrorKind) {
        if let Some(p) = p {
            self.metrics.provider_errors.inc((p, kind));
        }
    }

    /// The metrics one timeline event feeds.
    fn derive(&self, e: &CallEvent, detail: &EventDetail) {
        let m = &self.metrics;
        let us = detail.micros();
        match e.kind {
            EventKind::TurnEnd => self.turn_end_ms.store(e.t_ms, Ordering::Relaxed),
            EventKind::LlmRequest => {
                self.brain_us.store(NONE, Ordering::Relaxed);
                self.tts_us.store(NONE, Ordering::Relaxed);
                m.turns.inc(self.carrier);
                self.observe_since(&self.turn_end_ms, e.t_ms, Stage::SttFinalToBrainRequest);
            }
            EventKind::LlmFirstToken => {
                self.observe_us(us, Stage::BrainFirstToken);
                Self::remember_us(&self.brain_us, us);
                self.tts_us.store(NONE, Ordering::Relaxed);
            }
            EventKind::TtsFirstAudio => {
                self.observe_us(us, Stage::TtsFirstAudio);
                // The first synthesis after the brain's first token (a filler's came before).
                if self.brain_us.load(Ordering::Relaxed) != NONE
                    && self.tts_us.load(Ordering::Relaxed) == NONE
                {
                    Self::remember_us(&self.tts_us, us);
                }
            }
            EventKind::ReplyFirstFrame => {
                self.observe_us(us, Stage::TurnEndToReplyFirstFrame);
                self.observe_own(us);
            }
            EventKind::SpeechStart => self.speech_start_ms.store(e.t_ms, Ordering::Relaxed),
            EventKind::BargeInStop => {
                self.observe_since(&self.speech_start_ms, e.t_ms, Stage::BargeInToClear)
            }
            EventKind::BargeInCommit => m.barge_ins.inc(BargeIn::Committed),
            EventKind::BargeInResume => m.barge_ins.inc(BargeIn::Resumed),
            EventKind::EchoIgnored => m.barge_ins.inc(BargeIn::Echo),
            EventKind::SttError => self.provider_error(self.stt, ProviderErrorKind::SttSession),
            EventKind::SttReopen => self.provider_error(self.stt, ProviderErrorKind::SttReopen),
            EventKind::SttSwitched => self.stt_switched(detail),
            EventKind::LlmError => self.provider_error(self.llm, ProviderErrorKind::LlmTurn),
            EventKind::TtsError => self.provider_error(self.tts, ProviderErrorKind::TtsSynthesis),
            _ => {}
        }
    }
}

impl CallLog for CallObserver {
    fn event(&self, call_id: &str, event: &CallEvent, typed: &EventDetail) {
        self.derive(event, typed);
        self.store.event(call_id, event);
    }
    fn turn(&self, call_id: &str, seq: usize, entry: &TranscriptEntry) {
        self.store.turn(call_id, seq, entry);
        if let Some(h) = &self.hooks {
            self.store.outbox(h.turn(seq, entry));
        }
        if let Some(s) = &self.summary {
            s.turn(seq, entry);
        }
    }
    fn answered(&self, call_id: &str) {
        self.store.answered(call_id);
        if let Some(h) = &self.hooks {
            self.store.outbox(h.started());
        }
    }
    fn reply_latency(&self, call_id: &str, latency_us: u64) {
        self.store.reply_latency(call_id, latency_us);
    }
    fn ended(&self, call_id: &str, reason: &EndReason) {
        self.metrics
            .calls_ended
            .inc((self.carrier, Outcome::from(reason)));
        // A call with something to summarise is summarised; its `call.ended` waits for it.
        let summary = self.summary.as_ref().filter(|s| s.has_transcript());
        // The end's webhook events commit with the end row (`store::outbox`).
        let outbox = self
            .hooks
            .as_ref()
            .map(|h| h.ended(reason, summary.is_some()))
            .unwrap_or_default();
        self.store.ended_with(call_id, reason, outbox);
        if let Some(s) = summary {
            s.spawn(call_id, self.store.clone());
        }
    }
    fn recording_ready(&self, _call_id: &str, bytes: u64) {
        if let Some(h) = &self.hooks {
            self.store.outbox(h.recording_ready(bytes));
        }
    }
    fn frame_dropped(&self, _call_id: &str, at: Dropped) {
        self.metrics.frames_dropped.inc(match at {
            Dropped::ToCarrier => FrameDrop::ToCarrier,
            Dropped::ToStt => FrameDrop::ToStt,
            Dropped::ToRecording => FrameDrop::ToRecording,
        });
    }
    fn usage(&self, call_id: &str, usage: &Usage) {
        self.store.send(Write::Cost {
            call_id: call_id.to_string(),
            cost: self.prices.cost(usage),
        });
    }
}
