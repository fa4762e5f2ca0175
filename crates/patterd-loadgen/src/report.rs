//! The load generator's results: one [`RunReport`] per run (serialised as JSON) and the
//! markdown table that puts runs (several N, several servers) side by side.

use serde::{Deserialize, Serialize};

/// Percentiles of a sample, in milliseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Quantiles {
    pub n: usize,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Quantiles {
    pub fn of(mut v: Vec<f64>) -> Self {
        if v.is_empty() {
            return Self::default();
        }
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1];
        Self {
            n: v.len(),
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: v[v.len() - 1],
        }
    }
}

/// The server process, from `/proc`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ServerStats {
    /// Spawn → first `/healthz` 200.
    pub cold_start_ms: f64,
    pub idle_rss_mib: f64,
    /// Mean RSS while every call was up.
    pub steady_rss_mib: f64,
    /// Highest RSS seen (sampled, and `VmHWM`).
    pub peak_rss_mib: f64,
    /// Two seconds after the last call ended.
    pub after_rss_mib: f64,
    /// (steady − idle) / calls.
    pub rss_per_call_kib: f64,
    /// CPU seconds from the first call to the last one ending.
    pub cpu_s_total: f64,
    pub steady_window_s: f64,
    /// Percent of one core over the steady window.
    pub cpu_pct_steady: f64,
    pub cpu_pct_per_call: f64,
    pub healthy_after: bool,
}

/// What the fakes were asked for.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProviderCounts {
    pub stt_sessions: usize,
    /// The first refused STT handshakes (status, reason).
    pub stt_rejected: Vec<String>,
    pub llm_requests: usize,
    pub tts_requests: usize,
}

/// patterd's own share of a turn (its `patterd_own` stage: the caller's turn end → the
/// reply's first frame, less the brain's first token and the first synthesis after it), as
/// its `/metrics` histogram has it: turns counted, and the upper bounds of the buckets the
/// median and the 99th percentile fall in (ms; `None`: beyond the last bucket).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct OwnShare {
    pub turns: u64,
    pub p50_le_ms: Option<f64>,
    pub p99_le_ms: Option<f64>,
    /// Share of turns at most 10 ms (percent).
    pub within_10ms_pct: f64,
}

impl OwnShare {
    /// From a Prometheus text exposition (`patterd_stage_seconds_bucket{stage="patterd_own",…}`).
    pub fn from_metrics(text: &str) -> Self {
        let prefix = "patterd_stage_seconds_bucket{stage=\"patterd_own\",le=\"";
        let mut buckets: Vec<(f64, u64)> = text
            .lines()
            .filter_map(|l| l.strip_prefix(prefix))
            .filter_map(|rest| {
                let (le, count) = rest.split_once("\"} ")?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse::<f64>().ok()? * 1000.0
                };
                Some((le, count.trim().parse().ok()?))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let turns = buckets.last().map_or(0, |b| b.1);
        if turns == 0 {
            return Self::default();
        }
        let at = |q: f64| {
            buckets
                .iter()
                .find(|(_, n)| *n as f64 >= q * turns as f64)
                .map(|(le, _)| *le)
                .filter(|le| le.is_finite())
        };
        let within_10 = buckets
            .iter()
            .filter(|(le, _)| *le <= 10.0)
            .map(|(_, n)| *n)
            .max()
            .unwrap_or(0);
        Self {
            turns,
            p50_le_ms: at(0.5),
            p99_le_ms: at(0.99),
            within_10ms_pct: 100.0 * within_10 as f64 / turns as f64,
        }
    }
}

/// One run at one N.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunReport {
    pub label: String,
    pub calls: usize,
    pub rate: f64,
    pub hold_s: f64,
    pub completed_calls: usize,
    pub failed_calls: usize,
    /// The commonest errors (message, count).
    pub errors: Vec<(String, usize)>,
    pub turns: usize,
    pub turns_answered: usize,
    pub turns_missing: usize,
    /// Answered turns without a matching `speech_final` from the fake.
    pub turns_unmatched: usize,
    pub barge_ins: usize,
    /// End of the caller's speech → first reply frame.
    pub e2e_ms: Quantiles,
    /// The fake's `speech_final` sent → first reply frame: the latency the server adds.
    pub added_ms: Quantiles,
    /// patterd's own share of each turn, from its `/metrics` at the end of the run.
    #[serde(default)]
    pub patterd_own: OwnShare,
    /// Media `start` → first greeting frame.
    pub greeting_ms: Quantiles,
    /// Caller speech the STT actually received per end of turn (of the clip's `--speech-ms`).
    #[serde(default)]
    pub stt_heard_ms: Quantiles,
    /// End of barge-in speech → `clear` (only when agent audio was still queued then).
    pub barge_in_clear_ms: Quantiles,
    /// Onset of barge-in speech (its first frame sent) → the first `clear` after it.
    #[serde(default)]
    pub barge_in_onset_clear_ms: Quantiles,
    /// Media frames the callers sent.
    #[serde(default)]
    pub frames_sent: u64,
    pub frames_received: u64,
    /// Agent messages that broke Twilio's protocol (ignored by the callers).
    #[serde(default)]
    pub malformed_messages: u64,
    /// Gaps over 40 ms between frames of one agent utterance.
    pub late_gaps: u64,
    /// Of those, the ones within an utterance's first 10 frames (after its first chunk).
    #[serde(default)]
    pub late_gaps_early: u64,
    pub max_gap_ms: f64,
    /// Modelled playback queue ran dry inside an utterance.
    pub underruns: u64,
    /// Simulator ticks more than 20 ms late (the load generator itself was overloaded).
    pub loadgen_lag_ticks: u64,
    pub loadgen_max_lag_ms: f64,
    pub loadgen_cpu_s: f64,
    pub loadgen_cpu_pct_steady: f64,
    /// The fakes' share of `loadgen_cpu_s` (their runtime's threads).
    #[serde(default)]
    pub loadgen_fakes_cpu_s: f64,
    /// The callers' and the fakes' shares of `loadgen_cpu_pct_steady`.
    #[serde(default)]
    pub loadgen_callers_cpu_pct_steady: f64,
    #[serde(default)]
    pub loadgen_fakes_cpu_pct_steady: f64,
    /// Caller shards (tasks) that drove the calls.
    #[serde(default)]
    pub loadgen_shards: usize,
    /// The machine's 1-minute load average when the run started (2 cores: above ~2 means
    /// other work was competing and the figures are noisy).
    pub loadavg_start: f64,
    pub server: ServerStats,
    pub provider_requests: ProviderCounts,
    /// The floods sent while the calls talked (`--flood-*`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flood: Option<FloodReport>,
}

/// The live calls before and during the floods, and every flood request's outcome.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FloodReport {
    /// Seconds after the last call started at which the floods began.
    pub started_after_ramp_s: f64,
    /// Floods started → the last flood connection finished (or the calls stopped, if first).
    pub duration_s: f64,
    /// Length of the window before the floods over which the "before" figures are taken.
    pub before_window_s: f64,
    pub late_gaps_before: u64,
    pub late_gaps_during: u64,
    /// Added latency (`speech_final` → first reply frame) of turns ending before / during.
    pub added_before_ms: Quantiles,
    pub added_during_ms: Quantiles,
    pub turns_missing_during: usize,
    pub peak_rss_before_mib: f64,
    pub peak_rss_during_mib: f64,
    pub floods: Vec<crate::flood::FloodStats>,
}

/// The flood figures as markdown: the live calls before / during, then each flood.
pub fn flood_markdown(f: &FloodReport) -> String {
    let q = |q: &Quantiles| format!("{:.2} / {:.2} / {:.1} (n={})", q.p50, q.p99, q.max, q.n);
    let mut s = format!(
        "| live calls | before ({:.1} s) | during ({:.1} s) |\n|---|---:|---:|\n\
         | late gaps > 40 ms | {} | {} |\n\
         | added p50 / p99 / max ms | {} | {} |\n\
         | peak RSS MiB | {:.1} | {:.1} |\n\
         | turns unanswered | – | {} |\n\n",
        f.before_window_s,
        f.duration_s,
        f.late_gaps_before,
        f.late_gaps_during,
        q(&f.added_before_ms),
        q(&f.added_during_ms),
        f.peak_rss_before_mib,
        f.peak_rss_during_mib,
        f.turns_missing_during,
    );
    s.push_str(&crate::flood::markdown(&f.floods));
    s
}

/// A markdown table, one row per run.
pub fn markdown(runs: &[RunReport]) -> String {
    let mut s = String::from(
        "| server | calls | ok / failed | turns answered | CPU % core (all) | CPU % core / call | idle RSS MiB | RSS MiB (all up) | RSS KiB / call | cold start ms | speech end → reply p50 / p99 ms | added p50 / p99 / max ms | patterd's own p50 / p99 ms (bucket ≤) / ≤ 10 ms | speech heard by STT p50 ms | late gaps > 40 ms | underruns | malformed | loadgen CPU % (callers + fakes) / lagged ticks | loadgen ÷ server CPU | load avg |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in runs {
        let v = &r.server;
        s.push_str(&format!(
            "| {} | {} | {} / {} | {} / {} | {:.1} | {:.3} | {:.1} | {:.1} | {:.0} | {:.1} | {:.0} / {:.0} | {:.2} / {:.2} / {:.1} | {} | {:.0} | {} | {} | {} | {:.0} ({:.0} + {:.0}) / {} | {:.2} | {:.1} |\n",
            r.label,
            r.calls,
            r.completed_calls,
            r.failed_calls,
            r.turns_answered,
            r.turns,
            v.cpu_pct_steady,
            v.cpu_pct_per_call,
            v.idle_rss_mib,
            v.steady_rss_mib,
            v.rss_per_call_kib,
            v.cold_start_ms,
            r.e2e_ms.p50,
            r.e2e_ms.p99,
            r.added_ms.p50,
            r.added_ms.p99,
            r.added_ms.max,
            own_cell(&r.patterd_own),
            r.stt_heard_ms.p50,
            r.late_gaps,
            r.underruns,
            r.malformed_messages,
            r.loadgen_cpu_pct_steady,
            r.loadgen_callers_cpu_pct_steady,
            r.loadgen_fakes_cpu_pct_steady,
            r.loadgen_lag_ticks,
            r.loadgen_cpu_pct_steady / v.cpu_pct_steady.max(0.01),
            r.loadavg_start,
        ));
    }
    s
}

fn own_cell(o: &OwnShare) -> String {
    if o.turns == 0 {
        return "–".into();
    }
    let le = |v: Option<f64>| v.map_or("> 10 s".to_string(), |v| format!("{v:.0}"));
    format!(
        "{} / {} / {:.1} %",
        le(o.p50_le_ms),
        le(o.p99_le_ms),
        o.within_10ms_pct
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_share_from_the_histogram() {
        let text = "patterd_stage_seconds_bucket{stage=\"brain_first_token\",le=\"0.005\"} 9\n\
            patterd_stage_seconds_bucket{stage=\"patterd_own\",le=\"0.005\"} 90\n\
            patterd_stage_seconds_bucket{stage=\"patterd_own\",le=\"0.01\"} 98\n\
            patterd_stage_seconds_bucket{stage=\"patterd_own\",le=\"0.025\"} 100\n\
            patterd_stage_seconds_bucket{stage=\"patterd_own\",le=\"+Inf\"} 100\n";
        let o = OwnShare::from_metrics(text);
        assert_eq!(o.turns, 100);
        assert_eq!(o.p50_le_ms, Some(5.0));
        assert_eq!(o.p99_le_ms, Some(25.0));
        assert!((o.within_10ms_pct - 98.0).abs() < 1e-9);
        assert_eq!(OwnShare::from_metrics(""), OwnShare::default());
    }

    #[test]
    fn quantiles() {
        let q = Quantiles::of((1..=100).map(f64::from).collect());
        assert_eq!(
            (q.n, q.p50, q.p90, q.p99, q.max),
            (100, 50.0, 90.0, 99.0, 100.0)
        );
        assert_eq!(Quantiles::of(vec![]).n, 0);
        assert_eq!(Quantiles::of(vec![3.0]).p99, 3.0);
    }
}
