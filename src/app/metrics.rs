//! Daemon-wide metrics, rendered at `GET /metrics` by the server in the Prometheus text format:
//! the [`Metrics`] registry (one line of the [`metrics!`] list per metric: field, type, name,
//! help), its lock-free primitives — [`Counter`] families and [`Histogram`] families over typed
//! label enums ([`LabelValue`]), each an array of atomics indexed by the label's position — and
//! the typed labels themselves. Nothing here locks or allocates on the hot path: a call actor
//! bumps an atomic and moves on.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::call::EndReason;
use crate::carrier::CarrierKind;
use crate::config::{LlmKind, SttKind, TtsKind};
use crate::provider::fallback_stt::SttSwitchReason;

// ------------------------------------------------------------------------------- labels

/// One label dimension: a typed enum whose every value is known up front, so a family's
/// storage is a fixed array of atomics.
pub(crate) trait LabelValue: Copy + 'static {
    /// The Prometheus label name.
    const KEY: &'static str;
    /// Every value, in index order.
    fn all() -> &'static [Self];
    /// This value's position in [`LabelValue::all`].
    fn index(self) -> usize;
    /// The rendered label value.
    fn as_label(self) -> &'static str;
}

/// A label set: no labels (`()`), one [`LabelValue`], or a pair of them.
pub trait Labels: Copy + 'static {
    /// How many distinct label sets there are.
    fn count() -> usize;
    fn index(self) -> usize;
    /// Writes `{k="v",…}` (or nothing) for the label set at `i`, with `extra` appended inside.
    fn render(i: usize, extra: Option<(&str, &str)>, out: &mut String);
}

fn render_pairs(pairs: &[(&str, &str)], out: &mut String) {
    if pairs.is_empty() {
        return;
    }
    out.push('{');
    for (n, (k, v)) in pairs.iter().enumerate() {
        if n > 0 {
            out.push(',');
        }
        let _ = write!(out, "{k}=\"{v}\"");
    }
    out.push('}');
}

impl Labels for () {
    fn count() -> usize {
        1
    }
    fn index(self) -> usize {
        0
    }
    fn render(_: usize, extra: Option<(&str, &str)>, out: &mut String) {
        render_pairs(extra.as_slice(), out);
    }
}

impl<L: LabelValue> Labels for L {
    fn count() -> usize {
        L::all().len()
    }
    fn index(self) -> usize {
        LabelValue::index(self)
    }
    fn render(i: usize, extra: Option<(&str, &str)>, out: &mut String) {
        let mut p = vec![(L::KEY, L::all()[i].as_label())];
        p.extend(extra);
        render_pairs(&p, out);
    }
}

impl<A: LabelValue, B: LabelValue> Labels for (A, B) {
    fn count() -> usize {
        A::all().len() * B::all().len()
    }
    fn index(self) -> usize {
        self.0.index() * B::all().len() + self.1.index()
    }
    fn render(i: usize, extra: Option<(&str, &str)>, out: &mut String) {
        let n = B::all().len();
        let mut p = vec![
            (A::KEY, A::all()[i / n].as_label()),
            (B::KEY, B::all()[i % n].as_label()),
        ];
        p.extend(extra);
        render_pairs(&p, out);
    }
}

/// Declares a label enum: its variants, their rendered values and the label's name.
macro_rules! label_enum {
    ($(#[$m:meta])* $name:ident, $key:literal { $($(#[$vm:meta])* $variant:ident => $value:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vm])* $variant),+ }

        impl LabelValue for $name {
            const KEY: &'static str = $key;
            fn all() -> &'static [Self] {
                &[$($name::$variant),+]
            }
            fn index(self) -> usize {
                self as usize
            }
            fn as_label(self) -> &'static str {
                match self { $($name::$variant => $value),+ }
            }
        }
    };
}

impl LabelValue for CarrierKind {
    const KEY: &'static str = "carrier";
    fn all() -> &'static [Self] {
        CarrierKind::ALL
    }
    fn index(self) -> usize {
        CarrierKind::ALL
            .iter()
            .position(|k| *k == self)
            .unwrap_or_default()
    }
    fn as_label(self) -> &'static str {
        self.as_str()
    }
}

/// Why a speech-to-text chain moved a call to its next STT.
impl LabelValue for SttSwitchReason {
    const KEY: &'static str = "reason";
    fn all() -> &'static [Self] {
        &SttSwitchReason::ALL
    }
    fn index(self) -> usize {
        SttSwitchReason::ALL
            .iter()
            .position(|r| *r == self)
            .unwrap_or_default()
    }
    fn as_label(self) -> &'static str {
        self.as_str()
    }
}

label_enum!(
    /// A stage of a turn whose latency is measured.
    Stage, "stage" {
        /// The caller's turn ended (STT final / endpointer) → the brain request went out.
        SttFinalToBrainRequest => "stt_final_to_brain_request",
        /// Brain request → its first token.
        BrainFirstToken => "brain_first_token",
        /// TTS request → its first audio byte.
        TtsFirstAudio => "tts_first_audio",
        /// The caller's turn ended → the first frame of the reply went to the carrier.
        TurnEndToReplyFirstFrame => "turn_end_to_reply_first_frame",
        /// The caller started speaking over the agent → the carrier was told to clear.
        BargeInToClear => "barge_in_to_clear",
        /// patterd's own share of a turn: `turn_end_to_reply_first_frame` less the brain's
        /// first token and the first synthesis after it.
        PatterdOwn => "patterd_own",
    }
);

label_enum!(
    /// How a call ended, from its [`EndReason`].
    Outcome, "outcome" {
        CallerHungUp => "caller_hung_up",
        HungUp => "hung_up",
        MediaClosed => "media_closed",
        MediaNeverConnected => "media_never_connected",
        NoMedia => "no_media",
        MaxDuration => "max_duration",
        CallerSilent => "caller_silent",
        Transferred => "transferred",
        BrainDown => "brain_down",
        Voicemail => "voicemail",
        Shutdown => "shutdown",
    }
);

impl From<&EndReason> for Outcome {
    fn from(r: &EndReason) -> Self {
        match r {
            EndReason::CallerHungUp => Outcome::CallerHungUp,
            EndReason::HungUp(_) => Outcome::HungUp,
            EndReason::MediaStreamClosed => Outcome::MediaClosed,
            EndReason::MediaNeverConnected => Outcome::MediaNeverConnected,
            EndReason::NoMedia => Outcome::NoMedia,
            EndReason::MaxDuration => Outcome::MaxDuration,
            EndReason::CallerSilent => Outcome::CallerSilent,
            EndReason::Transferred(_) => Outcome::Transferred,
            EndReason::BrainDown => Outcome::BrainDown,
            EndReason::VoicemailLeft => Outcome::Voicemail,
            EndReason::HandlesDropped | EndReason::InProgress => Outcome::Shutdown,
        }
    }
}

label_enum!(
    /// What became of one webhook delivery attempt.
    DeliveryOutcome, "outcome" {
        /// The receiver answered 2xx.
        Delivered => "delivered",
        /// It failed and is scheduled again.
        Retried => "retried",
        /// It failed for good (410 Gone, no entry for its URL, or past give_up_after_s).
        Dead => "dead",
    }
);

label_enum!(
    /// What became of caller speech over the agent.
    BargeIn, "kind" {
        /// The agent's turn was cut short.
        Committed => "committed",
        /// The agent was paused, then resumed (no words followed).
        Resumed => "resumed",
        /// The transcript matched the agent's own words and was ignored.
        Echo => "echo",
    }
);

/// A vendor, by its `kind` in the configuration: every name of the STT, TTS and brain kind
/// lists (`config::schema::kinds`) once, in their order, a name several lists share at its
/// last place (`openai_compatible` after `hermes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Provider(u8);

impl Provider {
    /// Every kind name, in label order.
    fn names() -> &'static [&'static str] {
        static NAMES: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
        NAMES.get_or_init(|| {
            let all = SttKind::ALL
                .iter()
                .map(|k| k.as_str())
                .chain(TtsKind::ALL.iter().map(|k| k.as_str()))
                .chain(LlmKind::ALL.iter().map(|k| k.as_str()))
                .collect::<Vec<_>>();
            all.iter()
                .enumerate()
                .filter(|(i, n)| !all[i + 1..].contains(n))
                .map(|(_, n)| *n)
                .collect()
        })
    }

    fn named(name: &str) -> Self {
        let i = Self::names().iter().position(|n| *n == name);
        Provider(i.and_then(|i| u8::try_from(i).ok()).unwrap_or_default())
    }
}

impl From<SttKind> for Provider {
    fn from(k: SttKind) -> Self {
        Provider::named(k.as_str())
    }
}

impl From<TtsKind> for Provider {
    fn from(k: TtsKind) -> Self {
        Provider::named(k.as_str())
    }
}

impl From<LlmKind> for Provider {
    fn from(k: LlmKind) -> Self {
        Provider::named(k.as_str())
    }
}

impl LabelValue for Provider {
    const KEY: &'static str = "provider";
    fn all() -> &'static [Self] {
        static ALL: std::sync::OnceLock<Vec<Provider>> = std::sync::OnceLock::new();
        ALL.get_or_init(|| {
            (0..Provider::names().len())
                .filter_map(|i| u8::try_from(i).ok().map(Provider))
                .collect()
        })
    }
    fn index(self) -> usize {
        usize::from(self.0)
    }
    fn as_label(self) -> &'static str {
        Provider::names()
            .get(usize::from(self.0))
            .copied()
            .unwrap_or("")
    }
}

label_enum!(
    /// How a provider failed.
    ProviderErrorKind, "kind" {
        /// The speech-to-text session failed.
        SttSession => "stt_session",
        /// The speech-to-text session was reopened after a failure.
        SttReopen => "stt_reopen",
        /// A brain turn failed (HTTP, stream, timeout or the brain's own error).
        LlmTurn => "llm_turn",
        /// A synthesis failed.
        TtsSynthesis => "tts_synthesis",
    }
);

label_enum!(
    /// Where a frame was dropped because the queue ahead of it was full.
    FrameDrop, "direction" {
        /// Agent audio, marks or clears for the carrier.
        ToCarrier => "to_carrier",
        /// Caller audio for speech-to-text.
        ToStt => "to_stt",
        /// Caller or agent audio for the call's recording.
        ToRecording => "to_recording",
    }
);

label_enum!(
    /// Why a carrier webhook or call was refused before it reached a call.
    RefusalReason, "reason" {
        BadSignature => "bad_signature",
        Replayed => "replayed",
        UnknownNumber => "unknown_number",
        CallerNotAllowed => "caller_not_allowed",
        Busy => "busy",
        StoreDown => "store_unavailable",
    }
);

label_enum!(
    /// What became of a request on a call another instance owns (`api::forward`).
    ForwardOutcome, "outcome" {
        /// Sent to the owner; its answer (whatever its status) relayed.
        Relayed => "relayed",
        /// The owner could not be reached in time (503 `owner_unreachable`).
        Unreachable => "unreachable",
        /// The owner answered something that is not patterd's JSON (502).
        BadAnswer => "bad_answer",
        /// Not sent: the owner stopped or was declared lost (409 `call_not_live`).
        OwnerLost => "owner_lost",
    }
);

label_enum!(
    /// What became of a new-call webhook a draining or full instance tried to hand to a peer.
    HandoffOutcome, "outcome" {
        /// A ready peer answered it; its answer was relayed.
        Handed => "handed",
        /// No ready peer: refused busy here.
        NoPeer => "no_peer",
        /// Every ready peer tried was busy as well: refused busy here.
        PeersBusy => "peers_busy",
        /// Ready peers, but none could be reached (or the database could not be asked):
        /// refused busy here.
        Failed => "failed",
    }
);

label_enum!(
    /// Why a span of a call's trace never reached the collector (`[telemetry]`).
    SpanDrop, "reason" {
        /// The exporter's queue was full (`max_queued_spans`): the collector is slow or down.
        QueueFull => "queue_full",
        /// The collector refused the batch, could not be reached or did not answer in time.
        ExportFailed => "export_failed",
    }
);

// ------------------------------------------------------------------------------- families

/// Something rendered at `/metrics` under `name`.
pub(crate) trait Family {
    fn render(&self, name: &str, help: &str, out: &mut String);
}

/// An unlabelled counter kept as a plain atomic (the daemon's first counters).
impl Family for AtomicU64 {
    fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
            self.load(Ordering::Relaxed)
        );
    }
}

/// A counter per label set.
pub struct Counter<L: Labels> {
    values: Box<[AtomicU64]>,
    _l: std::marker::PhantomData<L>,
}

impl<L: Labels> Default for Counter<L> {
    fn default() -> Self {
        Self {
            values: (0..L::count()).map(|_| AtomicU64::new(0)).collect(),
            _l: std::marker::PhantomData,
        }
    }
}

impl<L: Labels> Counter<L> {
    pub(crate) fn inc(&self, l: L) {
        self.add(l, 1);
    }
    pub fn add(&self, l: L, n: u64) {
        if let Some(v) = self.values.get(l.index()) {
            v.fetch_add(n, Ordering::Relaxed);
        }
    }
    pub fn get(&self, l: L) -> u64 {
        self.values
            .get(l.index())
            .map_or(0, |v| v.load(Ordering::Relaxed))
    }
}

impl<L: Labels> Family for Counter<L> {
    fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (i, v) in self.values.iter().enumerate() {
            out.push_str(name);
            L::render(i, None, out);
            let _ = writeln!(out, " {}", v.load(Ordering::Relaxed));
        }
    }
}

/// Upper bounds (seconds) of the latency histograms' buckets; `+Inf` follows. Fine under
/// 25 ms, where patterd's own share of a turn (`patterd_own`) and the media stages live, so
/// a p99 near a 10 ms budget reads as a number, not as "somewhere up to 25 ms".
pub(crate) const LATENCY_BUCKETS: [f64; 18] = [
    0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5,
    5.0, 10.0,
];

/// One histogram: a count per bucket (not cumulative; made cumulative when rendered), the sum
/// in microseconds and the count.
struct Series {
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl Default for Series {
    fn default() -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_us: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }
}

/// A latency histogram per label set ([`LATENCY_BUCKETS`]); observing is three relaxed atomic
/// adds.
pub struct Histogram<L: Labels> {
    series: Box<[Series]>,
    _l: std::marker::PhantomData<L>,
}

impl<L: Labels> Default for Histogram<L> {
    fn default() -> Self {
        Self {
            series: (0..L::count()).map(|_| Series::default()).collect(),
            _l: std::marker::PhantomData,
        }
    }
}

impl<L: Labels> Histogram<L> {
    pub fn observe(&self, l: L, d: Duration) {
        let Some(s) = self.series.get(l.index()) else {
            return;
        };
        let secs = d.as_secs_f64();
        let b = LATENCY_BUCKETS
            .iter()
            .position(|&le| secs <= le)
            .unwrap_or(LATENCY_BUCKETS.len());
        s.buckets[b].fetch_add(1, Ordering::Relaxed);
        s.sum_us.fetch_add(
            d.as_micros().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
        s.count.fetch_add(1, Ordering::Relaxed);
    }

    /// How many observations `l` has.
    pub fn count(&self, l: L) -> u64 {
        self.series
            .get(l.index())
            .map_or(0, |s| s.count.load(Ordering::Relaxed))
    }
}

impl<L: Labels> Family for Histogram<L> {
    fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (i, s) in self.series.iter().enumerate() {
            let mut cumulative = 0;
            for (b, n) in s.buckets.iter().enumerate() {
                cumulative += n.load(Ordering::Relaxed);
                let le = LATENCY_BUCKETS
                    .get(b)
                    .map_or_else(|| "+Inf".to_string(), |v| v.to_string());
                let _ = write!(out, "{name}_bucket");
                L::render(i, Some(("le", &le)), out);
                let _ = writeln!(out, " {cumulative}");
            }
            let _ = write!(out, "{name}_sum");
            L::render(i, None, out);
            let sum = s.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
            let _ = writeln!(out, " {sum}");
            let _ = write!(out, "{name}_count");
            L::render(i, None, out);
            // The count is the +Inf bucket read above, so the two always agree.
            let _ = writeln!(out, " {cumulative}");
        }
    }
}

// ------------------------------------------------------------------------------- registry

/// Declares [`Metrics`]: one line per metric — field, type, exposed name, help.
macro_rules! metrics {
    ($($(#[$m:meta])* $field:ident: $ty:ty = $name:literal, $help:literal;)+) => {
        /// Every metric the daemon counts (gauges of live state are read when rendering, in
        /// `server::metrics`).
        #[derive(Default)]
        pub struct Metrics {
            $($(#[$m])* pub $field: $ty,)+
        }

        impl Metrics {
            /// Appends every metric in the Prometheus text format.
            pub fn render(&self, out: &mut String) {
                $(Family::render(&self.$field, $name, $help, out);)+
            }

            /// Every exposed metric name (for documentation and tests).
            pub const NAMES: &'static [&'static str] = &[$($name),+];
        }
    };
}

metrics! {
    calls_accepted: AtomicU64 = "patterd_calls_accepted_total", "Calls answered.";
    calls_rejected_unknown_number: AtomicU64 =
        "patterd_calls_rejected_unknown_number_total", "Calls to a number not in [[numbers]].";
    calls_rejected_caller: AtomicU64 =
        "patterd_calls_rejected_caller_total", "Calls from a caller outside allowed_callers.";
    calls_rejected_busy: AtomicU64 =
        "patterd_calls_rejected_busy_total", "Calls refused at max_calls or while draining.";
    webhooks_forbidden: AtomicU64 =
        "patterd_webhooks_forbidden_total", "Webhooks with a bad or missing signature.";
    /// Webhooks for a call id already handled (replays), refused.
    webhooks_replayed: AtomicU64 =
        "patterd_webhooks_replayed_total", "Webhooks for a call id already handled (replayed), refused.";
    media_rejected: AtomicU64 = "patterd_media_rejected_total",
        "Media sockets refused (bad token, unknown call, too many sockets).";
    media_frames_bad: AtomicU64 = "patterd_media_frames_bad_total", "Malformed media frames received.";
    media_frames_paced: AtomicU64 = "patterd_media_frames_paced_total",
        "Caller audio frames dropped because the caller sent audio faster than real time.";
    media_floods: AtomicU64 = "patterd_media_floods_total",
        "Calls ended because their media socket kept sending audio faster than real time.";
    webhooks_refused: Counter<RefusalReason> = "patterd_webhooks_refused_total",
        "Carrier webhooks or calls refused before reaching a call, by reason.";
    calls_ended: Counter<(CarrierKind, Outcome)> = "patterd_calls_ended_total",
        "Calls ended, by carrier and outcome.";
    turns: Counter<CarrierKind> = "patterd_turns_total",
        "Caller turns sent to the brain, by carrier.";
    barge_ins: Counter<BargeIn> = "patterd_barge_ins_total",
        "Caller speech over the agent, by what became of it.";
    provider_errors: Counter<(Provider, ProviderErrorKind)> = "patterd_provider_errors_total",
        "Provider failures during calls, by provider and kind.";
    frames_dropped: Counter<FrameDrop> = "patterd_frames_dropped_total",
        "Frames dropped because the queue ahead was full, by direction.";
    stage_seconds: Histogram<Stage> = "patterd_stage_seconds",
        "Latency of each stage of a turn, in seconds.";
    stt_switches: Counter<(Provider, SttSwitchReason)> = "patterd_stt_switches_total",
        "Calls an STT chain moved to its next STT, by the kind of the STT left and why.";
    cluster_forwards: Counter<ForwardOutcome> = "patterd_cluster_forwards_total",
        "Requests on a call owned by another instance, by what became of them.";
    cluster_forward_seconds: Histogram<()> = "patterd_cluster_forward_seconds",
        "Time to forward a request to a call's owner and get its answer (or give up), in seconds.";
    cluster_handoffs: Counter<HandoffOutcome> = "patterd_cluster_handoffs_total",
        "New-call webhooks a draining or full instance tried to hand to a ready peer, by outcome.";
    webhook_deliveries: Counter<DeliveryOutcome> = "patterd_webhook_deliveries_total",
        "Webhook delivery attempts ([[webhooks]]), by outcome: delivered, retried, dead (dead-lettered).";
    otel_spans_exported: AtomicU64 = "patterd_otel_spans_exported_total",
        "Spans of calls' traces the collector took ([telemetry]).";
    otel_spans_dropped: Counter<SpanDrop> = "patterd_otel_spans_dropped_total",
        "Spans of calls' traces dropped before the collector took them, by reason.";
}

impl Metrics {
    pub(crate) fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_render_cumulative_buckets_sum_and_count() {
        let m = Metrics::default();
        m.stage_seconds
            .observe(Stage::BrainFirstToken, Duration::from_millis(3));
        m.stage_seconds
            .observe(Stage::BrainFirstToken, Duration::from_millis(120));
        m.stage_seconds
            .observe(Stage::BrainFirstToken, Duration::from_secs(60));
        let mut s = String::new();
        m.render(&mut s);
        let line = |l: &str| s.lines().any(|x| x == l);
        assert!(line(
            "patterd_stage_seconds_bucket{stage=\"brain_first_token\",le=\"0.0025\"} 0"
        ));
        assert!(line(
            "patterd_stage_seconds_bucket{stage=\"brain_first_token\",le=\"0.005\"} 1"
        ));
        assert!(line(
            "patterd_stage_seconds_bucket{stage=\"brain_first_token\",le=\"0.1\"} 1"
        ));
        assert!(line(
            "patterd_stage_seconds_bucket{stage=\"brain_first_token\",le=\"0.2\"} 2"
        ));
        assert!(line(
            "patterd_stage_seconds_bucket{stage=\"brain_first_token\",le=\"10\"} 2"
        ));
        assert!(line(
            "patterd_stage_seconds_bucket{stage=\"brain_first_token\",le=\"+Inf\"} 3"
        ));
        assert!(line(
            "patterd_stage_seconds_count{stage=\"brain_first_token\"} 3"
        ));
        assert!(line(
            "patterd_stage_seconds_sum{stage=\"brain_first_token\"} 60.123"
        ));
        assert!(line(
            "patterd_stage_seconds_count{stage=\"tts_first_audio\"} 0"
        ));
    }

    #[test]
    fn provider_labels_are_the_kind_names_once_each() {
        let labels: Vec<_> = Provider::all().iter().map(|p| p.as_label()).collect();
        assert_eq!(
            labels,
            [
                "deepgram",
                "deepgram_flux",
                "assemblyai",
                "openai_realtime",
                "whisper",
                "elevenlabs",
                "openai",
                "cartesia",
                "piper",
                "flite",
                "hermes",
                "openai_compatible",
                "openclaw"
            ]
        );
        let p = Provider::from(TtsKind::OpenaiCompatible);
        assert_eq!(p, Provider::from(SttKind::OpenaiCompatible));
        assert_eq!(p.as_label(), "openai_compatible");
        assert_eq!(Provider::from(SttKind::Assemblyai).as_label(), "assemblyai");
    }

    #[test]
    fn pairs_of_labels_index_and_render_every_combination() {
        let m = Metrics::default();
        for &c in CarrierKind::ALL {
            for &o in Outcome::all() {
                m.calls_ended.inc((c, o));
            }
        }
        m.calls_ended
            .inc((CarrierKind::ALL[0], Outcome::CallerHungUp));
        let mut s = String::new();
        m.render(&mut s);
        let rows = s
            .lines()
            .filter(|l| l.starts_with("patterd_calls_ended_total{"))
            .count();
        assert_eq!(rows, CarrierKind::ALL.len() * Outcome::all().len());
        let first = format!(
            "patterd_calls_ended_total{{carrier=\"{}\",outcome=\"caller_hung_up\"}} 2",
            CarrierKind::ALL[0].as_str()
        );
        assert!(s.lines().any(|l| l == first), "{s}");
        assert_eq!(
            m.calls_ended
                .get((CarrierKind::ALL[0], Outcome::CallerHungUp)),
            2
        );
    }
}
